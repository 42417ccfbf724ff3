#include "optimizer/passes/integer_arithmetic.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "optimizer/graph.h"
#include "optimizer/passes/constants.h"

namespace onnxopt {
namespace {

using Dims = std::vector<int64_t>;

int64_t ElementCount(const Dims& dims) {
  int64_t count = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d > 0 && count > static_cast<int64_t>(kMaxIntTensorElements) / d + 1)) return -1;
    count *= d;
  }
  return count;
}

bool Fits(const Dims& dims) {
  const int64_t count = ElementCount(dims);
  return count >= 0 && count <= static_cast<int64_t>(kMaxIntTensorElements);
}

// Row-major strides of `dims`.
Dims Strides(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

// Narrows to the element type as ONNX Runtime's integer kernels do (two's complement wrap-around).
int64_t Narrow(int32_t data_type, uint64_t bits) {
  return data_type == onnx::TensorProto::INT32 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(bits)))
                                               : static_cast<int64_t>(bits);
}

// An axis in [-rank, rank) made non-negative; nullopt outside.
std::optional<int64_t> Axis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return std::nullopt;
  return axis < 0 ? axis + rank : axis;
}

// Axes from the attribute (before `input_from_opset`) or from input `index`.
std::optional<Dims> AxesOf(const onnx::NodeProto& node, const std::vector<const IntTensor*>& inputs, size_t index,
                           int64_t opset, int64_t input_from_opset, bool* given) {
  if (opset < input_from_opset) {
    const onnx::AttributeProto* attribute = FindAttribute(node, "axes");
    *given = attribute != nullptr;
    return attribute != nullptr ? Dims(attribute->ints().begin(), attribute->ints().end()) : Dims();
  }
  *given = index < inputs.size() && inputs[index] != nullptr;
  if (!*given) return index < static_cast<size_t>(node.input_size()) && !node.input(index).empty() ? std::nullopt
                                                                                                   : std::optional<Dims>(Dims());
  if (inputs[index]->dims.size() > 1) return std::nullopt;
  return inputs[index]->values;
}

std::optional<IntTensor> Unsqueeze(const onnx::NodeProto& node, const std::vector<const IntTensor*>& in, int64_t opset) {
  bool given = false;
  std::optional<Dims> axes = AxesOf(node, in, 1, opset, 13, &given);
  if (!axes || !given || axes->empty()) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(in[0]->dims.size() + axes->size());
  std::vector<bool> inserted(static_cast<size_t>(rank), false);
  for (int64_t axis : *axes) {
    auto normalized = Axis(axis, rank);
    if (!normalized || inserted[static_cast<size_t>(*normalized)]) return std::nullopt;
    inserted[static_cast<size_t>(*normalized)] = true;
  }
  IntTensor out{in[0]->data_type, {}, in[0]->values};
  size_t next = 0;
  for (int64_t d = 0; d < rank; ++d) out.dims.push_back(inserted[static_cast<size_t>(d)] ? 1 : in[0]->dims[next++]);
  return out;
}

std::optional<IntTensor> Squeeze(const onnx::NodeProto& node, const std::vector<const IntTensor*>& in, int64_t opset) {
  bool given = false;
  std::optional<Dims> axes = AxesOf(node, in, 1, opset, 13, &given);
  // An empty axes list: ONNX Runtime squeezes every 1, the spec is silent; left to ONNX Runtime.
  if (!axes || (given && axes->empty())) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(in[0]->dims.size());
  std::vector<bool> removed(static_cast<size_t>(rank), false);
  for (int64_t axis : *axes) {
    auto normalized = Axis(axis, rank);
    if (!normalized || in[0]->dims[static_cast<size_t>(*normalized)] != 1) return std::nullopt;
    removed[static_cast<size_t>(*normalized)] = true;
  }
  IntTensor out{in[0]->data_type, {}, in[0]->values};
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t size = in[0]->dims[static_cast<size_t>(d)];
    if (!(given ? removed[static_cast<size_t>(d)] : size == 1)) out.dims.push_back(size);
  }
  return out;
}

