#include "optimizer/shape_inference.h"

#include <deque>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "onnx/defs/schema.h"
#include "onnx/defs/tensor_proto_util.h"
#include "onnx/shape_inference/implementation.h"
#include "optimizer/contrib_schemas.h"
#include "optimizer/model_io.h"

namespace onnxopt {
namespace {

namespace si = onnx::shape_inference;

// Keyed by views of names in the protos swept, which outlive the sweep.
using DataMap = absl::flat_hash_map<absl::string_view, const onnx::TensorProto*>;
using OnnxShapeData = std::unordered_map<std::string, onnx::TensorShapeProto>;  // what onnx's API takes

// The integer values propagated to node outputs (onnx's data propagation and the symbolic rules), by
// name: a sweep of a 100k-node decoder keeps 40k of them, and onnx's map of heap messages cost a
// sixth of the sweep to fill and free.
using ShapeDataMap = MessagesByName<onnx::TensorShapeProto>;

// Copies of the entries of `data` whose names `wanted` says yes to, in onnx's form.
template <typename Wanted>
void CopyShapeData(const ShapeDataMap& data, OnnxShapeData* out, Wanted&& wanted) {
  out->clear();
  data.ForEach([&](absl::string_view name, const onnx::TensorShapeProto* values) {
    if (wanted(name)) (*out)[std::string(name)] = *values;
  });
}

// What onnx's rules see of one node's inputs. Their values are looked up when a rule asks: most rules
// read only types, and two eager lookups per input were a twentieth of a sweep.
class NodeInputs {
 public:
  NodeInputs(const onnx::NodeProto& node, const DataMap& data, const ShapeDataMap& shape_data)
      : node_(node), data_(data), shape_data_(shape_data) {}

  absl::InlinedVector<const onnx::TypeProto*, 4> types;

  // The constant tensor of input `index`, if it has one small enough to read.
  const onnx::TensorProto* Data(size_t index) const {
    auto it = data_.find(node_.input(static_cast<int>(index)));
    return it != data_.end() ? it->second : nullptr;
  }
  // The integer values propagated to input `index`, if any.
  const onnx::TensorShapeProto* ShapeData(size_t index) const {
    return shape_data_.Find(node_.input(static_cast<int>(index)));
  }

 private:
  const onnx::NodeProto& node_;
  const DataMap& data_;
  const ShapeDataMap& shape_data_;
};

class NodeInferenceContext final : public onnx::InferenceContext {
 public:
  // The output types are made on `types`' arena: those the sweep keeps go into the map as they are.
  NodeInferenceContext(const onnx::NodeProto& node, const NodeInputs& inputs, TypeMap& types,
                       si::GraphInferenceContext* graph_context)
      : node_(node), inputs_(inputs), graph_context_(graph_context) {
    for (int i = 0; i < node.output_size(); ++i) outputs_.push_back(types.New());
  }

  const onnx::AttributeProto* getAttribute(const std::string& name) const override { return FindAttribute(node_, name); }
  size_t getNumInputs() const override { return inputs_.types.size(); }
  const onnx::TypeProto* getInputType(size_t index) const override {
    CheckInput(index);
    return inputs_.types[index];
  }
  const onnx::TensorProto* getInputData(size_t index) const override {
    CheckInput(index);
    return inputs_.Data(index);
  }
  const onnx::TensorShapeProto* getSymbolicInput(size_t index) const override {
    CheckInput(index);
    return inputs_.ShapeData(index);
  }
  const onnx::SparseTensorProto* getInputSparseData(size_t) const override { return nullptr; }
  size_t getNumOutputs() const override { return outputs_.size(); }
  onnx::TypeProto* getOutputType(size_t index) override {
    if (index >= outputs_.size()) fail_type_inference("output ", index, " is out of bounds");
    return outputs_[index];
  }
  onnx::GraphInferencer* getGraphAttributeInferencer(const std::string& name) override {
    const onnx::AttributeProto* attribute = FindAttribute(node_, name);
    if (graph_context_ == nullptr || attribute == nullptr || !attribute->has_g()) {
      fail_type_inference("attribute ", name, " holds no graph");
    }
    // onnx's graph inferencer writes value_info into the graph: it gets a copy.
    onnx::GraphProto& graph = graphs_.emplace_back(attribute->g());
    inferencers_.push_back(std::make_unique<si::GraphInferencerImpl>(graph, *graph_context_));
    return inferencers_.back().get();
  }

