// A native evaluator for the integer arithmetic exporters leave behind (shape tensors: Unsqueeze,
// Concat, Gather, Slice, Reshape, Add, Div...), for fold_constants.
//
// Exports carry thousands of these chains. Running them in one ONNX Runtime session cost 2 s for
// 8.6k nodes in a 100k-node model, and grew faster than the node count (session creation). Integer
// results are exact, so evaluating them here gives what ONNX Runtime gives; anything else (floats, a
// division by zero, an operator or form not listed) is left to ONNX Runtime.
#ifndef ONNXOPT_OPTIMIZER_PASSES_INTEGER_ARITHMETIC_H_
#define ONNXOPT_OPTIMIZER_PASSES_INTEGER_ARITHMETIC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"

namespace onnxopt {

// An INT64 or INT32 tensor, its elements widened to int64.
struct IntTensor {
  int32_t data_type = onnx::TensorProto::INT64;
  std::vector<int64_t> dims;
  std::vector<int64_t> values;
};

// At most this many elements are evaluated natively; bigger tensors are not shape arithmetic.
constexpr size_t kMaxIntTensorElements = 4096;

// The tensor as an IntTensor when it is INT64/INT32, readable and small enough.
std::optional<IntTensor> IntTensorFromProto(const onnx::TensorProto& tensor);
onnx::TensorProto IntTensorToProto(const IntTensor& tensor, const std::string& name);

// The single output of `node` (default domain, `opset`) from its integer inputs (nullptr for an
// absent optional input); nullopt when the operator or this use of it is not one evaluated here.
std::optional<IntTensor> EvaluateIntegerNode(const onnx::NodeProto& node, const std::vector<const IntTensor*>& inputs,
                                             int64_t opset);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_INTEGER_ARITHMETIC_H_