std::optional<IntTensor> Concat(const onnx::NodeProto& node, const std::vector<const IntTensor*>& in) {
  if (in.empty() || FindAttribute(node, "axis") == nullptr) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(in[0]->dims.size());
  auto axis = Axis(GetAttributeInt(node, "axis", 0), rank);
  if (rank == 0 || !axis) return std::nullopt;
  IntTensor out{in[0]->data_type, in[0]->dims, {}};
  out.dims[static_cast<size_t>(*axis)] = 0;
  for (const IntTensor* part : in) {
    if (part == nullptr || part->data_type != out.data_type || static_cast<int64_t>(part->dims.size()) != rank) return std::nullopt;
    for (int64_t d = 0; d < rank; ++d) {
      if (d != *axis && part->dims[static_cast<size_t>(d)] != in[0]->dims[static_cast<size_t>(d)]) return std::nullopt;
    }
    out.dims[static_cast<size_t>(*axis)] += part->dims[static_cast<size_t>(*axis)];
  }
  if (!Fits(out.dims)) return std::nullopt;
  const int64_t outer = std::accumulate(out.dims.begin(), out.dims.begin() + *axis, int64_t{1}, std::multiplies<>());
  for (int64_t o = 0; o < outer; ++o) {
    for (const IntTensor* part : in) {
      const int64_t block = ElementCount(Dims(part->dims.begin() + *axis, part->dims.end()));
      out.values.insert(out.values.end(), part->values.begin() + o * block, part->values.begin() + (o + 1) * block);
    }
  }
  return out;
}

std::optional<IntTensor> Gather(const onnx::NodeProto& node, const std::vector<const IntTensor*>& in) {
  if (in.size() != 2 || in[1] == nullptr) return std::nullopt;
  const IntTensor& data = *in[0];
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  auto axis = Axis(GetAttributeInt(node, "axis", 0), rank);
  if (!axis) return std::nullopt;
  const int64_t size = data.dims[static_cast<size_t>(*axis)];
  IntTensor out{data.data_type, Dims(data.dims.begin(), data.dims.begin() + *axis), {}};
  out.dims.insert(out.dims.end(), in[1]->dims.begin(), in[1]->dims.end());
  out.dims.insert(out.dims.end(), data.dims.begin() + *axis + 1, data.dims.end());
  if (!Fits(out.dims)) return std::nullopt;
  const int64_t outer = std::accumulate(data.dims.begin(), data.dims.begin() + *axis, int64_t{1}, std::multiplies<>());
  const int64_t inner = std::accumulate(data.dims.begin() + *axis + 1, data.dims.end(), int64_t{1}, std::multiplies<>());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t index : in[1]->values) {
      if (index < -size || index >= size) return std::nullopt;
      if (index < 0) index += size;
      const auto from = data.values.begin() + (o * size + index) * inner;
      out.values.insert(out.values.end(), from, from + inner);
    }
  }
  return out;
}

std::optional<IntTensor> Slice(const onnx::NodeProto& node, const std::vector<const IntTensor*>& in, int64_t opset) {
  const IntTensor& data = *in[0];
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  Dims starts, ends, axes, steps;
  if (opset < 10) {
    const auto* s = FindAttribute(node, "starts");
    const auto* e = FindAttribute(node, "ends");
    const auto* a = FindAttribute(node, "axes");
    if (s == nullptr || e == nullptr) return std::nullopt;
    starts.assign(s->ints().begin(), s->ints().end());
    ends.assign(e->ints().begin(), e->ints().end());
    if (a != nullptr) axes.assign(a->ints().begin(), a->ints().end());
  } else {
    auto optional_input = [&](size_t i, Dims* out) {
      if (i >= static_cast<size_t>(node.input_size()) || node.input(i).empty()) return true;
      if (i >= in.size() || in[i] == nullptr || in[i]->dims.size() != 1) return false;
      *out = in[i]->values;
      return true;
    };
    if (in.size() < 3 || in[1] == nullptr || in[2] == nullptr) return std::nullopt;
    starts = in[1]->values;
    ends = in[2]->values;
    if (!optional_input(3, &axes) || !optional_input(4, &steps)) return std::nullopt;
  }
  if (starts.size() != ends.size()) return std::nullopt;
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) return std::nullopt;
  Dims first(static_cast<size_t>(rank), 0), step_of(static_cast<size_t>(rank), 1), out_dims = data.dims;
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (size_t k = 0; k < starts.size(); ++k) {
    auto axis = Axis(axes[k], rank);
    if (!axis || seen[static_cast<size_t>(*axis)] || steps[k] == 0) return std::nullopt;
    seen[static_cast<size_t>(*axis)] = true;
    const int64_t dim = data.dims[static_cast<size_t>(*axis)];
    const int64_t step = steps[k];
    // As ONNX Runtime's SliceBase: INT_MAX ends mean "to the end" in the step's direction; the count
    // is worked out in 128 bits, so huge steps cannot overflow.
    int64_t start = starts[k], end = ends[k];
    int64_t count = 0;
    if (dim > 0) {
      if (start < 0) start += dim;
      start = step < 0 ? std::clamp<int64_t>(start, 0, dim - 1) : std::clamp<int64_t>(start, 0, dim);
      if (end == std::numeric_limits<int32_t>::max() || end == std::numeric_limits<int64_t>::max()) {
        end = step < 0 ? -1 : dim;
      } else {
        if (end < 0) end += dim;
        end = step < 0 ? std::clamp<int64_t>(end, -1, dim) : std::clamp<int64_t>(end, 0, dim);
      }
      const __int128 span = static_cast<__int128>(end) - start;
      const __int128 s128 = step;
      const __int128 n =
          step > 0 ? (span <= 0 ? 0 : (span + s128 - 1) / s128) : (span >= 0 ? 0 : (-span - s128 - 1) / -s128);
      count = static_cast<int64_t>(n);
    }
    first[static_cast<size_t>(*axis)] = start;
    step_of[static_cast<size_t>(*axis)] = step;
    out_dims[static_cast<size_t>(*axis)] = count;
  }
  IntTensor out{data.data_type, out_dims, {}};
  const int64_t count = ElementCount(out_dims);
  const Dims in_strides = Strides(data.dims);
  const Dims out_strides = Strides(out_dims);
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = 0;
    for (int64_t d = 0; d < rank; ++d) {
      const size_t axis = static_cast<size_t>(d);
      const int64_t at = (i / out_strides[axis]) % out_dims[axis];
      offset += (first[axis] + at * step_of[axis]) * in_strides[axis];
    }
    out.values.push_back(data.values[static_cast<size_t>(offset)]);
  }
  return out;
}

