// Job labels: who asked for a job and why (team, pipeline run, model version), set on CreateJob and
// matched by ListJobs. Kubernetes' rules, a little wider: keys name things, values are free text.
#ifndef ONNXOPT_SERVER_JOB_LABELS_H_
#define ONNXOPT_SERVER_JOB_LABELS_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/map.h"
#include "onnxopt/v1/service.pb.h"

namespace onnxopt::server {

inline constexpr int kMaxLabels = 32;
inline constexpr size_t kMaxLabelKeyLength = 63;
inline constexpr size_t kMaxLabelValueLength = 256;

using Labels = google::protobuf::Map<std::string, std::string>;

// INVALID_ARGUMENT (BAD_LABEL) naming the first label that breaks the rules: at most kMaxLabels; keys
// 1-63 characters of a-z 0-9 - _ . / starting with a letter or digit; values valid UTF-8 of at most
// 256 bytes. `what` names the field in the message ("labels", "label filter").
absl::Status ValidateLabels(const Labels& labels, const std::string& what);

// Whether `job` carries every label of `selector` with the same value (an empty selector: any job).
bool HasLabels(const v1::Job& job, const Labels& selector);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_LABELS_H_
