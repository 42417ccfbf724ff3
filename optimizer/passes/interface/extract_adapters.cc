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

// A LoRA branch this pass extracts: constant float matrices of a rank below both widths, added onto
// a projection of the branch's input.
struct Extraction {
  Node* add = nullptr;  // base + branch
  LoraBranch branch;
};

bool IsFloatMatrix(const onnx::TensorProto* tensor) {
  return tensor != nullptr && tensor->dims_size() == 2 && tensor->data_type() == onnx::TensorProto::FLOAT;
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
  if (add->op_type() != "Add" || !add->domain().empty() || add->input_size() != 2) return Fail();
  for (int side = 0; side < 2; ++side) {
    std::optional<LoraBranch> branch = MatchLoraBranch(graph, add->input(side));
    if (!branch || !IsFloatMatrix(branch->a) || !IsFloatMatrix(branch->b)) continue;
    // The branch's nodes are its own: nothing else reads what they compute.
    if (graph.Consumers(branch->down->output(0)).size() != 1 || graph.Consumers(branch->up->output(0)).size() != 1 ||
        graph.IsGraphOutput(branch->up->output(0)) ||
        (branch->scale != nullptr && graph.Consumers(branch->scale->output(0)).size() != 1)) {
      continue;
    }
    // Low rank: the branch is narrower than both ends (what tells it from a two-layer projection).
    const int64_t rank = branch->a->dims(1);
    if (rank >= branch->a->dims(0) || rank >= branch->b->dims(1)) continue;
    if (!ProjectsInput(graph, add->input(1 - side), branch->x)) {
      return Fail("a low-rank branch added onto something that is not a projection of the same input");
    }
    return Extraction{add, *branch};
  }
  return Fail();
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
             "comma-separated module names (or parts of them, e.g. q_proj,v_proj) to extract; empty: all"}};
  }
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    if (!graph.is_main()) return absl::OkStatus();  // adapters are parameters of the main graph
    if (context.model().ir_version() < 4) {
      context.Skip("IR version < 4: an input's default must be listed as an initializer and input alike");
      return absl::OkStatus();
    }
    std::vector<std::string> wanted;
    for (absl::string_view module : absl::StrSplit(context.params().GetString("modules"), ',', absl::SkipWhitespace())) {
      wanted.emplace_back(absl::StripAsciiWhitespace(module));
    }
    int unnamed = 0;
    RewriteEachMatch(graph, context, "LoRA branch: ", [&](Node* node) { return MatchExtraction(graph, node); },
                     [&](const Extraction& extraction) {
                       std::string module = CanonicalModulePath(RecordedModule(*extraction.add));
                       if (module.empty()) module = absl::StrCat("lora.", unnamed++);
                       if (!wanted.empty() && std::none_of(wanted.begin(), wanted.end(), [&](const std::string& w) {
                             return absl::StrContains(module, w);
                           })) {
                         context.Skip("a module the `modules` parameter leaves out");
                         return;
                       }
                       std::string a_name = AdapterParameterName(module, 'A');
                       if (graph.IsDefinedHere(a_name)) {  // two branches one module: peft's many adapters
                         module = graph.UniqueName(module);
                         a_name = AdapterParameterName(module, 'A');
                       }
                       Extract(graph, context, extraction.branch, module);
                     });
    return absl::OkStatus();
  }

 private:
  static void Extract(Graph& graph, PassContext& context, const LoraBranch& branch, const std::string& module) {
    const int64_t rank = branch.a->dims(1);
    const std::string a_name = AdapterParameterName(module, 'A');
    const std::string b_name = AdapterParameterName(module, 'B');
    onnx::TensorProto a = *branch.a;
    a.set_name(a_name);
    std::vector<float> b_values = *TensorFloats(*branch.b);
    const float scale = branch.scale_value;
    for (float& value : b_values) value *= scale;
    const std::vector<int64_t> b_dims(branch.b->dims().begin(), branch.b->dims().end());
    graph.AddInitializer(std::move(a));
    graph.AddInitializer(MakeFloatTensor(b_name, b_dims, b_values));
    graph.AddGraphInput(AdapterInput(a_name, {"", kAdapterRankDim}, {branch.a->dims(0), rank}));
    graph.AddGraphInput(AdapterInput(b_name, {kAdapterRankDim, ""}, {rank, b_dims[1]}));
    graph.SetInput(branch.down, 1, a_name);
    graph.SetInput(branch.up, 1, b_name);
    if (branch.scale != nullptr) {
      graph.ReplaceAllUsesWith(branch.scale->output(0), branch.up->output(0));
      graph.RemoveNode(branch.scale);
    }
    context.CountRewrite();
    context.Count("adapter_parameters", 2);
    context.Note(absl::StrCat(module, ": rank ", rank, ", ", branch.a->dims(0), " -> ", b_dims[1], ", scale ", scale,
                              " folded into B"));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeExtractAdaptersPass() { return std::make_unique<ExtractAdaptersPass>(); }

}  // namespace onnxopt