std::optional<IntTensor> Reshape(const onnx::NodeProto& node, const std::vector<const IntTensor*>& in) {
  if (in.size() != 2 || in[1] == nullptr || in[1]->dims.size() != 1) return std::nullopt;
  const bool allow_zero = GetAttributeInt(node, "allowzero", 0) != 0;
  IntTensor out{in[0]->data_type, in[1]->values, in[0]->values};
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.dims.size(); ++i) {
    int64_t& d = out.dims[i];
    if (d == 0 && !allow_zero) {
      if (i >= in[0]->dims.size()) return std::nullopt;
      d = in[0]->dims[i];
    }
    if (d == -1) {
      if (infer_at >= 0) return std::nullopt;
      infer_at = static_cast<int>(i);
    } else if (d < 0) {
      return std::nullopt;
    } else {
      known *= d;
    }
  }
  const int64_t total = static_cast<int64_t>(out.values.size());
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) return std::nullopt;
    out.dims[static_cast<size_t>(infer_at)] = total / known;
  } else if (known != total) {
    return std::nullopt;
  }
  return out;
}

std::optional<IntTensor> Elementwise(const std::string& op, const IntTensor& a, const IntTensor& b) {
  if (a.data_type != b.data_type) return std::nullopt;
  const size_t rank = std::max(a.dims.size(), b.dims.size());
  auto padded = [rank](const Dims& dims) {
    Dims out(rank - dims.size(), 1);
    out.insert(out.end(), dims.begin(), dims.end());
    return out;
  };
  const Dims da = padded(a.dims), db = padded(b.dims);
  IntTensor out{a.data_type, Dims(rank), {}};
  for (size_t d = 0; d < rank; ++d) {
    if (da[d] != db[d] && da[d] != 1 && db[d] != 1) return std::nullopt;
    out.dims[d] = da[d] == 1 ? db[d] : da[d];
  }
  if (!Fits(out.dims)) return std::nullopt;
  const Dims sa = Strides(da), sb = Strides(db), so = Strides(out.dims);
  const int64_t count = ElementCount(out.dims);
  for (int64_t i = 0; i < count; ++i) {
    int64_t ia = 0, ib = 0;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t at = (i / so[d]) % out.dims[d];
      if (da[d] != 1) ia += at * sa[d];
      if (db[d] != 1) ib += at * sb[d];
    }
    const int64_t x = a.values[static_cast<size_t>(ia)], y = b.values[static_cast<size_t>(ib)];
    const uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
    if (op == "Add") {
      out.values.push_back(Narrow(out.data_type, ux + uy));
    } else if (op == "Sub") {
      out.values.push_back(Narrow(out.data_type, ux - uy));
    } else if (op == "Mul") {
      out.values.push_back(Narrow(out.data_type, ux * uy));
    } else {  // Div truncates toward zero, as C++ and ONNX Runtime's integer kernel do
      const int64_t smallest = out.data_type == onnx::TensorProto::INT32 ? std::numeric_limits<int32_t>::min()
                                                                        : std::numeric_limits<int64_t>::min();
      if (y == 0 || (x == smallest && y == -1)) return std::nullopt;  // a fault in ONNX Runtime
      out.values.push_back(Narrow(out.data_type, static_cast<uint64_t>(x / y)));
    }
  }
  return out;
}

