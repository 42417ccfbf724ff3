// convert_float_precision: float32 -> float16 or bfloat16 for every node that may compute in it
// (ONNX Runtime's float16 converter, with the bookkeeping done per edge).
//
// Before:  x:f32 -> MatMul(W:f32) -> TopK -> y:f32
// After:   x:f32 -> Cast(f16) -> MatMul(W:f16) -> Cast(f32) -> TopK -> y:f32
//          (TopK is in the default block list; graph inputs and outputs keep float32)
//
// A node stays in float32 when its op type is in the block list (ONNX Runtime's default list plus
// op_block_list), its name is in node_block_list, it owns subgraphs (the bodies are converted on
// their own, their interfaces staying float32), it is of a custom domain, or a value it touches has
// an unknown type. Each float32 value is then produced in one precision; readers of the other get one
// shared Cast. A converted value that also has float32 readers (blocked nodes, subgraphs, graph
// outputs) keeps its name for them through the Cast, so subgraphs and the model's interface never
// need renaming. Initializers are converted (clamped into float16's range, counted) when a converted
// node reads them, and kept as well when a float32 node does. Casts made redundant (a converted
// Cast to float16 of a float16 value) are removed.
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "onnx/defs/schema.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

using onnx::TensorProto;

// ONNX Runtime's DEFAULT_OP_BLOCK_LIST (transformers/float16.py): operators without float16 kernels
// or that need float32's range.
const char kDefaultOpBlockList[] =
    "ArrayFeatureExtractor,Binarizer,CastMap,CategoryMapper,DictVectorizer,FeatureVectorizer,Imputer,"
    "LabelEncoder,LinearClassifier,LinearRegressor,Normalizer,OneHotEncoder,RandomUniformLike,SVMClassifier,"
    "SVMRegressor,Scaler,TreeEnsembleClassifier,TreeEnsembleRegressor,ZipMap,NonMaxSuppression,TopK,RoiAlign,"
    "Range,CumSum,Min,Max,Upsample";

// Inputs that stay float32 even in a converted node (their type is float-only in the schema).
bool AlwaysFloatInput(const Node& node, int index) {
  if (node.op_type() == "Resize") return index == 1 || index == 2;
  if (node.op_type() == "GroupNorm") return index == 1 || index == 2;
  return false;
}

struct Settings {
  int32_t to = TensorProto::FLOAT16;
  bool keep_io_types = true;
  std::set<std::string> op_block_list;
  std::set<std::string> node_block_list;
};

class Converter {
 public:
  // `shapes`: the main graph's, when converting it; null for a subgraph.
  Converter(Graph& graph, const Settings& settings, PassContext& context, const ShapeInfo* shapes,
            const std::unordered_map<std::string, int32_t>& outer_types)
      : graph_(graph), settings_(settings), context_(context), main_graph_(shapes != nullptr) {
    types_ = outer_types;
    for (const auto& [name, type] : InferElementTypes(graph, shapes)) {
      types_[name] = type;
    }
  }

  void Run() {
    const std::vector<Node*> nodes = graph_.Nodes();
    for (Node* node : nodes) Decide(*node);
    for (Node* node : nodes) {
      for (const auto& subgraph : node->subgraphs()) {
        Converter inner(*subgraph, settings_, context_, /*shapes=*/nullptr, types_);
        inner.Run();
      }
    }
    if (main_graph_ && !settings_.keep_io_types) RetypeInterface();
    std::set<std::string> values;  // float32 values this graph defines, in a stable order
    for (const auto& input : graph_.proto().input()) values.insert(input.name());
    for (const auto& tensor : graph_.proto().initializer()) values.insert(tensor.name());
    for (Node* node : nodes) {
      for (const auto& output : node->proto().output()) values.insert(output);
    }
    for (const std::string& value : values) {
      if (!value.empty() && IsFloat32(value)) Place(value);
    }
    for (Node* node : nodes) {
      if (low_.count(node) > 0) RetypeAttributes(*node);
    }
    RemoveRedundantCasts();
    RetypeValueInfo();
  }

 private:
  bool IsFloat32(const std::string& value) const {
    auto it = types_.find(value);
    return it != types_.end() && it->second == TensorProto::FLOAT;
  }

