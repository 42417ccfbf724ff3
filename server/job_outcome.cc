#include "server/job_outcome.h"

#include "optimizer/failure.h"
#include "server/job_store.h"

namespace onnxopt::server {

void SetOutcome(v1::Job& job, const absl::Status& status, const v1::JobResult* result) {
  *job.mutable_end_time() = TimestampNow();
  if (status.ok()) {
    job.set_state(v1::SUCCEEDED);
    *job.mutable_result() = *result;
    return;
  }
  job.set_state(status.code() == absl::StatusCode::kCancelled ? v1::CANCELLED : v1::FAILED);
  v1::JobError* error = job.mutable_error();
  error->set_code(static_cast<int>(status.code()));
  error->set_reason(ReasonOf(status));
  error->set_message(std::string(TextOf(status)));
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
