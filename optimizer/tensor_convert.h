// onnx::TensorProto <-> Ort::Value, for reference inputs and outputs (the ONNX conformance data,
// inputs supplied with a job) and for constant folding.
#ifndef ONNXOPT_OPTIMIZER_TENSOR_CONVERT_H_
#define ONNXOPT_OPTIMIZER_TENSOR_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "onnx/onnx_pb.h"
#include "onnxruntime_cxx_api.h"

namespace onnxopt {

// Bytes per element for fixed-size element types; 0 for others.
size_t ElementSize(int32_t type);

// prod(dims) * element_size, or nullopt for a negative dim or an overflow (sizes that come from files).
std::optional<uint64_t> CheckedByteSize(const std::vector<int64_t>& dims, size_t element_size);

// The tensor's data as little-endian element bytes wherever it lives (raw_data, a file by reference,
// the typed fields): a view of raw_data or of `scratch`. INVALID_ARGUMENT when the data does not fill
// the dims or lies in external data not resolved here, UNIMPLEMENTED for element types without a fixed
// size (strings, 4-bit, float8).
absl::StatusOr<absl::string_view> TensorBytes(const onnx::TensorProto& tensor, std::string* scratch);

// A copy of the tensor's data in an ONNX Runtime value (raw_data or the typed fields; not external
// data). UNIMPLEMENTED for element types onnxopt does not convert (complex, 4-bit, float8).
absl::StatusOr<Ort::Value> TensorProtoToOrtValue(const onnx::TensorProto& tensor);

// The reverse, as raw_data, named `name`.
absl::StatusOr<onnx::TensorProto> OrtValueToTensorProto(const Ort::Value& value, const std::string& name);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_TENSOR_CONVERT_H_
