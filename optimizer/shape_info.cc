#include "optimizer/shape_info.h"

#include <map>
#include <unordered_set>

#include "onnx/defs/schema.h"
#include "onnx/shape_inference/implementation.h"
#include "optimizer/contrib_schemas.h"
#include "optimizer/symbolic_shapes.h"

namespace onnxopt {
namespace {

constexpr int kMaxInferableOpset = 17;
// Initializers bigger than this are weights, never shape tensors: inference sees only their type.
constexpr size_t kKeepInitializerBytes = 4096;

// True if every output of a node onnx has no schema for carries a declared type.
bool UnknownOutputsAreTyped(const onnx::ModelProto& model) {
  std::map<std::string, int> opsets;
  for (const auto& import : model.opset_import()) {
    opsets[import.domain() == "ai.onnx" ? "" : import.domain()] = static_cast<int>(import.version());
  }
  const onnx::GraphProto& graph = model.graph();
  std::unordered_set<std::string> typed;
  for (const auto* values : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const auto& value : *values) {
      if (value.has_type()) typed.insert(value.name());
    }
  }
  for (const auto& node : graph.node()) {
    const std::string domain = node.domain() == "ai.onnx" ? "" : node.domain();
    auto opset = opsets.find(domain);
    const bool known = opset != opsets.end() &&
                       onnx::OpSchemaRegistry::Schema(node.op_type(), opset->second, domain) != nullptr;
    if (known) continue;
    for (const auto& output : node.output()) {
      if (!output.empty() && typed.count(output) == 0) return false;
    }
  }
  return true;
}

}  // namespace

bool InferShapesInPlace(onnx::ModelProto* model) {
  EnsureContribSchemas();
  const bool data_propagation = UnknownOutputsAreTyped(*model);
  try {
    onnx::shape_inference::InferShapes(*model, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(false, 0, data_propagation));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

ShapeInfo ShapeInfo::Infer(const onnx::ModelProto& model) {
  ShapeInfo info;
  int64_t opset = 0;
  for (const auto& import : model.opset_import()) {
    if (import.domain().empty() || import.domain() == "ai.onnx") opset = import.version();
  }
  onnx::ModelProto copy;
  copy.set_ir_version(model.ir_version());
  *copy.mutable_opset_import() = model.opset_import();
  *copy.mutable_functions() = model.functions();
  onnx::GraphProto* graph = copy.mutable_graph();
  const onnx::GraphProto& source = model.graph();
  *graph->mutable_node() = source.node();
  *graph->mutable_input() = source.input();
  *graph->mutable_output() = source.output();
  *graph->mutable_value_info() = source.value_info();
  graph->set_name(source.name());
  for (const auto& tensor : source.initializer()) {
    onnx::TensorProto* kept = graph->add_initializer();
    if (tensor.ByteSizeLong() <= kKeepInitializerBytes) {
      *kept = tensor;
      continue;
    }
    kept->set_name(tensor.name());
    kept->set_data_type(tensor.data_type());
    *kept->mutable_dims() = tensor.dims();
  }
  if (opset > 0 && opset <= kMaxInferableOpset) {
    // When inference fails, what the model declares is still used below.
    info.inferred_ = InferShapesInPlace(&copy);
  }
  std::unordered_map<std::string, onnx::TypeProto> inferred;
  for (const auto& tensor : source.initializer()) {
    onnx::TypeProto type;
    type.mutable_tensor_type()->set_elem_type(tensor.data_type());
    auto* shape = type.mutable_tensor_type()->mutable_shape();
    for (int64_t dim : tensor.dims()) shape->add_dim()->set_dim_value(dim);
    inferred[tensor.name()] = type;
  }
  for (const auto* values : {&graph->input(), &graph->output(), &graph->value_info()}) {
    for (const auto& value : *values) {
      if (value.has_type()) inferred.emplace(value.name(), value.type());
    }
  }
  if (info.inferred_) RecoverSymbolicShapes(&copy, &inferred, &info.known_values_);
  for (auto& [name, type] : inferred) info.types_.emplace(name, std::move(type));
  return info;
}

const std::vector<onnx::TensorShapeProto::Dimension>* ShapeInfo::SymbolicValue(const std::string& value) const {
  auto it = known_values_.find(value);
  return it == known_values_.end() ? nullptr : &it->second;
}

std::optional<std::vector<int64_t>> ShapeInfo::KnownValue(const std::string& value) const {
  const auto* dims = SymbolicValue(value);
  if (dims == nullptr) return std::nullopt;
  std::vector<int64_t> numbers;
  for (const auto& d : *dims) {
    if (!d.has_dim_value()) return std::nullopt;
    numbers.push_back(d.dim_value());
  }
  return numbers;
}

const onnx::TypeProto* ShapeInfo::TypeOf(const std::string& value) const {
  auto it = types_.find(value);
  return it == types_.end() ? nullptr : &it->second;
}

std::optional<int32_t> ShapeInfo::ElementType(const std::string& value) const {
  const onnx::TypeProto* type = TypeOf(value);
  if (type == nullptr || !type->has_tensor_type() || type->tensor_type().elem_type() == 0) return std::nullopt;
  return type->tensor_type().elem_type();
}

std::optional<int> ShapeInfo::Rank(const std::string& value) const {
  const onnx::TypeProto* type = TypeOf(value);
  if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape()) return std::nullopt;
  return type->tensor_type().shape().dim_size();
}

std::optional<std::vector<int64_t>> ShapeInfo::StaticShape(const std::string& value) const {
  const onnx::TypeProto* type = TypeOf(value);
  if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape()) return std::nullopt;
  std::vector<int64_t> dims;
  for (const auto& dim : type->tensor_type().shape().dim()) {
    if (!dim.has_dim_value()) return std::nullopt;
    dims.push_back(dim.dim_value());
  }
  return dims;
}

bool SameDimension(const onnx::TensorShapeProto::Dimension& a, const onnx::TensorShapeProto::Dimension& b) {
  if (a.has_dim_value() && b.has_dim_value()) return a.dim_value() == b.dim_value();
  return a.has_dim_param() && b.has_dim_param() && !a.dim_param().empty() && a.dim_param() == b.dim_param();
}

const onnx::TensorShapeProto::Dimension* ShapeInfo::Dim(const std::string& value, int i) const {
  const onnx::TypeProto* type = TypeOf(value);
  if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape()) return nullptr;
  const int rank = type->tensor_type().shape().dim_size();
  if (i < 0) i += rank;
  if (i < 0 || i >= rank) return nullptr;
  return &type->tensor_type().shape().dim(i);
}

bool ShapeInfo::SameDim(const std::string& a, int i, const std::string& b, int j) const {
  const auto* da = Dim(a, i);
  const auto* db = Dim(b, j);
  return da != nullptr && db != nullptr && SameDimension(*da, *db);
}

std::optional<int64_t> ShapeInfo::DimValue(const std::string& value, int i) const {
  const auto* d = Dim(value, i);
  if (d == nullptr || !d->has_dim_value()) return std::nullopt;
  return d->dim_value();
}

bool ShapeInfo::SameShape(const std::string& a, const std::string& b) const {
  const auto rank = Rank(a);
  if (!rank || Rank(b) != rank) return false;
  for (int i = 0; i < *rank; ++i) {
    if (!SameDim(a, i, b, i)) return false;
  }
  return true;
}

}  // namespace onnxopt
