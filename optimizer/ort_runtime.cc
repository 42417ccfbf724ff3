#include "optimizer/ort_runtime.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "optimizer/failure.h"

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

// ONNX Runtime 1.29 reports to Microsoft by default on Linux too: creating an environment writes a
// device id and an event store under ~/.cache/Microsoft/DeveloperTools, starts an uploader thread that
// resolves its endpoint, and fsyncs the store at exit. Models uploaded here are the tenants' own, so
// the service turns it off (ORT_DISABLE_TELEMETRY=1, read when the environment is made, and
// DisableTelemetryEvents for the events after that) unless the operator set ORT_DISABLE_TELEMETRY=0.
// With telemetry on, its layer writes mat-debug-<pid>.log and .ses into TMPDIR and never removes
// them: the environment is created with TMPDIR pointing at a private folder, removed at exit.
std::string& PrivateTempDir() {
  static std::string* const dir = new std::string();
  return *dir;
}

void RemovePrivateTempDir() {
  std::error_code ignored;
  if (!PrivateTempDir().empty()) std::filesystem::remove_all(PrivateTempDir(), ignored);
}

Ort::Env* CreateEnvironment() {
  const char* telemetry = std::getenv("ORT_DISABLE_TELEMETRY");
  const bool telemetry_opted_in = telemetry != nullptr && std::string_view(telemetry) == "0";
  if (!telemetry_opted_in) ::setenv("ORT_DISABLE_TELEMETRY", "1", 1);
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string previous = tmpdir == nullptr ? "" : tmpdir;
  std::string pattern = (previous.empty() ? std::string("/tmp") : previous) + "/onnxopt-ort-XXXXXX";
  if (::mkdtemp(pattern.data()) != nullptr) {
    PrivateTempDir() = pattern;
    std::atexit(RemovePrivateTempDir);
    ::setenv("TMPDIR", pattern.c_str(), 1);
  }
  auto* env = new Ort::Env(static_cast<OrtLoggingLevel>(logging_level.load()), "onnxopt");
  if (!telemetry_opted_in) env->DisableTelemetryEvents();
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

namespace {

// ONNX Runtime says only "Failed to load shared library": name it. The provider library sits next to
// libonnxruntime.so.1; if it is there, loading it ourselves makes the loader name what it lacks
// (libcudart.so.13, libcublasLt.so.13, cuDNN...).
std::string ExplainCudaLoadFailure(const std::string& ort_message) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&OrtGetApiBase), &info) == 0 || info.dli_fname == nullptr) return ort_message;
  const std::filesystem::path folder = std::filesystem::path(info.dli_fname).parent_path();
  const std::filesystem::path provider = folder / "libonnxruntime_providers_cuda.so";
  std::error_code error;
  if (!std::filesystem::exists(provider, error)) {
    return absl::StrCat(ort_message, ": ", provider.string(),
                        " is not installed (scripts/setup.sh --gpu fetches the CUDA provider)");
  }
  void* handle = dlopen(provider.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::StrCat(ort_message, ": ", why != nullptr ? why : provider.string());
  }
  dlclose(handle);
  return ort_message;
}

// Adds the CUDA execution provider to `options`, with TF32 and CUDA graphs as `settings` ask; throws
// Ort::Exception where it cannot load.
void AppendCuda(Ort::SessionOptions& options, const SessionSettings& settings) {
  OrtCUDAProviderOptionsV2* cuda_options = nullptr;
  Ort::ThrowOnError(Ort::GetApi().CreateCUDAProviderOptions(&cuda_options));
  std::unique_ptr<OrtCUDAProviderOptionsV2, decltype(Ort::GetApi().ReleaseCUDAProviderOptions)> owned(
      cuda_options, Ort::GetApi().ReleaseCUDAProviderOptions);
  const char* keys[] = {"use_tf32", "enable_cuda_graph"};
  const char* values[] = {settings.cuda_tf32 ? "1" : "0", settings.cuda_graph ? "1" : "0"};
  Ort::ThrowOnError(Ort::GetApi().UpdateCUDAProviderOptions(cuda_options, keys, values, 2));
  options.AppendExecutionProvider_CUDA_V2(*cuda_options);
}

// Appending the CUDA provider to session options loads its library (and through it CUDA's), so a
// machine without them fails here.
ProviderStatus ProbeCuda() {
  ProviderStatus status{"CUDAExecutionProvider", false, ""};
  try {
    Ort::SessionOptions options;
    AppendCuda(options, SessionSettings());
    status.usable = true;
  } catch (const std::exception& e) {
    status.reason = ExplainCudaLoadFailure(e.what());
  }
  return status;
}

}  // namespace

