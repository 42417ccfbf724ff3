// extract_adapters: LoRA branches become adapter inputs, so one optimized model serves many adapters
// (ONNX Runtime's LoRA adapters: an `.onnx_adapter` file per adapter, activated per run).
//
// Before:  y = Add(base, Mul(MatMul(MatMul(x, A), B), s))        A [in, r], B [r, out], s a scalar
//          (both exporters; Div by 1/s, or no Mul where alpha = r, alike; base a MatMul of x, with its
//          bias Add or as a Gemm)
// After:   inputs  <module>.lora_A.weight [in, lora_r], <module>.lora_B.weight [lora_r, out]
//          y = Add(base, MatMul(MatMul(x, <module>.lora_A.weight), <module>.lora_B.weight))
//          the inputs' initializers (A, and B * s) stay as their defaults until the job saves the
//          model: then they move into model.onnx_adapter and the model requires an adapter.
//
// Several adapters active at once on one projection (a chain of such branches) become one input pair
// of their summed rank (`concatenate`, the default: x [A_0 A_1] [B_0; B_1] is their sum, one MatMul pair
// instead of one per adapter), or a pair each (module, module_1, ...).
//
// The scale goes into B, so an adapter of any alpha runs on the same graph; the rank is a symbolic
// dim, so adapters of any rank do too. The module is the one the exporter recorded (TorchScript's
// scope in the node name, the dynamo exporter's `pkg.torch.onnx.name_scopes`), canonical as
// lora_adapter.h says, else `lora.<n>`. Overridable defaults keep the model whole for the passes after
// this one (which cannot fold or quantize the adapter, as they must not) and for validation.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/lora_branch.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

// LoRA branches this pass extracts: constant float matrices of a rank below both widths, added onto a
// projection of the branches' input, one after another when several adapters are active at once.
struct Extraction {
  // Outermost first: Add(..Add(Add(base, branch_n-1)..), branch_0); the last Add reads the base.
  std::vector<Node*> adds;
  std::vector<LoraBranch> branches;
  std::string base;
};

// A float matrix whose values can be read and fill its dims.
bool IsFloatMatrix(const onnx::TensorProto* tensor) {
  if (tensor == nullptr || tensor->dims_size() != 2 || tensor->data_type() != onnx::TensorProto::FLOAT) return false;
  const std::optional<std::vector<float>> values = TensorFloats(*tensor);
  return values && static_cast<int64_t>(values->size()) == tensor->dims(0) * tensor->dims(1);
}

// The operand of `add` that is an extractable LoRA branch: its side and the branch.
std::optional<std::pair<int, LoraBranch>> BranchOperand(const Graph& graph, const Node* add) {
  if (add == nullptr || add->op_type() != "Add" || !add->domain().empty() || add->input_size() != 2)
    return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    std::optional<LoraBranch> branch = MatchLoraBranch(graph, add->input(side));
    if (!branch || !IsFloatMatrix(branch->a) || !IsFloatMatrix(branch->b)) continue;
    // The branch's nodes are its own: nothing else reads what they compute.
    if (graph.Consumers(branch->down->output(0)).size() != 1 || graph.Consumers(branch->up->output(0)).size() != 1 ||
        graph.IsGraphOutput(branch->up->output(0)) ||
        (branch->scale != nullptr &&
         (graph.Consumers(branch->scale->output(0)).size() != 1 || graph.IsGraphOutput(branch->scale->output(0))))) {
      continue;
    }
    // Low rank: the branch is narrower than both ends (what tells it from a two-layer projection).
    const int64_t rank = branch->a->dims(1);
    if (rank >= branch->a->dims(0) || rank >= branch->b->dims(1)) continue;
    return std::make_pair(side, *branch);
  }
  return std::nullopt;
}

// Whether `base` is a projection of `x`: MatMul(x, W) or Gemm(x, W), with its bias added or not.
bool ProjectsInput(const Graph& graph, const std::string& base, const std::string& x) {
  auto projects = [&](const Node* node) {
    return node != nullptr && node->domain().empty() && (node->op_type() == "MatMul" || node->op_type() == "Gemm") &&
           node->input(0) == x;
  };
  const Node* node = graph.Producer(base);
  if (projects(node)) return true;
  return node != nullptr && node->op_type() == "Add" && node->domain().empty() &&
         (projects(graph.Producer(node->input(0))) || projects(graph.Producer(node->input(1))));
}