  const std::vector<onnx::TypeProto*>& outputs() const { return outputs_; }

 private:
  void CheckInput(size_t index) const {
    if (index >= inputs_.types.size()) fail_type_inference("input ", index, " is out of bounds");
  }

  const onnx::NodeProto& node_;
  const NodeInputs& inputs_;
  std::vector<onnx::TypeProto*> outputs_;
  si::GraphInferenceContext* graph_context_;
  std::list<onnx::GraphProto> graphs_;  // a list: a deque allocates when made, and few nodes have graphs
  std::vector<std::unique_ptr<onnx::GraphInferencer>> inferencers_;
};

class NodePropagationContext final : public onnx::DataPropagationContext {
 public:
  NodePropagationContext(const onnx::NodeProto& node, const NodeInputs& inputs, const std::vector<onnx::TypeProto*>& outputs)
      : node_(node), inputs_(inputs), output_types_(outputs), output_data_(outputs.size()) {}

  const onnx::AttributeProto* getAttribute(const std::string& name) const override { return FindAttribute(node_, name); }
  size_t getNumInputs() const override { return inputs_.types.size(); }
  const onnx::TypeProto* getInputType(size_t index) const override {
    if (index >= inputs_.types.size()) fail_shape_inference("input ", index, " is out of bounds");
    return inputs_.types[index];
  }
  size_t getNumOutputs() const override { return output_types_.size(); }
  const onnx::TypeProto* getOutputType(size_t index) const override {
    if (index >= output_types_.size()) fail_shape_inference("output ", index, " is out of bounds");
    return output_types_[index];
  }
  const onnx::TensorShapeProto* getInputData(size_t index) override {
    if (index >= inputs_.types.size()) fail_shape_inference("input ", index, " is out of bounds");
    if (const onnx::TensorShapeProto* data = inputs_.ShapeData(index)) return data;
    const onnx::TensorProto* tensor = inputs_.Data(index);
    if (tensor == nullptr || tensor->dims_size() > 1) return nullptr;
    onnx::TensorShapeProto& converted = converted_.emplace_back();
    if (tensor->data_type() == onnx::TensorProto::INT64) {
      for (int64_t v : onnx::ParseData<int64_t>(tensor)) converted.add_dim()->set_dim_value(v);
    } else if (tensor->data_type() == onnx::TensorProto::INT32) {
      for (int32_t v : onnx::ParseData<int32_t>(tensor)) converted.add_dim()->set_dim_value(v);
    } else {
      return nullptr;
    }
    return &converted;
  }
  void addOutputData(size_t index, onnx::TensorShapeProto&& data) override {
    if (index >= output_data_.size()) fail_shape_inference("output ", index, " is out of bounds");
    output_data_[index] = std::move(data);
    has_output_data_ = true;
  }

  bool has_output_data() const { return has_output_data_; }
  std::vector<onnx::TensorShapeProto>& output_data() { return output_data_; }

