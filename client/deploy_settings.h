// The session settings a deployment inherits from a job's benchmark, for every layout that writes
// them (Triton's config.pbtxt, GenAI's genai_config.json): the session tuning's best when it tuned,
// else what the benchmark itself ran with.
#ifndef ONNXOPT_CLIENT_DEPLOY_SETTINGS_H_
#define ONNXOPT_CLIENT_DEPLOY_SETTINGS_H_

#include <string>
#include <utility>
#include <vector>

#include "onnxopt/v1/report.pb.h"

namespace onnxopt::client {

struct DeploySettings {
  bool gpu = false;               // the benchmark ran on the CUDA execution provider
  bool measured = false;          // the benchmark ran (threads and mode below mean something)
  int intra_op_threads = 0;
  std::string execution_mode;     // "sequential" or "parallel"
  std::string optimization_level; // ONNX Runtime's: "all", "extended", "basic", "disabled"
  std::vector<std::pair<std::string, std::string>> cuda_options;  // deploy_settings' "cuda.*", sorted, prefix off
};

DeploySettings DeploySettingsOf(const v1::BenchmarkReport& benchmark);

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_DEPLOY_SETTINGS_H_
