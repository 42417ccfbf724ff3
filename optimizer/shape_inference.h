// onnxopt's shape inference of a model's main graph: one topological sweep that, node by node, runs
// onnx's own inference rule for the operator (its schema's inference and data-propagation functions)
// and then the rules of symbolic_shapes.h, so every node sees the final types of its inputs.
//
// It replaces onnx's whole-model InferShapes followed by recovery rounds (the recovered shapes written
// back as value_info and onnx's inference run again until nothing improved): at 100k nodes that was
// 2-2.7 s a run, of which onnx's own sweep was 0.25 s; the rounds were the rest.
//
// Differences from onnx's InferShapes, on purpose:
// - A node whose rule fails (an onnx InferenceError, a type clash with a declared type) leaves its
//   outputs as declared, and the sweep goes on; onnx's non-strict mode does the same but aborts the
//   whole run on other errors.
// - A data-propagation rule runs only when every input has a type: onnx 1.12's Shape-15 propagation
//   dereferences a missing type and crashes the process.
// - Nothing is written into the model: the result is a map.
#ifndef ONNXOPT_OPTIMIZER_SHAPE_INFERENCE_H_
#define ONNXOPT_OPTIMIZER_SHAPE_INFERENCE_H_

#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"
#include "optimizer/symbolic_shapes.h"

namespace onnxopt {

// The last opset whose schemas onnx 1.12 has, and the last one the sweep reads with them: a node of
// opset 18 to 24 gets its operator's opset-17 rule where that version's shapes are the same (every
// operator whose later versions only widened its types), and none where they changed (AdaptedSchema
// in shape_inference.cc says which). Later opsets get the symbolic rules only (TrackShapeArithmetic).
inline constexpr int kLastKnownOpset = 17;
inline constexpr int kLastAdaptedOpset = 24;

struct InferredTypes {
  TypeMap types;         // every main-graph value that has a type: declared, initializer or inferred
  KnownIntValues known;  // node outputs whose values the shapes fix (shape arithmetic)
  DimAliases aliases;    // declared dims read as the sums they name (symbolic_shapes.h)
};

// Whether the sweep reads an initializer's values (small and in memory), not only its type.
bool ReadAsData(const onnx::TensorProto& tensor);

// The types a graph states without inference: its initializers' (which win over a declared type of
// an overridable input), then its inputs', outputs' and value_info's.
TypeMap DeclaredTypes(const onnx::GraphProto& graph);

// DeclaredTypes, completed and refined by the sweep.
// `model`'s default-domain opset must be at most kLastAdaptedOpset: the caller checks.
// Declared dims found to name sums are read as those sums: a sweep that finds some it was not given
// runs once more with them (DimAliases); `aliases`, from an earlier sweep of the model, saves that.
InferredTypes InferGraphTypes(const onnx::ModelProto& model, const DimAliases& aliases = {});
// The same for `model`'s main graph while a Graph holds its nodes (between passes, checkpointed, so
// Nodes() is in topological order); opsets and functions come from `model`.
InferredTypes InferGraphTypes(const onnx::ModelProto& model, const Graph& graph, const DimAliases& aliases = {});
// For a model whose opset onnx 1.12 does not know: the declared types, with the values of shape
// arithmetic tracked and the dims the rules of symbolic_shapes.h fill in where none is declared
// (the dynamo exporter declares every value's type; its Reshape targets are Concats of Shape slices).
InferredTypes TrackShapeArithmetic(const onnx::ModelProto& model, const DimAliases& aliases = {});
InferredTypes TrackShapeArithmetic(const onnx::ModelProto& model, const Graph& graph, const DimAliases& aliases = {});
// `inferred` (a sweep of `graph` before a pass that kept the types of the values it left) completed
// with the initializers the pass added or replaced (typed by their tensors) and the nodes it added,
// in topological order: their outputs get types from their inputs'. Shape arithmetic they read is
// known only as far as constants and the new nodes tell.
InferredTypes ExtendGraphTypes(const onnx::ModelProto& model, const Graph& graph, const std::vector<const Node*>& added,
                               const std::vector<std::string>& added_initializers, InferredTypes inferred);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_SHAPE_INFERENCE_H_
