#include "optimizer/ort_runtime.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <atomic>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace onnxopt {

std::string OrtVersion() { return Ort::GetVersionString(); }

std::vector<std::string> OrtAvailableProviders() {
  try {
    return Ort::GetAvailableProviders();
  } catch (const Ort::Exception& e) {
    return {};
  }
}

namespace {
std::atomic<int> logging_level{ORT_LOGGING_LEVEL_ERROR};
}  // namespace

void SetOrtLoggingLevel(OrtLoggingLevel level) { logging_level.store(level); }

namespace {

// ONNX Runtime's telemetry layer writes mat-debug-<pid>.log and .ses into TMPDIR when an environment
// is created, and never removes them: one pair per process, piling up in /tmp. The environment is
// created with TMPDIR pointing at a private folder, which is removed when the process exits.
std::string& PrivateTempDir() {
  static std::string* const dir = new std::string();
  return *dir;
}

void RemovePrivateTempDir() {
  std::error_code ignored;
  if (!PrivateTempDir().empty()) std::filesystem::remove_all(PrivateTempDir(), ignored);
}

Ort::Env* CreateEnvironment() {
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string previous = tmpdir == nullptr ? "" : tmpdir;
  std::string pattern = (previous.empty() ? std::string("/tmp") : previous) + "/onnxopt-ort-XXXXXX";
  if (::mkdtemp(pattern.data()) != nullptr) {
    PrivateTempDir() = pattern;
    std::atexit(RemovePrivateTempDir);
    ::setenv("TMPDIR", pattern.c_str(), 1);
  }
  auto* env = new Ort::Env(static_cast<OrtLoggingLevel>(logging_level.load()), "onnxopt");
  if (tmpdir == nullptr) {
    ::unsetenv("TMPDIR");
  } else {
    ::setenv("TMPDIR", previous.c_str(), 1);
  }
  return env;
}

}  // namespace

Ort::Env& OrtEnvironment() {
  static Ort::Env* const env = CreateEnvironment();
  return *env;
}

std::string CpuDescription() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return absl::StrCat("CPU (", absl::StripAsciiWhitespace(line.substr(colon + 1)), ")");
    }
  }
  return "CPU";
}

absl::StatusOr<std::string> ProviderFor(v1::Device device) {
  if (device != v1::DEVICE_CUDA) return std::string("CPUExecutionProvider");
  const std::vector<std::string> providers = OrtAvailableProviders();
  if (std::find(providers.begin(), providers.end(), "CUDAExecutionProvider") == providers.end()) {
    return absl::FailedPreconditionError(
        "CUDA_UNAVAILABLE: the job asks for CUDA but this server's ONNX Runtime has no CUDA execution provider "
        "(available: CPU only); set benchmark.device to DEVICE_CPU or run the job on a GPU server");
  }
  return std::string("CUDAExecutionProvider");
}

absl::StatusOr<std::unique_ptr<Ort::Session>> CreateSession(const ModelSource& model, const SessionSettings& settings) {
  absl::StatusOr<std::string> provider = ProviderFor(settings.device);
  if (!provider.ok()) return provider.status();
  try {
    Ort::SessionOptions options;
    options.SetGraphOptimizationLevel(settings.optimization_level);
    if (settings.intra_op_threads > 0) options.SetIntraOpNumThreads(settings.intra_op_threads);
    options.SetExecutionMode(settings.parallel_execution ? ORT_PARALLEL : ORT_SEQUENTIAL);
    if (!settings.allow_spinning) {
      options.AddConfigEntry("session.intra_op.allow_spinning", "0");
      options.AddConfigEntry("session.inter_op.allow_spinning", "0");
    }
    if (*provider == "CUDAExecutionProvider") {
      OrtCUDAProviderOptionsV2* cuda_options = nullptr;
      Ort::ThrowOnError(Ort::GetApi().CreateCUDAProviderOptions(&cuda_options));
      std::unique_ptr<OrtCUDAProviderOptionsV2, decltype(Ort::GetApi().ReleaseCUDAProviderOptions)> owned(
          cuda_options, Ort::GetApi().ReleaseCUDAProviderOptions);
      options.AppendExecutionProvider_CUDA_V2(*cuda_options);
    }
    if (!model.path.empty()) {
      return std::make_unique<Ort::Session>(OrtEnvironment(), model.path.c_str(), options);
    }
    return std::make_unique<Ort::Session>(OrtEnvironment(), model.bytes.data(), model.bytes.size(), options);
  } catch (const Ort::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("ORT_SESSION_FAILED: ONNX Runtime cannot load the model: ", e.what()));
  }
}

}  // namespace onnxopt
