// onnx::TensorProto <-> Ort::Value, for reference inputs and outputs (the ONNX conformance data,
// inputs supplied with a job) and for constant folding.
#ifndef ONNXOPT_OPTIMIZER_TENSOR_CONVERT_H_
#define ONNXOPT_OPTIMIZER_TENSOR_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxruntime_cxx_api.h"

namespace onnxopt {

// Bytes per element for fixed-size element types; 0 for others.
size_t ElementSize(int32_t type);

// A copy of the tensor's data in an ONNX Runtime value (raw_data or the typed fields; not external
// data). UNIMPLEMENTED for element types onnxopt does not convert (complex, 4-bit, float8).
absl::StatusOr<Ort::Value> TensorProtoToOrtValue(const onnx::TensorProto& tensor);

// The reverse, as raw_data, named `name`.
absl::StatusOr<onnx::TensorProto> OrtValueToTensorProto(const Ort::Value& value, const std::string& name);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_TENSOR_CONVERT_H_
