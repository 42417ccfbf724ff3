// How a job ends in its record: the state, and for a failure the reason and message its status carries.
#ifndef ONNXOPT_SERVER_JOB_OUTCOME_H_
#define ONNXOPT_SERVER_JOB_OUTCOME_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "onnxopt/v1/service.pb.h"

namespace onnxopt::server {

// Ends `job`: SUCCEEDED with `result` when `status` is OK, else CANCELLED or FAILED with the reason the
// status carries (ReasonOf: its own, else its code's) and the text after it.
void SetOutcome(v1::Job& job, const absl::Status& status, const v1::JobResult* result);

// "succeeded", "cancelled", "failed" (the metrics' and logs' word for a terminal state), else "requeued".
const char* OutcomeName(v1::JobState state);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_OUTCOME_H_
