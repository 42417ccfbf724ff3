// canonicalize_masked_scores: attention scores masked by selection, `scores.masked_fill(~allowed, min)`
// or `torch.where(allowed, scores, min)`, become the additive boolean mask the attention fusion reads
// (and probes for its meaning, attention_masks.h) whatever the model's version wrote.
//
// Before:  p = Softmax(Where(c, fill, x))      or  p = Softmax(Where(c, x, fill))
// After:   p = Softmax(Add(x, Where(Not(c), 0, fill)))  /  p = Softmax(Add(x, Where(c, 0, fill)))
// (the Where is read by the Softmax directly or through a clamp Max or a scalar scale.)
// Checked: fill is a constant scalar at or below -1e4 (-inf included), x is float and not constant, c is
// boolean. Equal wherever the original is finite: a masked score is fill in both (x + fill rounds to fill
// for any score below 2^103 in magnitude, and -inf stays -inf). Left alone: Where(c, x, fill) over a
// constant buffer sliced to the scores (GPT-2's causal `bias[:, :, :S, :S]`), which the fusion reads as a
// causal mask as it is. One Where (and Not) per condition, shared by every layer that reads it.
//
// Also the multiplicative form GPT-2's first release and Megatron write, for a 0/1 float mask m (the
// masks every fusion here reads hold 0/1):
// Before:  p = Softmax(Sub(Mul(x, m), Mul(c, Sub(1, m))))      (c >= 1e4; operands of each Mul in any order)
// After:   p = Softmax(Add(x, Where(Cast(m, bool), 0, -c)))
// and where m is a constant 0/1 buffer sliced to the scores (transformers 2.x's GPT-2, `w * b - 1e4 *
// (1 - b)` over `bias[:, :, ns-nd:ns, :ns]`, possibly before the padding's Add), the selection the
// fusion reads as a causal mask, exact for 0/1 values:
// After:   p = Softmax([Add(] Where(Cast(m, bool), x, -c) [, padding)])
#include <algorithm>
#include <map>
#include <tuple>

#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// True if `value` is Softmax's input, or reaches it through at most two clamp Max or scalar scale
// nodes read by nothing else.
bool FeedsSoftmax(const Graph& graph, const std::string& value, int depth = 0) {
  Node* reader = SoleConsumer(graph, value);
  if (reader == nullptr || !reader->domain().empty() || depth > 2) return false;
  if (reader->op_type() == "Softmax") return reader->input(0) == value;
  const bool clamp = reader->op_type() == "Max" && reader->input_size() == 2;
  const bool scale = (reader->op_type() == "Mul" || reader->op_type() == "Div") && reader->input(0) == value &&
                     ConstantScalarFloat(graph, reader->input(1)).has_value();
  return (clamp || scale) && FeedsSoftmax(graph, reader->output(0), depth + 1);
}

// x * m - c * (1 - m) (c >= 1e4): the scores x, the mask m and -c.
struct MultipliedMask {
  std::string scores, mask;
  float fill = 0;
};
std::optional<MultipliedMask> MatchMultipliedMask(const Graph& graph, const Node& sub) {
  if (sub.op_type() != "Sub" || !sub.domain().empty() || sub.input_size() != 2) return std::nullopt;
  Node* kept = ProducerWithOp(graph, sub.input(0), "Mul");
  Node* removed = ProducerWithOp(graph, sub.input(1), "Mul");
  if (kept == nullptr || removed == nullptr || kept->input_size() != 2 || removed->input_size() != 2) return std::nullopt;
  const std::optional<int> c_side = FindOperand(*removed, [&](const std::string& operand) {
    const std::optional<float> c = ConstantScalarFloat(graph, operand);
    return c && *c >= 1e4f;
  });
  if (!c_side) return std::nullopt;
  Node* inverted = ProducerWithOp(graph, OtherInput(*removed, *c_side), "Sub");
  if (inverted == nullptr || !IsScalarNear(graph, inverted->input(0), 1.0, 0.0)) return std::nullopt;
  const std::string& mask = inverted->input(1);
  const std::optional<int> mask_side = FindOperand(*kept, [&](const std::string& operand) { return operand == mask; });
  if (!mask_side) return std::nullopt;
  return MultipliedMask{OtherInput(*kept, *mask_side), mask, -*ConstantScalarFloat(graph, removed->input(*c_side))};
}