MatchResult<Extraction> MatchExtraction(const Graph& graph, Node* add) {
  std::optional<std::pair<int, LoraBranch>> first = BranchOperand(graph, add);
  if (!first) return Fail();
  // Matched from the outermost Add of a chain, which takes the whole chain.
  if (Node* reader = SoleConsumer(graph, add->output(0)); BranchOperand(graph, reader)) return Fail();
  Extraction extraction;
  Node* current = add;
  std::optional<std::pair<int, LoraBranch>> operand = first;
  while (operand) {
    if (!extraction.branches.empty() && operand->second.x != extraction.branches.front().x) break;
    extraction.adds.push_back(current);
    extraction.branches.push_back(operand->second);
    extraction.base = current->input(1 - operand->first);
    current = graph.Producer(extraction.base);
    operand = graph.Consumers(extraction.base).size() == 1 && !graph.IsGraphOutput(extraction.base)
                  ? BranchOperand(graph, current)
                  : std::nullopt;
  }
  if (!ProjectsInput(graph, extraction.base, extraction.branches.front().x)) {
    return Fail("a low-rank branch added onto something that is not a projection of the same input");
  }
  return extraction;
}

// The module the exporter recorded for `node`: the dynamo exporter's innermost name scope (its last
// entry is the node's own name), or TorchScript's scope, the node name's folders.
std::string RecordedModule(const Node& node) {
  const std::string scopes = NodeMetadataValue(node.proto(), "pkg.torch.onnx.name_scopes");
  if (!scopes.empty()) {
    // A Python list's repr: ['', 'm', 'm.base_model.model', ..., 'mul_70'].
    std::vector<std::string> entries;
    for (absl::string_view entry : absl::StrSplit(absl::StripPrefix(absl::StripSuffix(scopes, "]"), "["), ", ")) {
      entries.emplace_back(absl::StripSuffix(absl::StripPrefix(entry, "'"), "'"));
    }
    return entries.size() >= 2 ? entries[entries.size() - 2] : std::string();
  }
  const size_t slash = node.name().rfind('/');
  if (node.name().empty() || node.name()[0] != '/' || slash == std::string::npos || slash == 0) return "";
  return node.name().substr(1, slash - 1);
}

onnx::ValueInfoProto AdapterInput(const std::string& name, const std::vector<std::string>& dims,
                                  const std::vector<int64_t>& values) {
  onnx::ValueInfoProto input;
  input.set_name(name);
  onnx::TypeProto::Tensor* tensor = input.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnx::TensorProto::FLOAT);
  for (size_t d = 0; d < dims.size(); ++d) {
    auto* dim = tensor->mutable_shape()->add_dim();
    if (dims[d].empty()) {
      dim->set_dim_value(values[d]);
    } else {
      dim->set_dim_param(dims[d]);
    }
  }
  input.set_doc_string("LoRA adapter parameter (extract_adapters): fed by an active adapter");
  return input;
}

