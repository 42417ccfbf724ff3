// ONNX Runtime, wrapped: one process-wide environment, sessions built from bytes or a path, and
// ONNX Runtime's C++ exceptions turned into absl::Status at this boundary.
#ifndef ONNXOPT_OPTIMIZER_ORT_RUNTIME_H_
#define ONNXOPT_OPTIMIZER_ORT_RUNTIME_H_

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxruntime_cxx_api.h"

namespace onnxopt {

// A model for ONNX Runtime: serialized bytes, or a file (for models with external data).
struct ModelSource {
  ModelSource() = default;
  ModelSource(std::string model_bytes, std::filesystem::path model_path)
      : bytes(std::move(model_bytes)), path(std::move(model_path)) {}

  std::string bytes;
  std::filesystem::path path;
  // Keeps `path`'s scratch folder (RuntimeSource) while any copy of this source lives.
  std::shared_ptr<const std::filesystem::path> files;
};

struct SessionSettings {
  v1::Device device = v1::DEVICE_CPU;
  int intra_op_threads = 0;  // 0: ONNX Runtime's default
  GraphOptimizationLevel optimization_level = ORT_ENABLE_ALL;
  bool parallel_execution = false;  // ORT_PARALLEL: independent branches on the inter-op pool
  // Intra-op threads spin after a run waiting for the next one. Two sessions timed in turns would
  // then compete with each other's spinning threads, so side-by-side timing turns it off.
  bool allow_spinning = true;
  // Kernels copy constant weights into their own layout when the session loads (MatMul's packed B).
  // Off for a model that does not fit in memory: its weights then stay in the files ONNX Runtime maps,
  // read from the disk as each run needs them (ModelExceedsMemory).
  bool prepack_weights = true;
  // CUDA only: fp32 MatMuls and convolutions in TF32 (ONNX Runtime's default; parity turns it off),
  // and the whole run replayed as one CUDA graph (every node on CUDA, inputs and outputs bound at
  // fixed device addresses: BoundRun).
  bool cuda_tf32 = true;
  bool cuda_graph = false;
};

// ONNX Runtime's level for `level`, `fallback` when unspecified; and its name for reports.
GraphOptimizationLevel OrtLevel(v1::OrtOptimizationLevel level, GraphOptimizationLevel fallback);
std::string OrtLevelName(GraphOptimizationLevel level);

// "CPU fp32" or "CUDA GPU, TF32 off", then the optimization level: what a report says ran.
std::string DescribeSettings(const SessionSettings& settings);
// Whether sessions under `a` and `b` compute the same numbers: the same device and ONNX Runtime
// rewrites (and TF32 on CUDA). Thread counts and spinning do not change results.
bool SameArithmetic(const SessionSettings& a, const SessionSettings& b);

std::string OrtVersion();
// The execution providers this ONNX Runtime build has (whether or not they can run here).
std::vector<std::string> OrtAvailableProviders();

// Whether a provider the build has can run on this machine, and if not, why: for CUDA, ONNX Runtime's
// own message on loading its provider library (the library it could not open, e.g. libcudart.so.13).
struct ProviderStatus {
  std::string name;
  bool usable = false;
  std::string reason;  // when not usable
};
// Probed once per process (loading a provider library is not free) and cached.
const std::vector<ProviderStatus>& ProviderStatuses();
// The process-wide environment; the first call creates it with the logging level last set.
Ort::Env& OrtEnvironment();
void SetOrtLoggingLevel(OrtLoggingLevel level);
// "CPU (model name)" from /proc/cpuinfo.
std::string CpuDescription();
// The provider that runs `device`; FAILED_PRECONDITION (CUDA_UNAVAILABLE: <why>) if this build has
// none or it cannot load here. onnxopt never falls back to the CPU silently.
absl::StatusOr<std::string> ProviderFor(v1::Device device);

absl::StatusOr<std::unique_ptr<Ort::Session>> CreateSession(const ModelSource& model, const SessionSettings& settings);

// An `.onnx_adapter` file's bytes as ONNX Runtime's LoRA adapter (its parameters on the CPU), to
// activate per run (Ort::RunOptions::AddActiveLoraAdapter); INVALID_ARGUMENT with ONNX Runtime's
// reason when it refuses the file.
absl::StatusOr<Ort::LoraAdapter> LoadLoraAdapter(const std::string& bytes);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_ORT_RUNTIME_H_