  void Decide(Node& node) {
    bool touches_float = false, unknown = false;
    for (const auto* names : {&node.proto().input(), &node.proto().output()}) {
      for (const auto& name : *names) {
        if (name.empty()) continue;
        auto it = types_.find(name);
        if (it == types_.end()) unknown = true;
        else touches_float |= it->second == TensorProto::FLOAT;
      }
    }
    const std::string op(node.op_type());
    if (!touches_float && !unknown) return;  // nothing to convert either way
    std::string reason;
    if (settings_.op_block_list.count(op) > 0) reason = "op block list";
    else if (settings_.node_block_list.count(NodeKey(node)) > 0) reason = "node block list";
    else if (!node.subgraphs().empty()) reason = "owns subgraphs (converted on their own)";
    else if (!node.domain().empty() && node.domain() != "com.microsoft") reason = "custom domain";
    else if (unknown) reason = "a value's element type is unknown";
    else if (!SchemaAllows(node)) reason = absl::StrCat("its schema has no ", LowName(), " for a float input or output");
    if (reason.empty()) {
      low_.insert(&node);
      context_.Count("converted_nodes");
    } else {
      context_.Skip(absl::StrCat("kept in float32: ", reason));
      context_.Note(absl::StrCat(NodeKey(node), "\t", op, "\t", reason));
    }
  }

  // Whether the operator's ONNX schema (default domain; others are left to ONNX Runtime) lets every
  // float32 input and output take the lower precision: Pow's exponent has no bfloat16, for one.
  bool SchemaAllows(const Node& node) const {
    if (!node.domain().empty()) return true;
    const onnx::OpSchema* schema =
        onnx::OpSchemaRegistry::Schema(std::string(node.op_type()), context_.OpsetVersion(""), "");
    if (schema == nullptr) return true;
    const std::string low_type = settings_.to == TensorProto::FLOAT16 ? "tensor(float16)" : "tensor(bfloat16)";
    auto allowed = [&](const std::vector<onnx::OpSchema::FormalParameter>& formals, int index) {
      if (formals.empty()) return true;
      const auto& formal = formals[std::min<size_t>(index, formals.size() - 1)];  // variadic: the last
      for (const auto& constraint : schema->typeConstraintParams()) {
        if (constraint.type_param_str != formal.GetTypeStr()) continue;
        return std::find(constraint.allowed_type_strs.begin(), constraint.allowed_type_strs.end(), low_type) !=
               constraint.allowed_type_strs.end();
      }
      return formal.GetTypes().count(onnx::Utils::DataTypeUtils::ToType(low_type)) > 0;
    };
    for (int i = 0; i < node.input_size(); ++i) {
      if (!node.input(i).empty() && IsFloat32(node.input(i)) && !AlwaysFloatInput(node, i) && !allowed(schema->inputs(), i)) {
        return false;
      }
    }
    for (int i = 0; i < node.output_size(); ++i) {
      if (!node.output(i).empty() && IsFloat32(node.output(i)) && !allowed(schema->outputs(), i)) return false;
    }
    return true;
  }

  std::string LowName() const { return settings_.to == TensorProto::FLOAT16 ? "float16" : "bfloat16"; }

  // Whether `reader` reads input `index` in the lower precision.
  bool ReadsLow(const Node& reader, int index) const {
    return low_.count(&reader) > 0 && !AlwaysFloatInput(reader, index);
  }

  void RetypeInterface() {
    for (auto* values : {graph_.mutable_proto()->mutable_input(), graph_.mutable_proto()->mutable_output()}) {
      for (auto& value : *values) {
        auto* tensor = value.mutable_type()->mutable_tensor_type();
        if (tensor->elem_type() == TensorProto::FLOAT) tensor->set_elem_type(settings_.to);
      }
    }
  }

