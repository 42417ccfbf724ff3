// fold_constants: evaluates nodes whose inputs are all constant, Shape/Size of values whose shape
// is static, and shape arithmetic whose value the shapes pin down, and stores the results as
// initializers. Constant nodes holding a tensor become initializers first.
//
// Before:  W (initializer) -> Transpose -> Wt -> MatMul(x, Wt)       After:  Wt' (initializer) -> MatMul(x, Wt')
//          Shape(x: 1x16x64) -> Gather(.., 2) -> Unsqueeze -> ...            [64] (initializer) -> ...
//          Shape(v: Bx4xSx16) -> Slice(-1:) -> Squeeze                        16 (initializer) -> ...
//          Sub(Gather(Shape(k), 2), Gather(Shape(q), 2)), both S              0 (initializer)
// Integer shape arithmetic is evaluated natively (integer_arithmetic.h: exact, so the same as ONNX
// Runtime's); everything else goes into one small model that one ONNX Runtime session runs, so
// results are exactly what ONNX Runtime would compute (nodes computing the same thing from equal
// inputs run there once, their twins copying the result; small equal results become one
// initializer, the first's, as eliminate_duplicate_initializers would make them). A folded value larger
// than max_output_bytes and than its constant inputs stays computed (folding Expand or
// ConstantOfShape must not blow the model up); its inputs are folded instead. Random operators,
// nodes with subgraphs, other domains and graph inputs with initializers (overridable) never fold.
#include <numeric>
#include <unordered_set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/passes/integer_arithmetic.h"
#include "optimizer/passes/passes.h"
#include "optimizer/shape_inference.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

bool FoldableOp(const Node& node) {
  static const auto* kNever = new absl::flat_hash_set<absl::string_view>{
      "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
      "Dropout", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty"};
  return node.domain().empty() && node.subgraphs().empty() && node.implicit_inputs().empty() &&
         !kNever->contains(node.op_type());
}

// Shape/Size of a value whose shape shape inference knows completely.
std::optional<onnx::TensorProto> FoldShape(const Node& node, const ShapeInfo& shapes, int64_t opset) {
  if (node.input_size() != 1 || node.output_size() != 1) return std::nullopt;
  std::optional<std::vector<int64_t>> dims = shapes.StaticShape(node.input(0));
  if (!dims) return std::nullopt;
  onnx::TensorProto tensor;
  tensor.set_name(node.output(0));
  tensor.set_data_type(onnx::TensorProto::INT64);
  if (node.op_type() == "Size") {
    tensor.add_int64_data(std::accumulate(dims->begin(), dims->end(), int64_t{1}, std::multiplies<int64_t>()));
    return tensor;
  }
  const int64_t rank = static_cast<int64_t>(dims->size());
  int64_t start = opset >= 15 ? node.GetAttributeInt("start", 0) : 0;
  int64_t end = opset >= 15 ? node.GetAttributeInt("end", rank) : rank;
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, start, rank);
  tensor.add_dims(end - start);
  for (int64_t i = start; i < end; ++i) tensor.add_int64_data((*dims)[static_cast<size_t>(i)]);
  return tensor;
}

// A small integer tensor the shapes pin down (symbolic shape tracking), as the tensor its node makes.
std::optional<onnx::TensorProto> FoldKnownValue(const Node& node, const ShapeInfo& shapes) {
  if (node.output_size() != 1) return std::nullopt;
  const std::optional<std::vector<int64_t>> known = shapes.KnownValue(node.output(0));
  if (!known) return std::nullopt;  // most values: ask nothing more
  const auto rank = shapes.Rank(node.output(0));
  const auto element_type = shapes.ElementType(node.output(0));
  // Integer results only: the tracking reasons about integers; ONNX Runtime then folds the
  // casts and arithmetic that follow.
  if (!known || !rank || *rank > 1 || !element_type || (*rank == 0 && known->size() != 1) ||
      (*element_type != onnx::TensorProto::INT64 && *element_type != onnx::TensorProto::INT32)) {
    return std::nullopt;
  }
  onnx::TensorProto tensor;
  tensor.set_name(node.output(0));
  tensor.set_data_type(*element_type);
  if (*rank == 1) tensor.add_dims(static_cast<int64_t>(known->size()));
  for (int64_t v : *known) {
    switch (*element_type) {
      case onnx::TensorProto::INT64: tensor.add_int64_data(v); break;
      default: tensor.add_int32_data(static_cast<int32_t>(v)); break;
    }
  }
  return tensor;
}

