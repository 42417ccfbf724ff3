#include "client/deploy_settings.h"

#include <algorithm>

#include "absl/strings/match.h"

namespace onnxopt::client {

DeploySettings DeploySettingsOf(const v1::BenchmarkReport& benchmark) {
  DeploySettings settings;
  settings.gpu = absl::StrContains(benchmark.execution_provider(), "CUDA");
  settings.measured = !benchmark.skipped();
  const bool tuned = benchmark.has_tuning() && benchmark.tuning().best().p50_ms() > 0;
  const v1::TuningTrial& best = benchmark.tuning().best();
  settings.intra_op_threads = tuned ? best.intra_op_threads() : benchmark.intra_op_threads();
  settings.execution_mode = tuned ? best.execution_mode() : benchmark.execution_mode();
  settings.optimization_level = tuned ? best.optimization_level() : benchmark.ort_optimization_level();
  for (const auto& [key, value] : benchmark.deploy_settings()) {
    if (absl::StartsWith(key, "cuda.")) settings.cuda_options.push_back({key.substr(5), value});
  }
  std::sort(settings.cuda_options.begin(), settings.cuda_options.end());
  return settings;
}

}  // namespace onnxopt::client
