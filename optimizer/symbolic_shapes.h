// Shape rules onnx 1.12's inference lacks for exported transformers, applied node by node during
// onnxopt's own inference sweep (shape_inference.h).
//
// Reshape targets in exports are computed at run time from Shape (Shape -> Gather -> Unsqueeze ->
// Concat -> Reshape). The rules track the values of small integer tensors symbolically (each element
// a number or a named dimension), give Reshape outputs their shape (0 copies the input's dim, -1 is
// solved by dividing symbolic products), and resolve a broadcast dim that onnx left unknown to the
// agreeing known non-1 size of the other inputs: any other value would make the model fail, and
// rewrites only need to agree with the original on inputs it accepts. ONNX Runtime's fused operators
// get their output shapes here too where their schemas leave them open.
#ifndef ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_
#define ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "onnx/onnx_pb.h"

namespace onnxopt {

using TypeMap = std::unordered_map<std::string, onnx::TypeProto>;

// Node outputs that are small integer tensors (shape arithmetic) whose every element the shapes fix
// to a number or a named dim, e.g. the static last dim of a [batch, sequence, 64] tensor read through
// Shape -> Gather, key_length - query_length when both are the same symbolic dim (0), or "sequence".
using KnownIntValues = std::unordered_map<std::string, std::vector<onnx::TensorShapeProto::Dimension>>;

class SymbolicShapes {
 public:
  // `opset`: the model's default-domain opset (Shape's start/end exist from 15).
  explicit SymbolicShapes(int64_t opset);
  ~SymbolicShapes();
  SymbolicShapes(const SymbolicShapes&) = delete;
  SymbolicShapes& operator=(const SymbolicShapes&) = delete;

  // An initializer: its value is tracked when it is a small integer tensor.
  void TrackConstant(const std::string& name, const onnx::TensorProto& tensor);
  // Called for every node in topological order, after onnx's inference of it: improves the types of
  // its outputs in `types` and tracks the value of its first output. Returns the outputs improved.
  int Apply(const onnx::NodeProto& node, TypeMap* types);
  // The tracked value of `name` in onnx's data-propagation form (unknown elements as empty dims).
  bool ShapeData(const std::string& name, onnx::TensorShapeProto* data) const;
  // The computed values (not Constants) whose every element is known.
  KnownIntValues Known() const;

 private:
  struct State;  // the tracked values
  int64_t opset_;
  std::unique_ptr<State> state_;
  std::vector<std::string> computed_;  // tracked node outputs, in the order they were computed
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_