  // Makes float32 value `value` available in the precision each reader wants.
  void Place(const std::string& value) {
    Node* producer = graph_.Producer(value);
    const bool initializer = graph_.Initializer(value) != nullptr && !graph_.IsGraphInput(value);
    const bool interface_low = main_graph_ && !settings_.keep_io_types;
    bool produced_low = producer != nullptr ? low_.count(producer) > 0 : (graph_.IsGraphInput(value) && interface_low);
    std::vector<std::pair<Node*, int>> low_readers, float_readers;
    bool implicit_reader = false;
    for (Node* reader : graph_.Consumers(value)) {
      bool explicit_read = false;
      for (int i = 0; i < reader->input_size(); ++i) {
        if (reader->input(i) != value) continue;
        explicit_read = true;
        (ReadsLow(*reader, i) ? low_readers : float_readers).push_back({reader, i});
      }
      implicit_reader |= !explicit_read || reader->implicit_inputs().count(value) > 0;
    }
    const bool output_reader = graph_.IsGraphOutput(value);
    const bool needs_float = !float_readers.empty() || implicit_reader || (output_reader && !interface_low);
    const bool needs_low = !low_readers.empty() || (output_reader && interface_low);

    if (initializer) {
      if (!needs_low) return;
      onnx::TensorProto converted =
          ConvertFloatTensor(*graph_.Initializer(value), settings_.to, &clamped_);
      context_.Count("clamped_weights", clamped_);
      clamped_ = 0;
      if (!needs_float) {
        // Same name, new type: every reader converts.
        converted.set_name(value);
        graph_.ReplaceInitializer(std::move(converted));
        low_values_.insert(value);  // its value_info, if any, changes type too
        context_.Count("converted_initializers");
        return;
      }
      const std::string low_name = graph_.UniqueName(absl::StrCat(value, LowSuffix()));
      converted.set_name(low_name);
      graph_.AddInitializer(std::move(converted));
      for (auto [reader, index] : low_readers) graph_.SetInput(reader, index, low_name);
      context_.Count("duplicated_initializers");
      return;
    }
    if (produced_low) {
      low_values_.insert(value);
      if (!needs_float) return;
      if (producer == nullptr) {  // a float16 graph input (keep_io_types off) read by float32 nodes
        const std::string float_name = graph_.UniqueName(absl::StrCat(value, "_fp32"));
        AddCastNode(value, float_name, TensorProto::FLOAT, float_readers.front().first);
        for (auto [reader, index] : float_readers) graph_.SetInput(reader, index, float_name);
        return;
      }
      // The converted value is renamed; `value` stays float32 for its float32 readers.
      const std::string low_name = graph_.UniqueName(absl::StrCat(value, LowSuffix()));
      low_values_.erase(value);
      low_values_.insert(low_name);
      RenameOutput(producer, value, low_name);
      for (auto [reader, index] : low_readers) graph_.SetInput(reader, index, low_name);
      AddCastNode(low_name, value, TensorProto::FLOAT, producer);
      return;
    }
    if (!needs_low) return;
    if (output_reader && interface_low && producer != nullptr) {
      // A float16 graph output made by a float32 node: the output's name goes to the Cast.
      const std::string float_name = graph_.UniqueName(absl::StrCat(value, "_fp32"));
      RenameOutput(producer, value, float_name);
      for (auto [reader, index] : float_readers) graph_.SetInput(reader, index, float_name);
      AddCastNode(float_name, value, settings_.to, producer);
      low_values_.insert(value);
      for (auto [reader, index] : low_readers) graph_.SetInput(reader, index, value);
      return;
    }
    const std::string low_name = graph_.UniqueName(absl::StrCat(value, LowSuffix()));
    AddCastNode(value, low_name, settings_.to, producer != nullptr ? producer : low_readers.front().first);
    low_values_.insert(low_name);
    for (auto [reader, index] : low_readers) graph_.SetInput(reader, index, low_name);
  }

  void RenameOutput(Node* producer, const std::string& from, const std::string& to) {
    for (int i = 0; i < producer->output_size(); ++i) {
      if (producer->output(i) == from) graph_.SetOutput(producer, i, to);
    }
  }

  void AddCastNode(const std::string& from, const std::string& to_name, int32_t to, const Node* anchor) {
    onnx::NodeProto cast = MakeNode("Cast", graph_.UniqueName(absl::StrCat(to_name, "_cast")), {from}, {to_name});
    *cast.add_attribute() = MakeIntAttribute("to", to);
    const bool after = anchor != nullptr && graph_.Producer(from) == anchor;
    graph_.AddNode(std::move(cast), anchor, after);
    context_.Count("casts_added");
  }