 private:
  const onnx::NodeProto& node_;
  const NodeInputs& inputs_;
  const std::vector<onnx::TypeProto*>& output_types_;
  std::vector<onnx::TensorShapeProto> output_data_;
  std::list<onnx::TensorShapeProto> converted_;  // a list, which allocates nothing until used
  bool has_output_data_ = false;
};

// Where a tracked value (symbolic_shapes) knows an element, it wins over onnx's propagated one.
void MergeShapeData(const onnx::TensorShapeProto& tracked, onnx::TensorShapeProto* data) {
  if (data->dim_size() != tracked.dim_size()) {
    *data = tracked;
    return;
  }
  for (int i = 0; i < tracked.dim_size(); ++i) {
    const auto& d = tracked.dim(i);
    if (d.has_dim_value() || d.has_dim_param()) *data->mutable_dim(i) = d;
  }
}

// Whether `node` holds a subgraph (If, Loop, Scan).
bool HasSubgraph(const onnx::NodeProto& node) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.has_g() || attribute.graphs_size() > 0) return true;
  }
  return false;
}

bool HasAttribute(const onnx::NodeProto& node, absl::string_view name) { return FindAttribute(node, name) != nullptr; }

// The operator whose opset-17 rule gives the shapes of `node`, a default-domain node of a later opset
// (18 to kLastAdaptedOpset); nullptr where its operator changed them. Versions 18 to 24 mostly widened
// types (bfloat16, float8, int4), which the rules do not check; what changed shapes:
// - the Reduce operators took their axes as an input at 18, as ReduceSum did at 13: ReduceSum's rule;
// - Split's num_outputs (18): Split-13 splits evenly by the outputs and fails on an uneven split;
// - Pad's axes input (18), Resize's axes and keep_aspect_ratio_policy (18), AveragePool's (19) and
//   LpPool's (18) dilations and LpPool's ceil_mode: the old rule only without them;
// - DFT (20, dft_length and axis as inputs) and GridSample (20, N-D): none.
// Nodes with subgraphs get none either: onnx would infer their bodies with its own latest versions.
const std::string* AdaptedRule(const onnx::NodeProto& node) {
  static const std::string* const kReduceSum = new std::string("ReduceSum");
  const absl::string_view op = node.op_type();
  if (HasSubgraph(node) || op == "DFT" || op == "GridSample") return nullptr;
  if (op == "ReduceL1" || op == "ReduceL2" || op == "ReduceLogSum" || op == "ReduceLogSumExp" || op == "ReduceMax" ||
      op == "ReduceMean" || op == "ReduceMin" || op == "ReduceProd" || op == "ReduceSumSquare") {
    return kReduceSum;
  }
  if (op == "Pad" && node.input_size() >= 4 && !node.input(3).empty()) return nullptr;
  if (op == "Resize" && (HasAttribute(node, "axes") || HasAttribute(node, "keep_aspect_ratio_policy"))) return nullptr;
  if ((op == "AveragePool" || op == "LpPool") && HasAttribute(node, "dilations")) return nullptr;
  if (op == "LpPool" && HasAttribute(node, "ceil_mode")) return nullptr;
  return &node.op_type();
}

// Every declared dim named in `aliases` as its sum.
void RenameDims(const DimAliases& aliases, TypeMap* types) {
  types->ForEach([&](absl::string_view, onnx::TypeProto* type) {
    if (!type->has_tensor_type() || !type->tensor_type().has_shape()) return;
    for (auto& dim : *type->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
      if (!dim.has_dim_param()) continue;
      // Through a chain (total named a sum, one of whose names another sweep found a name for).
      for (int step = 0; step < 8; ++step) {
        auto alias = aliases.find(dim.dim_param());
        if (alias == aliases.end()) break;
        dim.set_dim_param(alias->second);
      }
    }
  });
}

class Sweep {
 public:
  // `with_schemas` false: only the rules of symbolic_shapes.h run (a model of an opset onnx 1.12 does
  // not know, whose schemas may have changed since).
  Sweep(const onnx::ModelProto& model, const onnx::GraphProto& graph, const std::vector<const onnx::NodeProto*>& nodes,
        bool with_schemas = true)
      : model_(model), graph_(graph), nodes_(nodes), with_schemas_(with_schemas), symbolic_(DefaultOpset(model)) {
    for (const auto& import : model.opset_import()) {
      opsets_[import.domain() == "ai.onnx" ? "" : import.domain()] = static_cast<int>(import.version());
    }
    for (const auto& function : model.functions()) {
      functions_[function.domain() + ":" + function.name()] = &function;
    }
    for (const auto& output : graph.output()) graph_outputs_.insert(output.name());
  }

