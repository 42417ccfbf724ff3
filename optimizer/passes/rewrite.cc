#include "optimizer/passes/rewrite.h"

#include "absl/strings/str_cat.h"

#include "optimizer/passes/constants.h"

namespace onnxopt {

onnx::AttributeProto MakeIntAttribute(const std::string& name, int64_t value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INT);
  attribute.set_i(value);
  return attribute;
}

onnx::AttributeProto MakeIntsAttribute(const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INTS);
  for (int64_t value : values) attribute.add_ints(value);
  return attribute;
}

onnx::AttributeProto MakeFloatAttribute(const std::string& name, float value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::FLOAT);
  attribute.set_f(value);
  return attribute;
}

onnx::NodeProto MakeNode(const std::string& op, const std::string& name, std::vector<std::string> inputs,
                         std::vector<std::string> outputs, const std::string& domain) {
  onnx::NodeProto node;
  node.set_op_type(op);
  node.set_name(name);
  if (!domain.empty()) node.set_domain(domain);
  for (auto& input : inputs) node.add_input(std::move(input));
  for (auto& output : outputs) node.add_output(std::move(output));
  return node;
}

std::string AddInt64Initializer(Graph& graph, const std::string& hint, const std::vector<int64_t>& values) {
  const std::string name = graph.UniqueName(hint);
  graph.AddInitializer(MakeInt64Tensor(name, values));
  return name;
}

std::string AddInt64Scalar(Graph& graph, const std::string& hint, int64_t value) {
  return graph.AddInitializer(MakeIntScalar(graph.UniqueName(hint), onnx::TensorProto::INT64, value))->name();
}

void SplitPartsIntoHeads(Graph& graph, const std::string& x, int64_t part_width, int64_t heads, int64_t head_size,
                         const std::vector<std::string>& outputs, int64_t opset, const Node* after) {
  const std::vector<int64_t> part_sizes(outputs.size(), part_width);
  std::vector<std::string> pieces;
  for (size_t p = 0; p < outputs.size(); ++p) pieces.push_back(graph.UniqueName(absl::StrCat(x, "_part", p)));
  onnx::NodeProto split_last = MakeNode("Split", graph.UniqueName("packed_part_split"), {x}, pieces);
  *split_last.add_attribute() = MakeIntAttribute("axis", -1);
  if (opset >= 13) {
    split_last.add_input(AddInt64Initializer(graph, x + "_part_sizes", part_sizes));
  } else {
    *split_last.add_attribute() = MakeIntsAttribute("split", part_sizes);
  }
  const std::string head_shape = AddInt64Initializer(graph, x + "_part_heads", {0, 0, heads, head_size});
  const Node* at = graph.AddNode(std::move(split_last), after, /*after=*/true);
  for (size_t p = 0; p < outputs.size(); ++p) {
    at = graph.AddNode(MakeNode("Reshape", graph.UniqueName("packed_part_heads"), {pieces[p], head_shape}, {outputs[p]}),
                       at, /*after=*/true);
  }
}

void RemoveUnreadNodes(Graph& graph, std::vector<Node*> nodes) {
  while (!nodes.empty()) {
    Node* node = nodes.back();
    nodes.pop_back();
    if (node->removed() || !node->domain().empty()) continue;
    bool read = false;
    for (const std::string& output : node->proto().output()) {
      read |= !output.empty() && (graph.HasConsumers(output) || graph.IsGraphOutput(output));
    }
    if (read) continue;
    std::vector<Node*> producers;
    for (const std::string& input : node->proto().input()) {
      if (Node* producer = graph.Producer(input)) producers.push_back(producer);
    }
    graph.RemoveNode(node);
    for (Node* producer : producers) {
      if (!producer->removed()) nodes.push_back(producer);
    }
  }
}

std::string AddCast(Graph& graph, const std::string& value, int32_t to, const Node* anchor) {
  const std::string name = graph.UniqueName(value + (to == onnx::TensorProto::INT32 ? "_int32" : "_cast"));
  onnx::NodeProto cast = MakeNode("Cast", name, {value}, {name});
  *cast.add_attribute() = MakeIntAttribute("to", to);
  graph.AddNode(std::move(cast), anchor, /*after=*/false);
  return name;
}

const std::string& CastCache::Get(Graph& graph, const std::string& value, const Node* anchor) {
  auto known = casts_.find(value);
  if (known == casts_.end()) known = casts_.emplace(value, AddCast(graph, value, to_, anchor)).first;
  return known->second;
}

std::string NodeChain::Add(const std::string& op, std::vector<std::string> inputs, const std::string& hint,
                           std::vector<onnx::AttributeProto> attributes, const std::string& domain) {
  const std::string name = graph_.UniqueName(hint);
  const std::string output = graph_.UniqueName(hint);
  onnx::NodeProto node = MakeNode(op, name, std::move(inputs), {output}, domain);
  for (auto& attribute : attributes) *node.add_attribute() = std::move(attribute);
  AddNode(std::move(node));
  return output;
}

const Node* NodeChain::AddNode(onnx::NodeProto node) {
  last_ = graph_.AddNode(std::move(node), last_, /*after=*/true);
  return last_;
}

}  // namespace onnxopt
