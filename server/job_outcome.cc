#include "server/job_outcome.h"

#include "absl/strings/ascii.h"
#include "server/job_store.h"

namespace onnxopt::server {

std::pair<std::string, std::string> SplitReason(const absl::Status& status) {
  absl::string_view message = status.message();
  const size_t colon = message.find(": ");
  if (colon != absl::string_view::npos && colon > 0) {
    absl::string_view head = message.substr(0, colon);
    bool is_reason = true;
    for (char c : head) is_reason &= absl::ascii_isupper(c) || c == '_' || absl::ascii_isdigit(c);
    if (is_reason) return {std::string(head), std::string(message.substr(colon + 2))};
  }
  return {absl::StatusCodeToString(status.code()), std::string(message)};
}

void SetOutcome(v1::Job& job, const absl::Status& status, const v1::JobResult* result) {
  *job.mutable_end_time() = TimestampNow();
  if (status.ok()) {
    job.set_state(v1::SUCCEEDED);
    *job.mutable_result() = *result;
    return;
  }
  const auto [reason, message] = SplitReason(status);
  job.set_state(status.code() == absl::StatusCode::kCancelled ? v1::CANCELLED : v1::FAILED);
  v1::JobError* error = job.mutable_error();
  error->set_code(static_cast<int>(status.code()));
  error->set_reason(reason);
  error->set_message(message);
}

const char* OutcomeName(v1::JobState state) {
  switch (state) {
    case v1::SUCCEEDED: return "succeeded";
    case v1::CANCELLED: return "cancelled";
    case v1::FAILED: return "failed";
    default: return "requeued";
  }
}

}  // namespace onnxopt::server
