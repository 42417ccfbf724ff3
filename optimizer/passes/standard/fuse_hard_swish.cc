// fuse_hard_swish: hard-swish and hard-sigmoid written as Relu6 arithmetic become ONNX's HardSigmoid.
//
// Before (hard-swish, paddle2onnx and TF exports):    y = Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)
//        also x * (Clip(x + 3, 0, 6) / 6), with / 6 as * (1/6) and operands in either order
// After:                                               y = Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))
// Before (hard-sigmoid):  y = Clip(Add(x, 3), 0, 6) / 6         After:  y = HardSigmoid(x, 1/6, 0.5)
//
// Four element-wise passes over the tensor become two (one for hard-sigmoid). HardSigmoid exists since
// opset 6, so the rewrite holds at every opset an exporter writes; ONNX's HardSwish (opset 14) measured
// no faster than HardSigmoid + Mul in ONNX Runtime's CPU provider (PP-OCRv4's detector, 640x640), so
// one form serves all opsets. Clip's bounds are attributes before opset 11 and constant inputs after;
// both must be exactly 0 and 6, the shift 3 and the scale 1/6 within 1e-6 relative. The results differ
// from the original only in rounding (x/6 + 0.5 against (x + 3)/6).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

constexpr double kRelative = 1e-6;

// Clip's bounds: attributes min/max before opset 11, constant inputs 1 and 2 from opset 11 on.
bool ClipsToZeroAndSix(const Graph& graph, const Node& clip) {
  std::optional<float> low, high;
  if (clip.input_size() == 1) {
    const onnx::AttributeProto* min = clip.FindAttribute("min");
    const onnx::AttributeProto* max = clip.FindAttribute("max");
    if (min != nullptr) low = min->f();
    if (max != nullptr) high = max->f();
  } else if (clip.input_size() == 3 && !clip.input(1).empty() && !clip.input(2).empty()) {
    low = ConstantScalarFloat(graph, clip.input(1));
    high = ConstantScalarFloat(graph, clip.input(2));
  }
  return low && high && *low == 0.0f && *high == 6.0f;
}

bool IsSixth(float scale) { return std::fabs(scale - 1.0 / 6.0) <= kRelative / 6.0; }

struct HardSwishMatch {
  std::vector<Node*> nodes;  // in graph order: Add, Clip, then the scale and product in theirs
  std::string x, output;
  bool swish = false;  // x * hard_sigmoid(x), else hard_sigmoid(x) alone
};

// Anchored at the Clip of Relu6(x + 3).
MatchResult<HardSwishMatch> MatchHardSwish(const Graph& graph, Node* clip) {
  if (clip->op_type() != "Clip" || !clip->domain().empty() || !ClipsToZeroAndSix(graph, *clip)) return Fail();
  Node* add = ProducerWithOp(graph, clip->input(0), "Add");
  std::optional<std::string> x = OperandBesideScalar(graph, add, "Add", 3.0, 3.0 * kRelative);
  if (!x) return Fail();
  HardSwishMatch match;
  match.x = *x;
  match.nodes = {add, clip};
  Node* next = SoleConsumer(graph, clip->output(0));
  if (auto scale = ScalarScale(graph, next); scale && scale->second == clip->output(0) && IsSixth(scale->first)) {
    // Clip(x + 3) / 6, then maybe times x.
    match.nodes.push_back(next);
    match.output = next->output(0);
    Node* product = SoleConsumer(graph, next->output(0));
    if (IsMulOf(product, match.x, next->output(0))) {
      match.nodes.push_back(product);
      match.output = product->output(0);
      match.swish = true;
    }
    return match;
  }
  if (IsMulOf(next, match.x, clip->output(0))) {
    // x * Clip(x + 3), then / 6.
    Node* last = SoleConsumer(graph, next->output(0));
    auto scale = ScalarScale(graph, last);
    if (!scale || scale->second != next->output(0) || !IsSixth(scale->first)) return Fail();
    match.nodes.insert(match.nodes.end(), {next, last});
    match.output = last->output(0);
    match.swish = true;
    return match;
  }
  return Fail();
}

void Rewrite(Graph& graph, PassContext& context, const HardSwishMatch& match) {
  Node* anchor = match.nodes.back();
  NodeChain chain(graph, anchor);
  const std::vector<onnx::AttributeProto> slope = {MakeFloatAttribute("alpha", 1.0f / 6.0f),
                                                   MakeFloatAttribute("beta", 0.5f)};
  if (match.swish) {
    const std::string gate = chain.Add("HardSigmoid", {match.x}, match.output + "_hard_sigmoid", slope);
    chain.AddNode(MakeNode("Mul", graph.UniqueName("HardSwish"), {match.x, gate}, {match.output}));
  } else {
    onnx::NodeProto node = MakeNode("HardSigmoid", graph.UniqueName("HardSigmoid"), {match.x}, {match.output});
    for (const auto& attribute : slope) *node.add_attribute() = attribute;
    chain.AddNode(std::move(node));
  }
  for (Node* node : match.nodes) graph.RemoveNode(node);
  context.CountRewrite();
}

class FuseHardSwishPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_hard_swish"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fuse hard-swish x * Relu6(x + 3) / 6 and hard-sigmoid Relu6(x + 3) / 6, written as Add/Clip/Mul/Div, "
           "into HardSigmoid (times x)";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    RewriteEachMatch(
        graph, context, "fuse_hard_swish: ", [&](Node* node) -> MatchResult<HardSwishMatch> {
          MatchResult<HardSwishMatch> match = MatchHardSwish(graph, node);
          if (match && !OnlyPatternReads(graph, match->nodes, match->output)) {
            return Fail("an intermediate value of the pattern is read elsewhere");
          }
          return match;
        },
        [&](const HardSwishMatch& match) { Rewrite(graph, context, match); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseHardSwishPass() { return std::make_unique<FuseHardSwishPass>(); }

}  // namespace onnxopt
