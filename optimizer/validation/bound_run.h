// Runs through ONNX Runtime's IoBinding: a session's inputs and outputs bound in one memory, the
// host's or the CUDA device's, so that a timed run on a GPU does the model's work alone (inputs
// uploaded once, outputs left on the device) or, bound on the host, exactly what a caller with host
// tensors pays. Fixed output buffers make the runs replayable as a CUDA graph. Every path here runs
// on CPU memory too, which is how the CPU tests cover it.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_BOUND_RUN_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_BOUND_RUN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/input_generator.h"

namespace onnxopt {

// Where a bound run's inputs and outputs live.
enum class Residence {
  kHost,    // host tensors: each run copies the inputs to the device and the outputs back
  kDevice,  // the session's device: inputs uploaded once, outputs left there
};

// The memory ONNX Runtime allocates in for `device` (host memory for the CPU, CUDA device 0).
Ort::MemoryInfo DeviceMemory(v1::Device device);

// Copies `values` (named `names`) into `target` memory through a session of Identity nodes on
// `device`: the C API copies tensors between devices only for plugin providers. On the CPU it copies
// host to host.
absl::StatusOr<std::vector<Ort::Value>> CopyValues(const std::vector<std::string>& names,
                                                   const std::vector<Ort::Value>& values, v1::Device device,
                                                   const Ort::MemoryInfo& target);

class BoundRun {
 public:
  // Binds `inputs` (as they are for kHost, uploaded once to the device of `device` for kDevice) and
  // `output_names` (allocated by ONNX Runtime in the same memory) to `session`.
  static absl::StatusOr<std::unique_ptr<BoundRun>> Create(Ort::Session& session, const GeneratedInputs& inputs,
                                                          const std::vector<std::string>& output_names,
                                                          v1::Device device, Residence residence);

  // One run, its outputs synchronized; INTERNAL when ONNX Runtime fails.
  absl::Status Run();
  // Binds the last run's outputs as fixed buffers: later runs write them in place, at the same
  // addresses, which replaying a CUDA graph needs. FAILED_PRECONDITION before a run.
  absl::Status FixOutputs();
  // The last run's outputs, in the bound memory, in output_names' order.
  std::vector<Ort::Value> Outputs();
  const std::vector<std::string>& output_names() const { return output_names_; }

 private:
  BoundRun(Ort::Session& session, std::vector<std::string> output_names);

  Ort::Session& session_;
  Ort::IoBinding binding_;
  std::vector<std::string> output_names_;
  std::vector<Ort::Value> inputs_;         // kept alive while bound
  std::vector<Ort::Value> fixed_outputs_;  // after FixOutputs
  bool ran_ = false;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_BOUND_RUN_H_