  // A sweep of the whole graph from what it declares, its dims named in `aliases` read as their sums.
  InferredTypes Run(const DimAliases& aliases) {
    result_.types = DeclaredTypes(graph_);
    result_.aliases = aliases;
    DimAliases renames = aliases;
    // An input's dim named as onnx names the dims it cannot work out (`unk__N`, as tf2onnx declares the
    // batch) is a symbol of the model's, which the rules read as unknown: renamed, it is one size wherever
    // the shapes carry it.
    for (const auto& input : graph_.input()) {
      if (!input.type().tensor_type().has_shape()) continue;
      for (const auto& dim : input.type().tensor_type().shape().dim()) {
        if (dim.dim_param().rfind("unk__", 0) == 0) renames.emplace(dim.dim_param(), "input:" + dim.dim_param());
      }
    }
    if (!renames.empty()) RenameDims(renames, &result_.types);
    for (const auto& tensor : graph_.initializer()) TrackInitializer(tensor);
    return SweepNodes();
  }

  // What an earlier sweep found, extended with `nodes` (new ones, whose inputs it types). Only the
  // initializers they read are tracked: tracking every one cost more than typing a few nodes.
  InferredTypes Extend(InferredTypes* from, const Graph& graph) {
    result_ = std::move(*from);
    for (const onnx::NodeProto* node : nodes_) {
      for (const std::string& input : node->input()) {
        const onnx::TensorProto* tensor = input.empty() ? nullptr : graph.Initializer(input);
        if (tensor != nullptr && data_.count(input) == 0) TrackInitializer(*tensor);
      }
    }
    return SweepNodes();
  }

 private:
  void TrackInitializer(const onnx::TensorProto& tensor) {
    if (ReadAsData(tensor)) {
      data_[tensor.name()] = &tensor;
      symbolic_.TrackConstant(tensor.name(), tensor);
    }
  }

  InferredTypes SweepNodes() {
    EnsureContribSchemas();
    for (const onnx::NodeProto* node : nodes_) {
      if (with_schemas_) InferNode(*node);
      try {
        symbolic_.Apply(*node, &result_.types);
        PublishTrackedValue(*node);
      } catch (const std::exception&) {
        // A rule that cannot apply leaves the node's outputs as onnx's rule left them.
      }
    }
    symbolic_.AddKnown(&result_.known);
    for (const auto& [name, sum] : symbolic_.learned_aliases()) result_.aliases.emplace(name, sum);
    return std::move(result_);
  }