std::optional<IntTensor> Range(const std::vector<const IntTensor*>& in) {
  if (in.size() != 3) return std::nullopt;
  for (const IntTensor* scalar : in) {
    if (scalar == nullptr || !scalar->dims.empty() || scalar->values.size() != 1 || scalar->data_type != in[0]->data_type) {
      return std::nullopt;
    }
  }
  const int64_t start = in[0]->values[0], limit = in[1]->values[0], delta = in[2]->values[0];
  if (delta == 0) return std::nullopt;
  // ceil((limit - start) / delta), at least 0, without overflow
  const __int128 span = static_cast<__int128>(limit) - start;
  const __int128 count128 = delta > 0 ? (span <= 0 ? 0 : (span + delta - 1) / delta)
                                      : (span >= 0 ? 0 : (-span - delta - 1) / -static_cast<__int128>(delta));
  if (count128 > static_cast<__int128>(kMaxIntTensorElements)) return std::nullopt;
  const int64_t count = static_cast<int64_t>(count128);
  IntTensor out{in[0]->data_type, {count}, {}};
  for (int64_t i = 0; i < count; ++i) out.values.push_back(start + i * delta);
  return out;
}

std::optional<IntTensor> ConstantOfShape(const onnx::NodeProto& node, const IntTensor& shape) {
  const onnx::AttributeProto* value = FindAttribute(node, "value");
  if (value == nullptr || !value->has_t() || shape.dims.size() != 1) return std::nullopt;  // no value: float zeros
  std::optional<IntTensor> fill = IntTensorFromProto(value->t());
  if (!fill || fill->values.size() != 1 || !Fits(shape.values)) return std::nullopt;
  return IntTensor{fill->data_type, shape.values,
                   std::vector<int64_t>(static_cast<size_t>(ElementCount(shape.values)), fill->values[0])};
}

std::optional<IntTensor> Cast(const onnx::NodeProto& node, const IntTensor& input) {
  const int64_t to = GetAttributeInt(node, "to", 0);
  if (to != onnx::TensorProto::INT64 && to != onnx::TensorProto::INT32) return std::nullopt;
  IntTensor out{static_cast<int32_t>(to), input.dims, {}};
  for (int64_t v : input.values) out.values.push_back(Narrow(out.data_type, static_cast<uint64_t>(v)));
  return out;
}

}  // namespace

std::optional<IntTensor> IntTensorFromProto(const onnx::TensorProto& tensor) {
  if (tensor.data_type() != onnx::TensorProto::INT64 && tensor.data_type() != onnx::TensorProto::INT32) return std::nullopt;
  IntTensor out{tensor.data_type(), Dims(tensor.dims().begin(), tensor.dims().end()), {}};
  if (!Fits(out.dims)) return std::nullopt;
  std::optional<std::vector<int64_t>> values = TensorInts(tensor);
  if (!values || static_cast<int64_t>(values->size()) != ElementCount(out.dims)) return std::nullopt;
  out.values = *std::move(values);
  return out;
}

onnx::TensorProto IntTensorToProto(const IntTensor& tensor, const std::string& name) {
  onnx::TensorProto proto;
  proto.set_name(name);
  proto.set_data_type(tensor.data_type);
  for (int64_t d : tensor.dims) proto.add_dims(d);
  for (int64_t v : tensor.values) {
    if (tensor.data_type == onnx::TensorProto::INT32) {
      proto.add_int32_data(static_cast<int32_t>(v));
    } else {
      proto.add_int64_data(v);
    }
  }
  return proto;
}

std::optional<IntTensor> EvaluateIntegerNode(const onnx::NodeProto& node, const std::vector<const IntTensor*>& inputs,
                                             int64_t opset) {
  if ((!node.domain().empty() && node.domain() != "ai.onnx") || node.output_size() != 1 || inputs.empty() ||
      inputs[0] == nullptr) {
    return std::nullopt;
  }
  const std::string& op = node.op_type();
  if (op == "Identity") return *inputs[0];
  if (op == "Unsqueeze") return Unsqueeze(node, inputs, opset);
  if (op == "Squeeze") return Squeeze(node, inputs, opset);
  if (op == "Concat") return Concat(node, inputs);
  if (op == "Gather") return Gather(node, inputs);
  if (op == "Slice") return Slice(node, inputs, opset);
  if (op == "Reshape") return Reshape(node, inputs);
  if (op == "Cast") return Cast(node, *inputs[0]);
  if (op == "Range") return Range(inputs);
  if (op == "ConstantOfShape") return ConstantOfShape(node, *inputs[0]);
  if ((op == "Add" || op == "Sub" || op == "Mul" || op == "Div") && inputs.size() == 2 && inputs[1] != nullptr) {
    return Elementwise(op, *inputs[0], *inputs[1]);
  }
  return std::nullopt;
}

}  // namespace onnxopt
