#include "optimizer/shape_info.h"

#include "optimizer/model_io.h"
#include "optimizer/shape_inference.h"

namespace onnxopt {
namespace {

// onnx 1.12 has the schemas of opsets up to 17; up to kLastAdaptedOpset the sweep knows which of them
// still hold; a later opset may have changed any operator.
bool Inferable(const onnx::ModelProto& model) {
  const int64_t opset = DefaultOpset(model);
  return opset > 0 && opset <= kLastAdaptedOpset;
}

}  // namespace

ShapeInfo::ShapeInfo(InferredTypes inferred, bool ran)
    : types_(std::move(inferred.types)),
      known_values_(std::move(inferred.known)),
      aliases_(std::move(inferred.aliases)),
      inferred_(ran) {}

ShapeInfo ShapeInfo::Infer(const onnx::ModelProto& model, const DimAliases& aliases) {
  if (!Inferable(model)) return ShapeInfo(TrackShapeArithmetic(model, aliases), false);
  return ShapeInfo(InferGraphTypes(model, aliases), true);
}

ShapeInfo ShapeInfo::Infer(const onnx::ModelProto& model, const Graph& graph, const DimAliases& aliases) {
  if (!Inferable(model)) return ShapeInfo(TrackShapeArithmetic(model, graph, aliases), false);
  return ShapeInfo(InferGraphTypes(model, graph, aliases), true);
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

void ShapeInfo::Forget(const std::vector<std::string>& values) {
  for (const std::string& value : values) {
    types_.Erase(value);
    known_values_.erase(value);
  }
}

void ShapeInfo::Extend(const onnx::ModelProto& model, const Graph& graph, const std::vector<const Node*>& added,
                       const std::vector<std::string>& added_initializers) {
  if (!inferred_) return;
  InferredTypes extended = ExtendGraphTypes(model, graph, added, added_initializers,
                                            InferredTypes{std::move(types_), std::move(known_values_), std::move(aliases_)});
  types_ = std::move(extended.types);
  known_values_ = std::move(extended.known);
  aliases_ = std::move(extended.aliases);
}

const onnx::TypeProto* ShapeInfo::TypeOf(const std::string& value) const {
  return types_.Find(value);
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
