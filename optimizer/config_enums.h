// The config's closed sets (precision mode, preset, calibration and int4 methods, int4 storage) are proto
// enums whose value names are the JSON names. This file lists those names for messages and CLI choices,
// finds an unknown name in a JSON config before protobuf's parser does (so the error names the field and
// the choices), and reads configs sent by clients built while these fields were strings.
#ifndef ONNXOPT_OPTIMIZER_CONFIG_ENUMS_H_
#define ONNXOPT_OPTIMIZER_CONFIG_ENUMS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "onnxopt/v1/config.pb.h"

namespace onnxopt {

// The value names of `type` in declaration order: {"fp32", "fp16", ...}.
std::vector<std::string> EnumNames(const google::protobuf::EnumDescriptor* type);

// INVALID_ARGUMENT "unknown <what> '<name>' (known: ...)" unless `value` is one of `type`'s values (a
// binary request can carry any number in an open enum).
absl::Status CheckEnumValue(const google::protobuf::EnumDescriptor* type, int value, absl::string_view what);

// INVALID_ARGUMENT "unknown precision.mode 'fp8' (known: fp32, fp16, ...)" for the first string in
// `json` (a JSON object for `type`) that sits where an enum's name belongs and is none of its names;
// OK otherwise, malformed JSON included (the parser that follows reports it).
absl::Status CheckEnumNamesInJson(absl::string_view json, const google::protobuf::Descriptor* type);

// A config from a client built while preset, precision.mode, precision.calibration.method and
// precision.int4's method, lm_head and embeddings were strings carries each as an unknown field under its
// old number; this sets the enum field from it (INVALID_ARGUMENT for a name the enum lacks) and drops it.
// The server applies it to every request and every stored record, so such clients keep working.
absl::Status UpgradeLegacyConfig(v1::OptimizationConfig& config);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_CONFIG_ENUMS_H_
