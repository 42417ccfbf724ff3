#include "optimizer/failure.h"

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace onnxopt {
namespace {

constexpr char kReasonPayload[] = "type.googleapis.com/onnxopt.v1.ErrorReason";

}  // namespace

absl::Status WithReason(absl::Status status, Reason reason) {
  if (status.ok()) return status;
  v1::ErrorReason payload;
  payload.set_reason(reason);
  status.SetPayload(kReasonPayload, absl::Cord(payload.SerializeAsString()));
  return status;
}

absl::Status Failure(absl::StatusCode code, Reason reason, absl::string_view text) {
  return WithReason(absl::Status(code, absl::StrCat(ReasonName(reason), ": ", text)), reason);
}

Reason ReasonOf(const absl::Status& status) {
  if (status.ok()) return v1::ErrorReason::REASON_UNSPECIFIED;
  if (const auto payload = status.GetPayload(kReasonPayload)) {
    v1::ErrorReason parsed;
    if (parsed.ParseFromString(std::string(*payload)) && parsed.reason() != v1::ErrorReason::REASON_UNSPECIFIED) {
      return parsed.reason();
    }
  }
  // The reasons 1-16 are google.rpc.Code's numbers, which absl::StatusCode shares.
  const int code = static_cast<int>(status.code());
  return v1::ErrorReason::Reason_IsValid(code) ? static_cast<Reason>(code) : v1::ErrorReason::UNKNOWN;
}

std::string ReasonName(Reason reason) { return v1::ErrorReason::Reason_Name(reason); }

absl::string_view TextOf(const absl::Status& status) {
  absl::string_view message = status.message();
  if (!status.GetPayload(kReasonPayload)) return message;
  absl::ConsumePrefix(&message, absl::StrCat(ReasonName(ReasonOf(status)), ": "));
  return message;
}

}  // namespace onnxopt