// The additive term Where(allowed, 0, fill), added to `chain`.
std::string MaskTerm(Graph& graph, NodeChain& chain, const std::string& allowed, float fill) {
  const std::string zero = graph.UniqueName("scores_mask_zero");
  const std::string masked = graph.UniqueName("scores_mask_fill");
  graph.AddInitializer(MakeFloatTensor(zero, {}, {0.0f}));
  graph.AddInitializer(MakeFloatTensor(masked, {}, {fill}));
  return chain.Add("Where", {allowed, zero, masked}, "scores_mask");
}

// `masked` (the scores' selection or product) replaced by `op` over `inputs` writing its output: the
// additive Add(scores, term), or a multiplied causal buffer's selection Where(allowed, scores, fill).
void ReplaceMasked(Graph& graph, NodeChain& chain, Node* masked, const char* op, std::vector<std::string> inputs,
                   PassContext& context) {
  const std::string output = masked->output(0);
  const std::string name = masked->name();
  const std::string suffix = std::string(op) == "Add" ? "_additive" : "_selected";
  graph.RemoveNode(masked);
  chain.AddNode(MakeNode(op, graph.UniqueName(name.empty() ? "masked_scores" : name + suffix), std::move(inputs),
                         {output}));
  context.CountRewrite();
}
void ReplaceWithAdditive(Graph& graph, NodeChain& chain, Node* masked, const std::string& scores,
                         const std::string& term, PassContext& context) {
  ReplaceMasked(graph, chain, masked, "Add", {scores, term}, context);
}

// The constant `cond` is Slices (and Casts) of, or nullptr: a causal buffer cut to the scores' length.
const onnx::TensorProto* SlicedBuffer(const Graph& graph, const std::string& cond) {
  std::string value = cond;
  bool sliced = false;
  for (int depth = 0; depth < 4; ++depth) {
    Node* node = graph.Producer(value);
    if (node == nullptr || !node->domain().empty() || (node->op_type() != "Slice" && node->op_type() != "Cast")) break;
    sliced |= node->op_type() == "Slice";
    value = node->input(0);
  }
  return sliced ? ConstantTensor(graph, value) : nullptr;
}
bool IsSlicedBuffer(const Graph& graph, const std::string& cond) { return SlicedBuffer(graph, cond) != nullptr; }

// True if `value` is a float slice of a constant buffer holding only 0 and 1.
bool IsSlicedZeroOneBuffer(const Graph& graph, const std::string& value) {
  const onnx::TensorProto* buffer = SlicedBuffer(graph, value);
  if (buffer == nullptr || buffer->data_type() != onnx::TensorProto::FLOAT) return false;
  const std::optional<std::vector<float>> values = TensorFloats(*buffer);
  return values && std::all_of(values->begin(), values->end(), [](float v) { return v == 0.0f || v == 1.0f; });
}

// True if `value` is read by an Add of one other operand that feeds the Softmax (FeedsSoftmax): the padding
// term added after a causal one.
bool FeedsSoftmaxThroughAdd(const Graph& graph, const std::string& value) {
  Node* add = SoleConsumer(graph, value);
  return add != nullptr && add->op_type() == "Add" && add->domain().empty() && add->input_size() == 2 &&
         add->input(0) != add->input(1) && FeedsSoftmax(graph, add->output(0));
}

class CanonicalizeMaskedScoresPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_masked_scores"; }
  absl::string_view description() const override {
    return "Turn scores masked by selection before a Softmax (masked_fill, where(allowed, scores, min)) into the "
           "additive boolean mask the attention fusion reads";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    // (condition, negated, fill) -> the additive term Where([Not] c, 0, fill).
    std::map<std::tuple<std::string, bool, float>, std::string> terms;
    for (Node* where : graph.Nodes()) {
      if (where->removed() || where->op_type() != "Where" || !where->domain().empty() || where->input_size() != 3) {
        continue;
      }
      const std::optional<float> fill_true = ConstantScalarFloat(graph, where->input(1));
      const std::optional<float> fill_false = ConstantScalarFloat(graph, where->input(2));
      const bool negated = fill_true.has_value() && !fill_false.has_value();  // Where(c, fill, x)
      const std::optional<float> fill = negated ? fill_true : fill_false;
      const std::string& cond = where->input(0);
      const std::string& scores = where->input(negated ? 2 : 1);
      if (!fill || !(*fill <= -1e4f) || ConstantTensor(graph, scores) != nullptr ||
          shapes.ElementType(scores).value_or(onnx::TensorProto::FLOAT) != onnx::TensorProto::FLOAT ||
          shapes.ElementType(cond).value_or(onnx::TensorProto::BOOL) != onnx::TensorProto::BOOL ||
          !FeedsSoftmax(graph, where->output(0)) || (!negated && IsSlicedBuffer(graph, cond))) {
        continue;
      }
      std::string& term = terms[{cond, negated, *fill}];
      NodeChain chain(graph, where);
      if (term.empty()) term = MaskTerm(graph, chain, negated ? chain.Add("Not", {cond}, "scores_allowed") : cond, *fill);
      ReplaceWithAdditive(graph, chain, where, scores, term, context);
    }
    CanonicalizeMultipliedMasks(graph, context, shapes);
    return absl::OkStatus();
  }

 private:
  static void CanonicalizeMultipliedMasks(Graph& graph, PassContext& context, const ShapeInfo& shapes) {
    std::map<std::pair<std::string, float>, std::string> terms;  // (mask, fill) -> Where(Cast(m), 0, fill)
    for (Node* sub : graph.Nodes()) {
      if (sub->removed()) continue;
      const std::optional<MultipliedMask> form = MatchMultipliedMask(graph, *sub);
      if (!form || ConstantTensor(graph, form->scores) != nullptr ||
          shapes.ElementType(form->mask).value_or(onnx::TensorProto::FLOAT) != onnx::TensorProto::FLOAT) {
        continue;
      }
      const bool causal_buffer = IsSlicedZeroOneBuffer(graph, form->mask);
      if (!FeedsSoftmax(graph, sub->output(0)) && !(causal_buffer && FeedsSoftmaxThroughAdd(graph, sub->output(0)))) {
        continue;
      }
      NodeChain chain(graph, sub);
      if (causal_buffer) {  // Where(Cast(m, bool), x, -c): what the fusion reads as the causal mask
        const std::string allowed =
            chain.Add("Cast", {form->mask}, "causal_allowed", {MakeIntAttribute("to", onnx::TensorProto::BOOL)});
        const std::string masked = graph.UniqueName("causal_fill");
        graph.AddInitializer(MakeFloatTensor(masked, {}, {form->fill}));
        ReplaceMasked(graph, chain, sub, "Where", {allowed, form->scores, masked}, context);
        continue;
      }
      std::string& term = terms[{form->mask, form->fill}];
      if (term.empty()) {
        const std::string allowed =
            chain.Add("Cast", {form->mask}, "scores_allowed", {MakeIntAttribute("to", onnx::TensorProto::BOOL)});
        term = MaskTerm(graph, chain, allowed, form->fill);
      }
      ReplaceWithAdditive(graph, chain, sub, form->scores, term, context);
    }
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeMaskedScoresPass() { return std::make_unique<CanonicalizeMaskedScoresPass>(); }

}  // namespace onnxopt
