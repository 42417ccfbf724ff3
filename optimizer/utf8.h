// Text that came from a model (op types, names, error messages that quote them) may be any bytes, but
// proto3 `string` fields, JSON and log lines must be valid UTF-8: one invalid byte in a job's error
// makes the job unreadable by every client and by the job store after a restart. These helpers escape
// such bytes as \xNN before the text enters a message.
#ifndef ONNXOPT_OPTIMIZER_UTF8_H_
#define ONNXOPT_OPTIMIZER_UTF8_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace onnxopt {

bool IsValidUtf8(absl::string_view text);
// `text` with every byte that is not part of a well-formed UTF-8 sequence written as "\xNN".
std::string ValidUtf8(absl::string_view text);
// Applies ValidUtf8 to every `string` field of `message`, nested messages and map keys and values
// included (`bytes` fields are left alone). Returns the number of fields changed.
int MakeStringsValidUtf8(google::protobuf::Message* message);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_UTF8_H_
