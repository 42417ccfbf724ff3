// Recovers shapes that onnx 1.12's inference loses in exported transformers, where Reshape targets
// are computed at run time from Shape (Shape -> Gather -> Unsqueeze -> Concat -> Reshape), and where
// a broadcast meets one of those unknown dims.
//
// It tracks the values of small integer tensors symbolically (each element a number or a named
// dimension), gives Reshape outputs their shape (0 copies the input's dim, -1 is solved by dividing
// symbolic products), and resolves a broadcast dim that onnx left unknown to the agreeing known
// non-1 size of the other inputs: any other value would make the model fail, and rewrites only need
// to agree with the original on inputs it accepts. The results go back into the model as value_info
// and onnx's inference runs again, a few rounds at most.
#ifndef ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_
#define ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_

#include <string>
#include <unordered_map>
#include <vector>

#include "onnx/onnx_pb.h"

namespace onnxopt {

// Node outputs that are small integer tensors (shape arithmetic) whose every element the shapes fix
// to a number or a named dim, e.g. the static last dim of a [batch, sequence, 64] tensor read through
// Shape -> Gather, key_length - query_length when both are the same symbolic dim (0), or "sequence".
using KnownIntValues = std::unordered_map<std::string, std::vector<onnx::TensorShapeProto::Dimension>>;

// `model` is a weight-free copy onnx inference already ran on; `types` holds what it found and is
// updated in place. Returns the number of values whose shape got better. `known`, if given,
// receives the node outputs whose values the final shapes pin down.
int RecoverSymbolicShapes(onnx::ModelProto* model, std::unordered_map<std::string, onnx::TypeProto>* types,
                          KnownIntValues* known = nullptr);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_
