// A model in memory handed to ONNX Runtime without ever serializing it whole: a protobuf message cannot
// pass 2 GiB, and pulling a multi-GB model's tensors by reference into one string would cost their bytes
// twice. Small models still go as bytes.
#ifndef ONNXOPT_OPTIMIZER_RUNTIME_SOURCE_H_
#define ONNXOPT_OPTIMIZER_RUNTIME_SOURCE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "optimizer/ort_runtime.h"

namespace onnxopt {

// Models with tensors by reference, or over `inline_limit_bytes`, are saved to a scratch folder (see
// ScratchFolderFor) with their tensors by reference linked, not copied (SaveOptions::link_by_reference);
// the folder goes with the last copy of the source. Others serialize to bytes.
inline constexpr int64_t kInlineRuntimeLimitBytes = int64_t{1} << 30;
absl::StatusOr<ModelSource> RuntimeSource(const onnx::ModelProto& model,
                                          int64_t inline_limit_bytes = kInlineRuntimeLimitBytes);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_RUNTIME_SOURCE_H_
