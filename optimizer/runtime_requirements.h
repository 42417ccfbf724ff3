// The oldest ONNX Runtime a model runs on, from what it uses: its default-domain opset and the contrib
// operators onnxopt's fusions emit, per execution provider (several shipped on CUDA a release or more
// before their CPU kernel, and some have none on the CPU). Written into Triton's config.pbtxt and the
// report's runtimes, so a deployment knows which runtime to pin.
//
// The releases were established by loading one-node models in each ONNX Runtime release's Linux
// build (the npm packages, 1.10.0 onwards: schema present, CPU kernel present, attributes and input
// counts accepted), CUDA ones from the pull requests and release notes that shipped the kernels.
// 1.10 is the floor: what was there by then is not dated further.
#ifndef ONNXOPT_OPTIMIZER_RUNTIME_REQUIREMENTS_H_
#define ONNXOPT_OPTIMIZER_RUNTIME_REQUIREMENTS_H_

#include <string>

#include "onnx/onnx_pb.h"

namespace onnxopt {

struct RuntimeRequirement {
  std::string version;   // "1.16.2"; empty when no release runs it on this provider (reason says why)
  std::string reason;    // what sets it, e.g. "com.microsoft::MatMulNBits"
  bool contrib = false;  // whether ONNX Runtime's own operators are needed (no other runtime has them)
};

RuntimeRequirement MinimumOnnxRuntime(const onnx::ModelProto& model, bool cuda);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_RUNTIME_REQUIREMENTS_H_