// Whether an inference would learn from the folded value what the shapes did not know: a shape the
// sweep had not pinned down, or values that rules read as data and it had not worked out (computed
// by ONNX Runtime, say). Rules read integers as shapes, and floats only as Range bounds and Resize
// scales. Llama's rotary caches need that second inference to fuse; a decoder's float scales do not.
bool LearnsMore(const Graph& graph, const ShapeInfo& shapes, const std::string& name, const onnx::TensorProto& tensor) {
  const std::vector<int64_t> dims(tensor.dims().begin(), tensor.dims().end());
  if (shapes.ElementType(name) != tensor.data_type() || shapes.StaticShape(name) != dims) return true;
  if (!ReadAsData(tensor) || shapes.KnownValue(name)) return false;
  if (tensor.data_type() == onnx::TensorProto::INT64 || tensor.data_type() == onnx::TensorProto::INT32) return true;
  for (const Node* reader : graph.Readers(name)) {
    if (reader->domain().empty() &&
        (reader->op_type() == "Range" || reader->op_type() == "Resize" || reader->op_type() == "Upsample")) {
      return true;
    }
  }
  return false;
}

// Every folded output by name. Node-based: growing a flat table of 47k TensorProtos moved each of
// them at every rehash.
using FoldedValues = absl::node_hash_map<std::string, onnx::TensorProto>;

// The constant tensor named `name`: a value folded so far, or an initializer.
const onnx::TensorProto* FoldedOrInitializer(const Graph& graph, const FoldedValues& values, const std::string& name) {
  auto value = values.find(name);
  return value != values.end() ? &value->second : graph.Initializer(name);
}

// The integer inputs of a node, from initializers and values folded so far, parsed once each.
class IntegerInputs {
 public:
  IntegerInputs(const Graph& graph, const FoldedValues& values)
      : graph_(graph), values_(values) {}

  std::optional<IntTensor> Evaluate(const onnx::NodeProto& node, int64_t opset) {
    std::vector<const IntTensor*> inputs;
    for (const std::string& input : node.input()) inputs.push_back(input.empty() ? nullptr : Find(input));
    return EvaluateIntegerNode(node, inputs, opset);
  }

 private:
  const IntTensor* Find(const std::string& name) {
    auto cached = parsed_.find(name);
    if (cached != parsed_.end()) return cached->second ? &*cached->second : nullptr;
    const onnx::TensorProto* tensor = FoldedOrInitializer(graph_, values_, name);
    std::optional<IntTensor> parsed = tensor != nullptr ? IntTensorFromProto(*tensor) : std::nullopt;
    auto& slot = parsed_[name] = std::move(parsed);
    return slot ? &*slot : nullptr;
  }

  const Graph& graph_;
  const FoldedValues& values_;
  absl::node_hash_map<std::string, std::optional<IntTensor>> parsed_;  // node-based: Evaluate holds pointers
};

// What a node sent to ONNX Runtime computes: its operator, attributes and outputs, and for each input
// either the bytes of a small constant, the name of a big one, or the session value it reads
// (`computed_as`: the output of the first node with that key). Equal keys compute equal tensors.
std::string EvaluationKey(const Node& node, const absl::flat_hash_map<std::string, std::string>& computed_as,
                          const Graph& graph, const FoldedValues& values) {
  constexpr size_t kContentKeyBytes = 4096;  // bigger constants are told apart by name
  std::string key;
  // Each part is tagged and length-prefixed, so that no two different lists of parts read the same.
  auto part = [&key](char tag, absl::string_view bytes) {
    absl::StrAppend(&key, absl::string_view(&tag, 1), bytes.size(), ":", bytes);
  };
  part('d', node.domain());
  part('o', node.op_type());
  for (int i = 0; i < node.output_size(); ++i) part('r', node.output(i).empty() ? "-" : "+");
  for (const auto& attribute : node.proto().attribute()) part('a', attribute.SerializeAsString());
  for (int i = 0; i < node.input_size(); ++i) {
    const std::string& input = node.input(i);
    if (input.empty()) {
      part('-', "");
    } else if (auto computed = computed_as.find(input); computed != computed_as.end()) {
      part('v', computed->second);
    } else if (const onnx::TensorProto* tensor = FoldedOrInitializer(graph, values, input);
               tensor != nullptr && tensor->ByteSizeLong() <= kContentKeyBytes) {
      onnx::TensorProto content = *tensor;
      content.clear_name();
      part('c', content.SerializeAsString());
    } else {
      part('n', input);
    }
  }
  return key;
}

