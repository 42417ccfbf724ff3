// What the precision passes share: node names and name lists, float32 -> float16/bfloat16 conversion of tensors (round to
// nearest even, clamped into the target's range), and the element type of every value of a graph,
// propagated node by node so that ONNX Runtime's contrib operators (which onnx's shape inference
// does not know) are typed too.
#ifndef ONNXOPT_OPTIMIZER_PASSES_PRECISION_PRECISION_COMMON_H_
#define ONNXOPT_OPTIMIZER_PASSES_PRECISION_PRECISION_COMMON_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"
#include "optimizer/shape_info.h"

namespace onnxopt {

inline constexpr float kFloat16Max = 65504.0f;
// The smallest positive float16 subnormal: smaller magnitudes would become 0.
inline constexpr float kFloat16MinPositive = 5.9604645e-08f;

uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);
uint16_t FloatToBfloat16(float value);

// `tensor` (FLOAT, raw or typed data, not external) converted to `to` (FLOAT16 or BFLOAT16) as
// raw_data. For float16, finite values beyond ±65504 become ±65504 and non-zero magnitudes below the
// smallest subnormal become it, as ONNX Runtime's converter does; `clamped` counts them.
onnx::TensorProto ConvertFloatTensor(const onnx::TensorProto& tensor, int32_t to, int64_t* clamped);

// Element types of the values of one graph: graph inputs, initializers, value_info, onnx's shape
// inference where it ran (`shapes`, main graph only), then node by node in order with each operator's
// type rule (outputs follow the first typed float input unless the operator says otherwise). Values
// whose type cannot be worked out (outer-scope values read by a subgraph, unknown operators with no
// typed input) are absent.
std::unordered_map<std::string, int32_t> InferElementTypes(const Graph& graph, const ShapeInfo* shapes);

bool IsFloatType(int32_t type);  // FLOAT, FLOAT16, BFLOAT16 or DOUBLE

// How block lists name a node: its name, or its first output when it has none ("" if neither).
std::string NodeKey(const onnx::NodeProto& node);
inline std::string NodeKey(const Node& node) { return NodeKey(node.proto()); }

// Comma-separated list -> set, items trimmed.
std::set<std::string> SplitNameList(const std::string& text);

// The readers of the table `table` when each is a row lookup (a Gather along axis 0 whose NodeKey is
// not `blocked`) and the table is no graph output; nullopt otherwise (a table tied to an output
// projection, say, which quantizing for the lookups would store twice).
std::optional<std::vector<Node*>> RowLookups(const Graph& graph, const std::string& table,
                                             const std::set<std::string>& blocked);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_PRECISION_PRECISION_COMMON_H_
