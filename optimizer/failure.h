// Errors with a stable reason (proto/onnxopt/v1/errors.proto). The message reads "REASON: text" for
// people and logs; the reason travels beside it as a Status payload, so code reads it with ReasonOf and
// never parses the text.
#ifndef ONNXOPT_OPTIMIZER_FAILURE_H_
#define ONNXOPT_OPTIMIZER_FAILURE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "onnxopt/v1/errors.pb.h"

namespace onnxopt {

using Reason = v1::ErrorReason::Reason;

// A `code` status whose message is "REASON: text", carrying `reason`.
absl::Status Failure(absl::StatusCode code, Reason reason, absl::string_view text);

// The reason `status` carries; one made without a reason (a library's error) is named after its code
// (INTERNAL, INVALID_ARGUMENT, ...), OK after nothing (REASON_UNSPECIFIED).
Reason ReasonOf(const absl::Status& status);

// "MODEL_PARSE_FAILED".
std::string ReasonName(Reason reason);

// The message without the "REASON: " that Failure put before it.
absl::string_view TextOf(const absl::Status& status);

// `status` (its code and message as they are) carrying `reason`: for a status rebuilt from a line or a
// record that named its reason.
absl::Status WithReason(absl::Status status, Reason reason);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_FAILURE_H_