  // onnx's rule for `node`: its outputs' types merged into what is declared, and the values its
  // data-propagation rule works out.
  void InferNode(const onnx::NodeProto& node) {
    if (absl::string_view(node.op_type()) == "Constant" && node.output_size() == 1) {
      const onnx::AttributeProto* value = FindAttribute(node, "value");
      if (value != nullptr && value->has_t()) data_[node.output(0)] = &value->t();
    }
    const std::string& domain = node.domain() == "ai.onnx" ? kDefaultDomain : node.domain();
    auto opset = opsets_.find(domain);
    if (opset == opsets_.end()) return;
    const bool adapted = domain.empty() && opset->second > kLastKnownOpset;
    const std::string* rule = adapted ? AdaptedRule(node) : &node.op_type();
    if (rule == nullptr) return;
    const onnx::OpSchema* schema = SchemaOf(*rule, adapted ? kLastKnownOpset : opset->second, domain);
    const onnx::FunctionProto* function = nullptr;
    if (schema == nullptr || (!schema->has_type_and_shape_inference_function() && schema->HasFunction())) {
      function = schema != nullptr ? schema->GetFunction() : FindFunction(node);
      if (function == nullptr) return;
    }
    NodeInputs inputs(node, data_, shape_data_);
    bool all_typed = true;
    for (const std::string& input : node.input()) {
      const onnx::TypeProto* type = result_.types.Find(input);
      inputs.types.push_back(type);
      all_typed &= input.empty() || type != nullptr;
    }
    std::unique_ptr<si::GraphInferenceContext> graph_context = MaybeGraphContext(node);
    NodeInferenceContext context(node, inputs, result_.types, graph_context.get());
    try {
      if (function != nullptr) {
        std::unordered_map<std::string, int> function_opsets;
        for (const auto& import : function->opset_import()) function_opsets[import.domain()] = import.version();
        si::InferShapeForFunctionNode(*function, function_opsets, onnx::OpSchemaRegistry::Instance(), context,
                                      // no data propagation inside: it cannot be kept off untyped values
                                      // there, and onnx 1.12's Shape-15 rule dereferences them
                                      onnx::ShapeInferenceOptions(false, 0, false), functions_, nullptr,
                                      &FunctionShapeData(*function));
      } else if (schema->has_type_and_shape_inference_function()) {
        schema->GetTypeAndShapeInferenceFunction()(context);
      }
      for (int i = 0; i < node.output_size(); ++i) {
        onnx::TypeProto* inferred = context.outputs()[static_cast<size_t>(i)];
        if (node.output(i).empty() || inferred->value_case() == onnx::TypeProto::VALUE_NOT_SET) continue;
        if (onnx::TypeProto* existing = result_.types.AddNewOrFind(node.output(i), inferred)) {
          if (graph_outputs_.contains(node.output(i))) NoteDeclaredDims(*existing, *inferred);
          si::mergeShapesAndTypes(*inferred, existing);
        }
      }
      if (schema == nullptr || !schema->has_data_propagation_function() || !all_typed) return;
      NodePropagationContext propagation(node, inputs, context.outputs());
      schema->GetDataPropagationFunction()(propagation);
      if (!propagation.has_output_data()) return;
      for (int i = 0; i < node.output_size(); ++i) {
        auto& data = propagation.output_data()[static_cast<size_t>(i)];
        if (!node.output(i).empty() && data.dim_size() > 0) *shape_data_.GetOrAdd(node.output(i)) = data;
      }
    } catch (const std::exception&) {
      // The node's outputs keep what is declared (and whatever merged before the failure).
    }
  }

  // A graph output's declared dims that name what its rule computes (SymbolicShapes::NoteDeclaredDim).
  void NoteDeclaredDims(const onnx::TypeProto& declared, const onnx::TypeProto& inferred) {
    if (!declared.tensor_type().has_shape() || !inferred.tensor_type().has_shape()) return;
    const auto& named = declared.tensor_type().shape();
    const auto& computed = inferred.tensor_type().shape();
    if (named.dim_size() != computed.dim_size()) return;
    for (int d = 0; d < named.dim_size(); ++d) symbolic_.NoteDeclaredDim(named.dim(d), computed.dim(d));
  }

  // What the symbolic rules know of the node's first output becomes data-propagation input for
  // onnx's rules downstream (Reshape, Expand, ConstantOfShape read their shape input through it).
  void PublishTrackedValue(const onnx::NodeProto& node) {
    if (node.output_size() < 1 || node.output(0).empty()) return;
    onnx::TensorShapeProto tracked;
    if (!symbolic_.ShapeData(node.output(0), &tracked)) return;
    MergeShapeData(tracked, shape_data_.GetOrAdd(node.output(0)));
  }

  // onnx's registry, remembered per default-domain op type: a sweep asks for a few dozen schemas
  // hundreds of thousands of times, and the registry's nested maps hash each name again.
  const onnx::OpSchema* SchemaOf(const std::string& op_type, int opset, const std::string& domain) {
    if (!domain.empty()) return onnx::OpSchemaRegistry::Schema(op_type, opset, domain);
    auto it = default_domain_schemas_.find(op_type);
    if (it == default_domain_schemas_.end()) {
      it = default_domain_schemas_.emplace(op_type, onnx::OpSchemaRegistry::Schema(op_type, opset, domain)).first;
    }
    return it->second;
  }