class ExtractAdaptersPass final : public Pass {
 public:
  absl::string_view name() const override { return "extract_adapters"; }
  absl::string_view description() const override {
    return "LoRA branches (x A B * scale added onto a projection) take A and B as inputs, written to "
           "model.onnx_adapter: one model serves any adapter of those modules (changes the interface)";
  }
  std::vector<ParamSpec> params() const override {
    return {{"modules", ParamType::kString, "",
             "comma-separated module names (or parts of them, e.g. q_proj,v_proj) to extract; empty: all"},
            {"concatenate", ParamType::kBool, "true",
             "several adapters active on one projection: one input pair of their summed rank (one MatMul pair), "
             "or a pair each (module, module_1, ...)"}};
  }
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    if (!graph.is_main()) return absl::OkStatus();  // adapters are parameters of the main graph
    if (context.model().ir_version() < 4) {
      context.Skip("IR version < 4: an input's default must be listed as an initializer and input alike");
      return absl::OkStatus();
    }
    std::vector<std::string> wanted;
    for (absl::string_view module :
         absl::StrSplit(context.params().GetString("modules"), ',', absl::SkipWhitespace())) {
      wanted.emplace_back(absl::StripAsciiWhitespace(module));
    }
    const bool concatenate = context.params().GetBool("concatenate");
    int unnamed = 0;
    RewriteEachMatch(
        graph, context, "LoRA branch: ", [&](Node* node) { return MatchExtraction(graph, node); },
        [&](const Extraction& extraction) {
          std::string module = CanonicalModulePath(RecordedModule(*extraction.adds.back()));
          if (module.empty()) module = absl::StrCat("lora.", unnamed++);
          if (!wanted.empty() && std::none_of(wanted.begin(), wanted.end(),
                                              [&](const std::string& w) { return absl::StrContains(module, w); })) {
            context.Skip("a module the `modules` parameter leaves out");
            return;
          }
          if (concatenate) {
            Extract(graph, context, extraction, UnusedModuleName(graph, module));
            return;
          }
          for (size_t i = 0; i < extraction.branches.size(); ++i) {  // innermost (first added) first
            const size_t at = extraction.branches.size() - 1 - i;
            Extraction one{{extraction.adds[at]}, {extraction.branches[at]}, ""};
            Extract(graph, context, one, UnusedModuleName(graph, module));
          }
        });
    return absl::OkStatus();
  }

 private:
  // `module`, or module_1, module_2... where an input of its name exists (one module, several adapters).
  static std::string UnusedModuleName(const Graph& graph, const std::string& module) {
    std::string name = module;
    for (int i = 1; graph.IsDefinedHere(AdapterParameterName(name, 'A')); ++i) name = absl::StrCat(module, "_", i);
    return name;
  }

  // The branches' A side by side ([in, sum of ranks]) and their B, each scaled, stacked ([sum, out]):
  // x [A_0 A_1] [B_0 s_0; B_1 s_1] = x A_0 B_0 s_0 + x A_1 B_1 s_1 (ConcatenateAdapters). One pair of
  // inputs replaces them, the innermost branch computes it, the other branches and their Adds go.
  static void Extract(Graph& graph, PassContext& context, const Extraction& extraction, const std::string& module) {
    const std::string a_name = AdapterParameterName(module, 'A');
    const std::string b_name = AdapterParameterName(module, 'B');
    std::vector<std::vector<onnx::TensorProto>> adapters;  // a branch each: A and B * s
    for (const LoraBranch& branch : extraction.branches) {
      onnx::TensorProto a = *branch.a;
      a.set_name(a_name);
      std::vector<float> b = *TensorFloats(*branch.b);  // readable: IsFloatMatrix
      for (float& value : b) value *= branch.scale_value;
      adapters.push_back({std::move(a), MakeFloatTensor(b_name, {branch.b->dims(0), branch.b->dims(1)}, b)});
    }
    absl::StatusOr<std::vector<onnx::TensorProto>> merged = ConcatenateAdapters(adapters);
    if (!merged.ok()) {
      context.Skip("LoRA branches of one projection with other widths");
      return;
    }
    const onnx::TensorProto& a = (*merged)[0].name() == a_name ? (*merged)[0] : (*merged)[1];
    const onnx::TensorProto& b = (*merged)[0].name() == a_name ? (*merged)[1] : (*merged)[0];
    const int64_t in = a.dims(0), rank = a.dims(1), out = b.dims(1);
    graph.AddGraphInput(AdapterInput(a_name, {"", kAdapterRankDim}, {in, rank}));
    graph.AddGraphInput(AdapterInput(b_name, {kAdapterRankDim, ""}, {rank, out}));
    graph.AddInitializer(a);
    graph.AddInitializer(b);
    std::vector<std::string> replaced;  // the constants the branches read
    for (const LoraBranch& branch : extraction.branches) {
      replaced.push_back(branch.down->input(1));
      replaced.push_back(branch.up->input(1));
    }
    const LoraBranch& kept = extraction.branches.back();  // the innermost
    graph.SetInput(kept.down, 1, a_name);
    graph.SetInput(kept.up, 1, b_name);
    if (kept.scale != nullptr) {  // no graph output: BranchOperand
      graph.ReplaceAllUsesWith(kept.scale->output(0), kept.up->output(0));
      graph.RemoveNode(kept.scale);
    }
    for (size_t i = 0; i + 1 < extraction.adds.size(); ++i) {
      Node* add = extraction.adds[i];
      const LoraBranch& gone = extraction.branches[i];
      const std::string sum = gone.scale != nullptr ? gone.scale->output(0) : gone.up->output(0);
      const std::string rest = add->input(0) == sum ? add->input(1) : add->input(0);
      const std::string output = add->output(0);
      for (Node* node : {add, gone.scale, gone.up, gone.down}) {
        if (node != nullptr) graph.RemoveNode(node);
      }
      // The rest is the inner Add's output (no graph output: MatchExtraction), which takes the name of a
      // graph output this Add wrote.
      if (graph.IsGraphOutput(output)) {
        (void)graph.RenameValue(rest, output);
      } else {
        graph.ReplaceAllUsesWith(output, rest);
      }
    }
    for (const std::string& name : replaced) {
      if (graph.Initializer(name) != nullptr && !graph.HasConsumers(name) && !graph.IsGraphInput(name) &&
          !graph.IsGraphOutput(name)) {
        graph.RemoveInitializer(name);
      }
    }
    context.CountRewrite();
    context.Count("adapter_parameters", 2);
    if (extraction.branches.size() > 1) {
      context.Count("adapters_concatenated", static_cast<int64_t>(extraction.branches.size()));
    }
    context.Note(
        absl::StrCat(module, ": rank ", rank,
                     extraction.branches.size() > 1 ? absl::StrCat(" (", extraction.branches.size(), " adapters)") : "",
                     ", ", in, " -> ", out, ", scale folded into B"));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeExtractAdaptersPass() { return std::make_unique<ExtractAdaptersPass>(); }

}  // namespace onnxopt
