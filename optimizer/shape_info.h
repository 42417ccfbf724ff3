// Types and shapes of a model's values, from onnxopt's inference sweep (shape_inference.h) where the
// model's opset is one it reads with onnx 1.12's rules (<= 24: 18 on with the opset-17 rule of every
// operator whose shapes have not changed since), plus whatever the model itself declares (inputs,
// outputs, value_info, initializers). For a later opset only the declared types are used, with the
// values of shape arithmetic tracked (symbolic_shapes.h); `inferred()` is false then. Passes that need a shape
// they cannot get here leave the graph alone.
#ifndef ONNXOPT_OPTIMIZER_SHAPE_INFO_H_
#define ONNXOPT_OPTIMIZER_SHAPE_INFO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"
#include "optimizer/shape_inference.h"

namespace onnxopt {

// Two dims are the same when they are one number or one symbolic name.
bool SameDimension(const onnx::TensorShapeProto::Dimension& a, const onnx::TensorShapeProto::Dimension& b);

class ShapeInfo {
 public:
  // Main-graph values of `model`; `inferred()` says whether shape inference ran. `aliases`: those an
  // earlier inference of the model found (dim_aliases()), which spares the sweep a second run.
  static ShapeInfo Infer(const onnx::ModelProto& model, const DimAliases& aliases = {});
  // The same while `graph` holds the nodes of `model`'s main graph (see Graph::Checkpoint).
  static ShapeInfo Infer(const onnx::ModelProto& model, const Graph& graph, const DimAliases& aliases = {});

  // Drops what is known about values that no longer exist: a name used again later must not inherit
  // it (see Pass::keeps_value_types).
  void Forget(const std::vector<std::string>& values);
  // Types the initializers a pass added or replaced, and the nodes it added (topologically ordered)
  // from their inputs' (ExtendGraphTypes).
  void Extend(const onnx::ModelProto& model, const Graph& graph, const std::vector<const Node*>& added,
              const std::vector<std::string>& added_initializers);

  const onnx::TypeProto* TypeOf(const std::string& value) const;
  std::optional<int32_t> ElementType(const std::string& value) const;
  std::optional<int> Rank(const std::string& value) const;
  // All dimensions known numbers.
  std::optional<std::vector<int64_t>> StaticShape(const std::string& value) const;
  // True if both values have shapes of one rank whose dims are equal: the same number, or the same
  // symbolic name.
  bool SameShape(const std::string& a, const std::string& b) const;
  // True if dim `i` of `a` and dim `j` of `b` (negative: from the end) are the same number or the
  // same symbolic name.
  bool SameDim(const std::string& a, int i, const std::string& b, int j) const;
  // Dim `i` of `value` (negative: from the end) when its shape is known.
  const onnx::TensorShapeProto::Dimension* Dim(const std::string& value, int i) const;
  // Dim `i` of `value` (negative: from the end) if it is a known number.
  std::optional<int64_t> DimValue(const std::string& value, int i) const;
  bool inferred() const { return inferred_; }
  // The elements of a computed integer tensor (shape arithmetic) when the shapes pin them all down
  // to numbers.
  std::optional<std::vector<int64_t>> KnownValue(const std::string& value) const;
  // The same, where elements may also be named dims ("sequence").
  const std::vector<onnx::TensorShapeProto::Dimension>* SymbolicValue(const std::string& value) const;
  // The declared dims read as the sums they name (total_sequence as past_sequence + sequence): the
  // types here spell them as the sums.
  const DimAliases& dim_aliases() const { return aliases_; }

 private:
  ShapeInfo(InferredTypes inferred, bool ran);
  TypeMap types_;
  KnownIntValues known_values_;
  DimAliases aliases_;
  bool inferred_ = false;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_SHAPE_INFO_H_