const std::vector<ProviderStatus>& ProviderStatuses() {
  static const std::vector<ProviderStatus>* const statuses = [] {
    // Providers log through the environment's logger; a provider that cannot load is an expected
    // answer here (reported as the reason), not an error line in the server's log.
    OrtEnvironment().UpdateEnvWithCustomLogLevel(ORT_LOGGING_LEVEL_FATAL);
    auto* probed = new std::vector<ProviderStatus>();
    for (const std::string& name : OrtAvailableProviders()) {
      if (name == "CUDAExecutionProvider") {
        probed->push_back(ProbeCuda());
      } else if (name == "CPUExecutionProvider") {
        probed->push_back({name, true, ""});
      } else {  // TensorRT and the like: in the build, not used by onnxopt
        probed->push_back({name, false, "not used by onnxopt"});
      }
    }
    if (std::none_of(probed->begin(), probed->end(),
                     [](const ProviderStatus& p) { return p.name == "CUDAExecutionProvider"; })) {
      probed->push_back({"CUDAExecutionProvider", false, "this ONNX Runtime build has no CUDA execution provider"});
    }
    OrtEnvironment().UpdateEnvWithCustomLogLevel(static_cast<OrtLoggingLevel>(logging_level.load()));
    return probed;
  }();
  return *statuses;
}

absl::StatusOr<std::string> ProviderFor(v1::Device device) {
  if (device != v1::DEVICE_CUDA) return std::string("CPUExecutionProvider");
  for (const ProviderStatus& provider : ProviderStatuses()) {
    if (provider.name != "CUDAExecutionProvider") continue;
    if (provider.usable) return provider.name;
    return Failure(
        absl::StatusCode::kFailedPrecondition, v1::ErrorReason::CUDA_UNAVAILABLE,
        absl::StrCat(
            "the job asks for CUDA but it cannot run on this server: ", provider.reason,
            "; set benchmark.device to DEVICE_CPU (or benchmark.allow_cpu_fallback) or run the job on a GPU server"));
  }
  return absl::InternalError("no CUDA provider status");  // ProviderStatuses always lists CUDA
}

GraphOptimizationLevel OrtLevel(v1::OrtOptimizationLevel level, GraphOptimizationLevel fallback) {
  switch (level) {
    case v1::ORT_LEVEL_DISABLED: return ORT_DISABLE_ALL;
    case v1::ORT_LEVEL_BASIC: return ORT_ENABLE_BASIC;
    case v1::ORT_LEVEL_EXTENDED: return ORT_ENABLE_EXTENDED;
    case v1::ORT_LEVEL_ALL: return ORT_ENABLE_ALL;
    default: return fallback;
  }
}

std::string OrtLevelName(GraphOptimizationLevel level) {
  switch (level) {
    case ORT_DISABLE_ALL: return "disabled";
    case ORT_ENABLE_BASIC: return "basic";
    case ORT_ENABLE_EXTENDED: return "extended";
    default: return "all";
  }
}

std::string DescribeSettings(const SessionSettings& settings) {
  const std::string level = absl::StrCat("ONNX Runtime optimizations ", OrtLevelName(settings.optimization_level));
  if (settings.device != v1::DEVICE_CUDA) return absl::StrCat("CPU fp32, ", level);
  return absl::StrCat("CUDA GPU, TF32 ", settings.cuda_tf32 ? "on" : "off", settings.cuda_graph ? ", CUDA graph" : "",
                      ", ", level);
}

bool SameArithmetic(const SessionSettings& a, const SessionSettings& b) {
  return a.device == b.device && a.optimization_level == b.optimization_level &&
         (a.device != v1::DEVICE_CUDA || a.cuda_tf32 == b.cuda_tf32);
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
    if (!settings.prepack_weights) options.AddConfigEntry("session.disable_prepacking", "1");
    if (*provider == "CUDAExecutionProvider") AppendCuda(options, settings);
    if (!model.path.empty()) {
      return std::make_unique<Ort::Session>(OrtEnvironment(), model.path.c_str(), options);
    }
    return std::make_unique<Ort::Session>(OrtEnvironment(), model.bytes.data(), model.bytes.size(), options);
  } catch (const Ort::Exception& e) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ORT_SESSION_FAILED,
                   absl::StrCat("ONNX Runtime cannot load the model: ", e.what()));
  }
}

absl::StatusOr<Ort::LoraAdapter> LoadLoraAdapter(const std::string& bytes) {
  try {
    return Ort::LoraAdapter::CreateLoraAdapterFromArray(bytes.data(), bytes.size(), nullptr);
  } catch (const Ort::Exception& e) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                   absl::StrCat("ONNX Runtime refuses the adapter: ", e.what()));
  }
}

}  // namespace onnxopt