  // The shape data onnx's inference of a function body could read: that of the names the body uses
  // (it reads by the body's own names, which only an outer value of the same name can match).
  OnnxShapeData& FunctionShapeData(const onnx::FunctionProto& function) {
    absl::flat_hash_set<absl::string_view> names(function.input().begin(), function.input().end());
    for (const auto& inner : function.node()) {
      names.insert(inner.input().begin(), inner.input().end());
      names.insert(inner.output().begin(), inner.output().end());
    }
    CopyShapeData(shape_data_, &function_shape_data_, [&](absl::string_view name) { return names.contains(name); });
    return function_shape_data_;
  }

  const onnx::FunctionProto* FindFunction(const onnx::NodeProto& node) const {
    auto it = functions_.find(node.domain() + ":" + node.op_type());
    return it == functions_.end() ? nullptr : it->second;
  }

  // If, Loop and Scan infer their bodies with onnx's graph inferencer, which sees the outer scope.
  std::unique_ptr<si::GraphInferenceContext> MaybeGraphContext(const onnx::NodeProto& node) {
    bool has_graph = false;
    for (const auto& attribute : node.attribute()) has_graph |= attribute.has_g();
    if (!has_graph) return nullptr;
    outer_types_.clear();
    CopyShapeData(shape_data_, &outer_shape_data_, [](absl::string_view) { return true; });
    result_.types.ForEach(
        [&](absl::string_view name, onnx::TypeProto* type) { outer_types_[std::string(name)] = type; });
    return std::make_unique<si::GraphInferenceContext>(outer_types_, opsets_, nullptr, functions_,
                                                       onnx::OpSchemaRegistry::Instance(), &outer_shape_data_,
                                                       static_cast<int>(model_.ir_version()));
  }

  static inline const std::string kDefaultDomain;

  const onnx::ModelProto& model_;
  const onnx::GraphProto& graph_;
  const std::vector<const onnx::NodeProto*>& nodes_;
  const bool with_schemas_;
  std::unordered_map<std::string, int> opsets_;
  absl::flat_hash_map<std::string, const onnx::OpSchema*> default_domain_schemas_;
  si::ModelLocalFunctionsMap functions_;
  absl::flat_hash_set<std::string> graph_outputs_;
  SymbolicShapes symbolic_;
  InferredTypes result_;
  DataMap data_;               // constant inputs onnx's rules read
  ShapeDataMap shape_data_;    // propagated integer values
  OnnxShapeData outer_shape_data_;     // for subgraph inference
  OnnxShapeData function_shape_data_;  // for function bodies
  std::unordered_map<std::string, onnx::TypeProto*> outer_types_;           // for subgraph inference
};

// An initializer's type is its tensor's, whatever was declared or inferred for the name before.
void SetInitializerType(const onnx::TensorProto& tensor, TypeMap* types) {
  onnx::TypeProto* type = types->GetOrAdd(tensor.name());
  type->Clear();
  type->mutable_tensor_type()->set_elem_type(tensor.data_type());
  auto* shape = type->mutable_tensor_type()->mutable_shape();
  for (int64_t dim : tensor.dims()) shape->add_dim()->set_dim_value(dim);
}

}  // namespace

bool ReadAsData(const onnx::TensorProto& tensor) {
  // Bigger tensors are weights, never shape tensors: rules see only their type.
  constexpr size_t kDataTensorBytes = 4096;
  return tensor.data_location() != onnx::TensorProto::EXTERNAL && tensor.ByteSizeLong() <= kDataTensorBytes;
}

