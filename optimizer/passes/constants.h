// Reading and writing small constant tensors in passes: initializers, or Constant nodes' values.
#ifndef ONNXOPT_OPTIMIZER_PASSES_CONSTANTS_H_
#define ONNXOPT_OPTIMIZER_PASSES_CONSTANTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"

namespace onnxopt {

// The tensor behind `value` if it is an initializer (not an overridable graph input) or the output of
// a Constant node with a `value` tensor; nullptr otherwise.
const onnx::TensorProto* ConstantTensor(const Graph& graph, const std::string& value);

// Elements of an INT64/INT32 constant tensor, or of a FLOAT one.
std::optional<std::vector<int64_t>> ConstantInts(const Graph& graph, const std::string& value);
std::optional<std::vector<float>> ConstantFloats(const Graph& graph, const std::string& value);
std::optional<std::vector<int64_t>> TensorInts(const onnx::TensorProto& tensor);
std::optional<std::vector<float>> TensorFloats(const onnx::TensorProto& tensor);
// The values of a float constant that broadcasts along the channel axis of a rank-`rank` NCHW-style
// tensor with `channels` channels, one per channel: shaped [C, 1, ...] (rank - 1 dims), [1, C, 1, ...]
// (rank dims), or one element ([1] or a scalar, repeated). nullopt for any other shape.
std::optional<std::vector<float>> ChannelFloats(const onnx::TensorProto& tensor, int64_t channels, int rank);
// The axes of an Unsqueeze (or a node like it): its constant second input (opset 13 on), else its
// "axes" attribute.
std::optional<std::vector<int64_t>> ConstantAxes(const Graph& graph, const Node& node);

onnx::TensorProto MakeInt64Tensor(const std::string& name, const std::vector<int64_t>& values);  // 1-D
// A rank-0 INT32 (type INT32) or INT64 (any other type) tensor.
onnx::TensorProto MakeIntScalar(const std::string& name, int32_t type, int64_t value);
// A tensor of any element type whose bytes are already laid out (quantized weights, packed nibbles).
onnx::TensorProto MakeRawTensor(const std::string& name, int32_t type, const std::vector<int64_t>& dims,
                                std::string raw);
onnx::TensorProto MakeFloatTensor(const std::string& name, const std::vector<int64_t>& dims,
                                  const std::vector<float>& values);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_CONSTANTS_H_