  // Attributes that name float32 in a converted node: Cast's target, constants' values, dtypes.
  void RetypeAttributes(Node& node) {
    onnx::NodeProto proto = node.proto();
    bool changed = false;
    for (auto& attribute : *proto.mutable_attribute()) {
      if ((attribute.name() == "to" && node.op_type() == "Cast") || attribute.name() == "dtype") {
        if (attribute.i() == TensorProto::FLOAT) {
          attribute.set_i(settings_.to);
          changed = true;
        }
      } else if (attribute.name() == "value" && attribute.has_t() && attribute.t().data_type() == TensorProto::FLOAT) {
        *attribute.mutable_t() = ConvertFloatTensor(attribute.t(), settings_.to, &clamped_);
        changed = true;
      }
    }
    if (node.op_type() == "ConstantOfShape" && node.FindAttribute("value") == nullptr) {
      onnx::AttributeProto* value = proto.add_attribute();
      value->set_name("value");
      value->set_type(onnx::AttributeProto::TENSOR);
      onnx::TensorProto zero;
      zero.set_data_type(TensorProto::FLOAT);
      zero.add_dims(1);
      zero.add_float_data(0.0f);
      *value->mutable_t() = ConvertFloatTensor(zero, settings_.to, &clamped_);
      changed = true;
    }
    context_.Count("clamped_weights", clamped_);
    clamped_ = 0;
    if (!changed) return;
    // Replace the node by its retyped copy at the same place.
    Node* copy = graph_.AddNode(std::move(proto), &node, /*after=*/true);
    graph_.RemoveNode(&node);
    low_.erase(&node);
    low_.insert(copy);
  }

  // A converted Cast to the lower precision of a value already in it does nothing.
  void RemoveRedundantCasts() {
    for (Node* node : graph_.Nodes()) {
      if (node->op_type() != "Cast" || !node->domain().empty() || low_.count(node) == 0) continue;
      if (node->GetAttributeInt("to", 0) != settings_.to || low_values_.count(node->input(0)) == 0) continue;
      if (graph_.IsGraphOutput(node->output(0))) continue;
      graph_.ReplaceAllUsesWith(node->output(0), node->input(0));
      low_values_.erase(node->output(0));
      graph_.RemoveNode(node);
      context_.Count("casts_removed");
    }
  }

  void RetypeValueInfo() {
    for (auto& info : *graph_.mutable_proto()->mutable_value_info()) {
      if (low_values_.count(info.name()) == 0) continue;
      auto* tensor = info.mutable_type()->mutable_tensor_type();
      if (tensor->elem_type() == TensorProto::FLOAT) tensor->set_elem_type(settings_.to);
    }
  }

  std::string LowSuffix() const { return settings_.to == TensorProto::FLOAT16 ? "_fp16" : "_bf16"; }

  Graph& graph_;
  const Settings& settings_;
  PassContext& context_;
  const bool main_graph_;
  std::unordered_map<std::string, int32_t> types_;
  std::unordered_set<const Node*> low_;
  std::unordered_set<std::string> low_values_;
  int64_t clamped_ = 0;
};

class ConvertFloatPrecisionPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "convert_float_precision"; }
  absl::string_view description() const override {
    return "Convert float32 computation to float16 or bfloat16, keeping blocked ops, listed nodes and "
           "(by default) the model's inputs and outputs in float32";
  }
  std::vector<ParamSpec> params() const override {
    return {{"to", ParamType::kString, "fp16", "fp16 or bf16"},
            {"keep_io_types", ParamType::kBool, "true", "graph inputs and outputs stay float32"},
            {"op_block_list", ParamType::kString, "",
             absl::StrCat("comma-separated op types kept in float32, on top of the default list: ", kDefaultOpBlockList)},
            {"node_block_list", ParamType::kString, "",
             "comma-separated node names (or first outputs of unnamed nodes) kept in float32"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    const std::string& to = params.GetString("to");
    if (to != "fp16" && to != "bf16") {
      return absl::InvalidArgumentError(absl::StrCat("to: '", to, "' is not fp16 or bf16"));
    }
    return absl::OkStatus();
  }
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    // The main graph's run converts the subgraphs with it (they need the outer values' types).
    if (&graph.proto() != &context.model().graph()) return absl::OkStatus();
    Settings settings;
    settings.to = context.params().GetString("to") == "bf16" ? TensorProto::BFLOAT16 : TensorProto::FLOAT16;
    settings.keep_io_types = context.params().GetBool("keep_io_types");
    settings.op_block_list = SplitNameList(kDefaultOpBlockList);
    for (const auto& op : SplitNameList(context.params().GetString("op_block_list"))) settings.op_block_list.insert(op);
    settings.node_block_list = SplitNameList(context.params().GetString("node_block_list"));
    Converter converter(graph, settings, context, &shapes, {});
    converter.Run();
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeConvertFloatPrecisionPass() { return std::make_unique<ConvertFloatPrecisionPass>(); }

}  // namespace onnxopt