// Folded values up to this size are merged with their equals as they are materialized.
constexpr size_t kMergedAtSourceBytes = 4096;

// Writes folded values into the graph as initializers. A small value equal to one written before it
// (every layer's shape constants) takes that one's name, as eliminate_duplicate_initializers would:
// 25k initializers of a 100k-node decoder were made only to be merged by it. Graph outputs keep
// their names.
class Materializer {
 public:
  explicit Materializer(Graph& graph) : graph_(graph) {}

  // `value` is what `tensor` (named anything) becomes; its producer is removed by the caller. Returns
  // whether an initializer of that name was added (not an equal one's read instead).
  bool Write(const std::string& value, onnx::TensorProto tensor) {
    tensor.clear_name();
    if (!graph_.IsGraphOutput(value) && tensor.ByteSizeLong() <= kMergedAtSourceBytes) {
      auto [kept, first] = written_as_.emplace(tensor.SerializeAsString(), value);
      if (!first) {
        graph_.ReplaceAllUsesWith(value, kept->second);
        return false;
      }
    }
    tensor.set_name(value);
    graph_.AddInitializer(std::move(tensor));
    return true;
  }

 private:
  Graph& graph_;
  absl::flat_hash_map<std::string, std::string> written_as_;  // content -> the value keeping it
};

// A Constant holding a tensor is that tensor: it becomes an initializer before anything else, so
// that the folding below sees it as one. Exports have tens of thousands (36k in a 100k-node
// decoder), which went through the folding's tables like computed values: this way the decoder's
// process took 0.18 s less (median of 10 pairs). A Constant that is a graph output, or too big to
// fold, is left to the general path. Returns the initializers made.
std::vector<std::string> ConstantsToInitializers(Graph& graph, PassContext& context, int64_t max_bytes,
                                                 Materializer* materializer) {
  std::vector<std::string> made;
  for (Node* node : graph.Nodes()) {
    if (node->op_type() != "Constant" || !node->domain().empty() || node->output_size() != 1 ||
        node->proto().attribute_size() != 1) {
      continue;
    }
    const onnx::AttributeProto& value = node->proto().attribute(0);
    const std::string& output = node->output(0);
    if (value.name() != "value" || !value.has_t() || output.empty() || graph.IsGraphOutput(output) ||
        TensorDataBytes(value.t()) > max_bytes) {
      continue;
    }
    const bool read = graph.HasConsumers(output);
    onnx::TensorProto tensor = read ? value.t() : onnx::TensorProto();
    const std::string name = output;
    graph.RemoveNode(node);
    context.CountRewrite();
    if (read && materializer->Write(name, std::move(tensor))) made.push_back(name);
  }
  return made;
}

// Initializers made of Constants that the folding left unread (it folded all their readers), as
// folding the Constant with its readers left none.
void DropUnread(Graph& graph, const std::vector<std::string>& made) {
  for (const std::string& name : made) {
    if (!graph.HasConsumers(name) && !graph.IsGraphOutput(name)) graph.RemoveInitializer(name);
  }
}

class FoldConstantsPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fold_constants"; }
  absl::string_view description() const override {
    return "Evaluate constant subgraphs (and Shape/Size of static shapes, shape arithmetic the shapes fix) with "
           "ONNX Runtime into initializers";
  }
  std::vector<ParamSpec> params() const override {
    return {{"max_output_bytes", ParamType::kInt, "1048576",
             "a folded value bigger than this and than its constant inputs stays computed"}};
  }
  // A folded value is an initializer of the same name and type; see LearnsMore for the rest.
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    const int64_t opset = context.OpsetVersion("");
    const int64_t max_bytes = context.params().GetInt("max_output_bytes");
    Materializer materializer(graph);
    const std::vector<std::string> from_constants = ConstantsToInitializers(graph, context, max_bytes, &materializer);
    // Names point into the graph, which nothing edits before the folded nodes go.
    absl::flat_hash_set<absl::string_view> constant;
    constant.reserve(static_cast<size_t>(graph.proto().initializer_size() + graph.NodeCount()));
    for (const auto& tensor : graph.proto().initializer()) {
      if (!graph.IsGraphInput(tensor.name()) && graph.Initializer(tensor.name()) != nullptr) constant.insert(tensor.name());
    }
    std::vector<Node*> foldable;
    absl::flat_hash_set<const Node*> folded_directly;  // values known without ONNX Runtime
    absl::flat_hash_set<const Node*> known_to_shapes;  // values the shapes' sweep saw or worked out
    FoldedValues values;
    IntegerInputs integers(graph, values);
    for (Node* node : graph.Nodes()) {
      if (!FoldableOp(*node)) continue;
      bool all_constant = node->input_size() > 0 || node->op_type() == "Constant";
      for (int i = 0; i < node->input_size(); ++i) {
        if (!node->input(i).empty() && constant.count(node->input(i)) == 0) all_constant = false;
      }
      // A Constant holding a tensor is that tensor: no need to run it (exports have thousands).
      const onnx::AttributeProto* value = node->op_type() == "Constant" ? node->FindAttribute("value") : nullptr;
      if (value != nullptr && value->has_t() && node->output_size() == 1) {
        onnx::TensorProto tensor = value->t();
        tensor.set_name(node->output(0));
        values[node->output(0)] = std::move(tensor);
        folded_directly.insert(node);
        known_to_shapes.insert(node);
      } else if (!all_constant) {
        std::optional<onnx::TensorProto> folded = node->op_type() == "Shape" || node->op_type() == "Size"
                                                      ? FoldShape(*node, shapes, opset)
                                                      : FoldKnownValue(*node, shapes);
        if (!folded) continue;
        values[node->output(0)] = *std::move(folded);
        folded_directly.insert(node);
        known_to_shapes.insert(node);
        all_constant = true;
      }
      if (!all_constant) continue;
      if (folded_directly.count(node) == 0) {
        if (std::optional<IntTensor> result = integers.Evaluate(node->proto(), opset)) {
          values[node->output(0)] = IntTensorToProto(*result, node->output(0));
          folded_directly.insert(node);
        }
      }
      foldable.push_back(node);
      for (int i = 0; i < node->output_size(); ++i) {
        if (!node->output(i).empty()) constant.insert(node->output(i));
      }
    }
    if (foldable.empty()) return absl::OkStatus();
    absl::Status evaluated = Evaluate(graph, context, foldable, folded_directly, &values);
    if (!evaluated.ok()) {
      context.Skip(absl::StrCat("ONNX Runtime could not evaluate the constant nodes: ", evaluated.message()));
      return absl::OkStatus();
    }

    absl::flat_hash_set<Node*> folding(foldable.begin(), foldable.end());
    auto consumed_outside = [&](const std::string& value) {
      if (graph.IsGraphOutput(value)) return true;
      for (Node* consumer : graph.Readers(value)) {
        if (folding.count(consumer) == 0) return true;
      }
      return false;
    };
    auto input_bytes = [&](const Node& node) {
      int64_t bytes = 0;
      for (int i = 0; i < node.input_size(); ++i) {
        if (const onnx::TensorProto* init = graph.Initializer(node.input(i))) bytes += TensorDataBytes(*init);
        auto it = values.find(node.input(i));
        if (it != values.end()) bytes += TensorDataBytes(it->second);
      }
      return bytes;
    };
    // Unfold producers of oversized results until every value that leaves the folded set is acceptable.
    for (bool changed = true; changed;) {
      changed = false;
      for (Node* node : foldable) {
        if (folding.count(node) == 0) continue;
        for (int i = 0; i < node->output_size(); ++i) {
          const std::string& output = node->output(i);
          auto it = values.find(output);
          const bool unknown = !output.empty() && it == values.end();
          if (unknown || (!output.empty() && consumed_outside(output) && TensorDataBytes(it->second) > max_bytes &&
                          TensorDataBytes(it->second) > input_bytes(*node))) {
            context.Skip(unknown ? "result is not a tensor" : "folded value would be larger than the limit");
            folding.erase(node);
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::string> materialize;
    for (Node* node : foldable) {
      if (folding.count(node) == 0) continue;
      for (int i = 0; i < node->output_size(); ++i) {
        const std::string& output = node->output(i);
        if (output.empty() || !consumed_outside(output)) continue;
        materialize.push_back(output);
        if (known_to_shapes.count(node) == 0 && LearnsMore(graph, shapes, output, values[output])) {
          context.ShapesCanImprove();
        }
      }
    }
    for (Node* node : foldable) {
      if (folding.count(node) == 0) continue;
      graph.RemoveNode(node);
      context.CountRewrite();
    }
    for (const std::string& value : materialize) materializer.Write(value, std::move(values[value]));
    DropUnread(graph, from_constants);
    return absl::OkStatus();
  }

 private:
  // Runs the foldable nodes (those not already folded directly) in one ONNX Runtime session. Nodes
  // that compute the same thing from equal inputs (the same scale in every layer, say) run once and
  // their twins take copies of the results: a 476-layer decoder sent 1,904 nodes, four of them
  // different, and the session's creation cost 50 ms.
  static absl::Status Evaluate(const Graph& graph, PassContext& context, const std::vector<Node*>& foldable,
                               const absl::flat_hash_set<const Node*>& folded_directly,
                               FoldedValues* values) {
    onnx::ModelProto model;
    model.set_ir_version(std::max<int64_t>(context.model().ir_version(), 7));
    *model.mutable_opset_import() = context.model().opset_import();
    onnx::GraphProto* eval = model.mutable_graph();
    eval->set_name("fold_constants");
    std::unordered_set<std::string> added;
    std::vector<std::string> fetch;
    absl::flat_hash_map<std::string, const Node*> first_with_key;
    absl::flat_hash_map<std::string, std::string> computed_as;  // a session value -> what computes it
    std::vector<std::pair<std::string, std::string>> twins;     // (output of a twin, the run node's output)
    for (const Node* node : foldable) {
      if (folded_directly.count(node) > 0) continue;
      const std::string key = EvaluationKey(*node, computed_as, graph, *values);
      auto [first, is_first] = first_with_key.emplace(key, node);
      for (int i = 0; i < node->output_size(); ++i) {
        if (node->output(i).empty()) continue;
        computed_as[node->output(i)] = first->second->output(i);
        if (!is_first) twins.emplace_back(node->output(i), first->second->output(i));
      }
      if (!is_first) {
        context.Count("twins_given_copies");
        continue;
      }
      onnx::NodeProto* run = eval->add_node();
      *run = node->proto();
      for (int i = 0; i < node->input_size(); ++i) {
        const std::string& input = node->input(i);
        if (input.empty()) continue;
        if (auto computed = computed_as.find(input); computed != computed_as.end()) {
          run->set_input(i, computed->second);  // a twin's output is its first's, the one that runs
          continue;
        }
        if (added.count(input) > 0) continue;
        const onnx::TensorProto* init = FoldedOrInitializer(graph, *values, input);
        if (init == nullptr) continue;  // computed in the session
        added.insert(input);
        *eval->add_initializer() = *init;
      }
      for (int i = 0; i < node->output_size(); ++i) {
        if (node->output(i).empty()) continue;
        eval->add_output()->set_name(node->output(i));
        fetch.push_back(node->output(i));
      }
    }
    context.Count("nodes_run_in_onnx_runtime", eval->node_size());
    if (fetch.empty()) return absl::OkStatus();
    SessionSettings settings;
    settings.optimization_level = ORT_DISABLE_ALL;
    settings.intra_op_threads = 1;
    absl::StatusOr<std::string> bytes = SerializeForRuntime(model);
    if (!bytes.ok()) return bytes.status();
    auto session = CreateSession({*std::move(bytes), {}}, settings);
    if (!session.ok()) return session.status();
    std::vector<const char*> names;
    for (const auto& name : fetch) names.push_back(name.c_str());
    try {
      std::vector<Ort::Value> results =
          (*session)->Run(Ort::RunOptions{nullptr}, nullptr, nullptr, 0, names.data(), names.size());
      for (size_t i = 0; i < results.size(); ++i) {
        auto tensor = OrtValueToTensorProto(results[i], fetch[i]);
        if (tensor.ok()) (*values)[fetch[i]] = *std::move(tensor);
      }
      for (const auto& [twin, run] : twins) {
        auto result = values->find(run);
        if (result == values->end()) continue;
        onnx::TensorProto copy = result->second;
        copy.set_name(twin);
        (*values)[twin] = std::move(copy);
      }
    } catch (const Ort::Exception& e) {
      return absl::InternalError(e.what());
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFoldConstantsPass() { return std::make_unique<FoldConstantsPass>(); }

}  // namespace onnxopt