TypeMap DeclaredTypes(const onnx::GraphProto& graph) {
  TypeMap types;
  for (const auto& tensor : graph.initializer()) SetInitializerType(tensor, &types);
  for (const auto* values : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const auto& value : *values) {
      if (value.has_type()) types.AddIfAbsent(value.name(), value.type());
    }
  }
  return types;
}

namespace {

// The main graph's nodes of `model`, in their order.
std::vector<const onnx::NodeProto*> MainGraphNodes(const onnx::ModelProto& model) {
  std::vector<const onnx::NodeProto*> nodes;
  nodes.reserve(static_cast<size_t>(model.graph().node_size()));
  for (const auto& node : model.graph().node()) nodes.push_back(&node);
  return nodes;
}

}  // namespace

// A sweep from `aliases`, and a second one where the first learned more of them.
template <typename MakeSweep>
InferredTypes RunWithAliases(MakeSweep make_sweep, const DimAliases& aliases) {
  InferredTypes inferred = make_sweep().Run(aliases);
  if (inferred.aliases.size() == aliases.size()) return inferred;
  const DimAliases learned = std::move(inferred.aliases);
  return make_sweep().Run(learned);
}

InferredTypes InferGraphTypes(const onnx::ModelProto& model, const DimAliases& aliases) {
  const std::vector<const onnx::NodeProto*> nodes = MainGraphNodes(model);
  return RunWithAliases([&] { return Sweep(model, model.graph(), nodes); }, aliases);
}

namespace {

// The protos a sweep of held nodes reads, in their order. If/Loop/Scan: onnx infers their bodies,
// whose nodes the Graph holds, so those nodes go as copies with their bodies (kept in `with_bodies`).
template <typename Nodes>
std::vector<const onnx::NodeProto*> SweptProtos(const Nodes& held, std::deque<onnx::NodeProto>* with_bodies) {
  std::vector<const onnx::NodeProto*> nodes;
  nodes.reserve(held.size());
  for (const Node* node : held) {
    nodes.push_back(node->subgraphs().empty() ? &node->proto() : &with_bodies->emplace_back(node->ProtoWithBodies()));
  }
  return nodes;
}

}  // namespace

InferredTypes ExtendGraphTypes(const onnx::ModelProto& model, const Graph& graph, const std::vector<const Node*>& added,
                               const std::vector<std::string>& added_initializers, InferredTypes inferred) {
  for (const std::string& name : added_initializers) {
    if (const onnx::TensorProto* tensor = graph.Initializer(name)) SetInitializerType(*tensor, &inferred.types);
  }
  if (added.empty()) return inferred;
  std::deque<onnx::NodeProto> with_bodies;
  const std::vector<const onnx::NodeProto*> nodes = SweptProtos(added, &with_bodies);
  return Sweep(model, graph.proto(), nodes).Extend(&inferred, graph);
}

InferredTypes InferGraphTypes(const onnx::ModelProto& model, const Graph& graph, const DimAliases& aliases) {
  std::deque<onnx::NodeProto> with_bodies;
  const std::vector<const onnx::NodeProto*> nodes = SweptProtos(graph.Nodes(), &with_bodies);
  return RunWithAliases([&] { return Sweep(model, graph.proto(), nodes); }, aliases);
}

InferredTypes TrackShapeArithmetic(const onnx::ModelProto& model, const DimAliases& aliases) {
  const std::vector<const onnx::NodeProto*> nodes = MainGraphNodes(model);
  return RunWithAliases([&] { return Sweep(model, model.graph(), nodes, /*with_schemas=*/false); }, aliases);
}

InferredTypes TrackShapeArithmetic(const onnx::ModelProto& model, const Graph& graph, const DimAliases& aliases) {
  std::deque<onnx::NodeProto> with_bodies;
  const std::vector<const onnx::NodeProto*> nodes = SweptProtos(graph.Nodes(), &with_bodies);
  return RunWithAliases([&] { return Sweep(model, graph.proto(), nodes, /*with_schemas=*/false); }, aliases);
}

}  // namespace onnxopt
