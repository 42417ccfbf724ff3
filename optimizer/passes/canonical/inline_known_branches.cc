// inline_known_branches: an If whose condition is known before the model runs becomes the branch it
// always takes. torch's TorchScript exporter writes `t.squeeze(d)` on a dim it cannot see as
// If(Shape(t)[d] == 1, Squeeze(t, d), Identity(t)), as in transformers 4.3x's rotary
// `cos_cached[:, :, :S].squeeze(1).squeeze(0)`; shape inference stops at the If and so does every
// fusion downstream, although the dim is 1 in every run (a [1, 1, P, D] buffer).
//
// Before:  y = If(cond, then_branch: {..., z = Squeeze(t, d)}, else_branch: {z' = Identity(t)})
// After:   ...; y = Squeeze(t, d)      (cond known true; the else branch alike)
// A branch output its nodes compute is written under the If's output name; one the branch passes
// through from outside (or an initializer) gets an Identity.
// Checked: cond is a constant, or a value shape arithmetic tracks to one number (Equal of a static
// dim and a constant), of one element; the branch has no sparse initializers or nested subgraphs and as
// many outputs as the If (its initializers move to the graph). The branch's values are renamed to names
// unique in the graph.
#include <map>
#include <set>

#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// The condition's value where it is known: a one-element constant (bool, as constant folding leaves
// it, or integer) or tracked value.
std::optional<bool> KnownCondition(const Graph& graph, const ShapeInfo& shapes, const std::string& cond) {
  if (const onnx::TensorProto* tensor = ConstantTensor(graph, cond)) {
    if (tensor->data_type() == onnx::TensorProto::BOOL && !tensor->has_data_location()) {
      if (tensor->raw_data().size() == 1) return tensor->raw_data()[0] != 0;
      if (tensor->int32_data_size() == 1) return tensor->int32_data(0) != 0;
      return std::nullopt;
    }
    const std::optional<std::vector<int64_t>> values = TensorInts(*tensor);
    if (values && values->size() == 1) return (*values)[0] != 0;
    return std::nullopt;
  }
  const std::optional<std::vector<int64_t>> known = shapes.KnownValue(cond);
  if (known && known->size() == 1) return (*known)[0] != 0;
  return std::nullopt;
}

const onnx::GraphProto* Branch(const onnx::NodeProto& node, bool taken) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.name() == (taken ? "then_branch" : "else_branch") && attribute.has_g()) return &attribute.g();
  }
  return nullptr;
}

class InlineKnownBranchesPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "inline_known_branches"; }
  absl::string_view description() const override {
    return "Replace an If whose condition is known before the model runs (a constant, or a static dim compared "
           "with one: the TorchScript exporter's squeeze of a dim it cannot see) with the branch it takes";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    for (Node* node : graph.Nodes()) {
      if (node->removed() || node->op_type() != "If" || !node->domain().empty() || node->input_size() != 1) continue;
      const std::optional<bool> taken = KnownCondition(graph, shapes, node->input(0));
      if (!taken) continue;
      const onnx::NodeProto with_bodies = node->ProtoWithBodies();
      const onnx::GraphProto* branch = Branch(with_bodies, *taken);
      if (branch == nullptr || branch->sparse_initializer_size() > 0 || branch->output_size() != node->output_size()) {
        context.Skip("inline_known_branches: the branch has sparse initializers or other outputs than the If");
        continue;
      }
      bool nested = false;
      for (const auto& inner : branch->node()) {
        for (const auto& attribute : inner.attribute()) nested |= attribute.has_g() || attribute.graphs_size() > 0;
      }
      if (nested) {
        context.Skip("inline_known_branches: the branch holds subgraphs of its own");
        continue;
      }
      // The branch's own values (and its initializers, constant folding's Constants) get names unique in
      // the graph; outer values keep theirs.
      std::map<std::string, std::string> renamed;
      for (const onnx::TensorProto& initializer : branch->initializer()) {
        onnx::TensorProto moved = initializer;
        moved.set_name(graph.UniqueName(initializer.name()));
        renamed[initializer.name()] = moved.name();
        graph.AddInitializer(std::move(moved));
      }
      std::set<std::string> produced;
      for (const auto& inner : branch->node()) {
        for (const std::string& output : inner.output()) {
          if (output.empty()) continue;
          renamed[output] = graph.UniqueName(output);
          produced.insert(output);
        }
      }
      // A branch output its own node computes (once) is written under the If's output name: an
      // Identity in between would hide the value's producer from the fusions of the same sweep.
      std::map<std::string, int> output_count;
      for (const auto& output : branch->output()) ++output_count[output.name()];
      std::vector<bool> written(static_cast<size_t>(node->output_size()), false);
      for (int i = 0; i < node->output_size(); ++i) {
        const std::string& value = branch->output(i).name();
        if (produced.count(value) > 0 && output_count[value] == 1) {
          renamed[value] = node->output(i);
          written[static_cast<size_t>(i)] = true;
        }
      }
      auto mapped = [&](const std::string& value) {
        auto it = renamed.find(value);
        return it == renamed.end() ? value : it->second;
      };
      const Node* at = node;
      graph.RemoveNode(node);
      for (onnx::NodeProto inner : branch->node()) {
        for (std::string& input : *inner.mutable_input()) input = mapped(input);
        for (std::string& output : *inner.mutable_output()) output = mapped(output);
        inner.set_name(graph.UniqueName(inner.name().empty() ? node->name() + "_branch" : inner.name()));
        at = graph.AddNode(std::move(inner), at, /*after=*/true);
      }
      for (int i = 0; i < node->output_size(); ++i) {
        if (written[static_cast<size_t>(i)]) continue;
        at = graph.AddNode(MakeNode("Identity", graph.UniqueName(node->name() + "_taken"),
                                    {mapped(branch->output(i).name())}, {node->output(i)}),
                           at, /*after=*/true);
      }
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeInlineKnownBranchesPass() { return std::make_unique<InlineKnownBranchesPass>(); }

}  // namespace onnxopt
