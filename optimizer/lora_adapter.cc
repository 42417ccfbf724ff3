#include "optimizer/lora_adapter.h"

#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "optimizer/failure.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

constexpr char kIdentifier[] = "TORT";
constexpr int32_t kFormatVersion = 1;  // the only one ONNX Runtime accepts
constexpr char kSuffixA[] = ".lora_A.weight";
constexpr char kSuffixB[] = ".lora_B.weight";

// FlatBuffers written front to back: every offset points forward (the format's uoffset is unsigned),
// tables after their vtables, and fields patched once what they point at is placed.
class FlatBufferWriter {
 public:
  size_t size() const { return bytes_.size(); }
  // Pads so that the next `ahead` bytes end on a multiple of `alignment` (a vector's payload after
  // its 4-byte length: ahead = 4).
  void Align(size_t alignment, size_t ahead = 0) {
    while ((bytes_.size() + ahead) % alignment != 0) bytes_.push_back('\0');
  }
  template <typename T>
  size_t Put(T value) {
    const size_t at = bytes_.size();
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(value));  // little-endian hosts only
    return at;
  }
  void PutBytes(absl::string_view data) { bytes_.append(data.data(), data.size()); }
  // The uoffset at `field` now points at `target`.
  void Point(size_t field, size_t target) {
    const uint32_t offset = static_cast<uint32_t>(target - field);
    std::memcpy(&bytes_[field], &offset, sizeof(offset));
  }
  // A table of four 4-byte fields (both of this schema's tables): its vtable, then the table. Returns
  // the table's position; field i sits at position + 4 + 4 i.
  size_t FourFieldTable() {
    Align(4);
    for (uint16_t entry : {uint16_t{12}, uint16_t{20}, uint16_t{4}, uint16_t{8}, uint16_t{12}, uint16_t{16}}) {
      Put(entry);
    }
    const size_t table = Put(static_cast<int32_t>(12));  // table - vtable
    for (int i = 0; i < 4; ++i) Put(uint32_t{0});
    return table;
  }
  void Set(size_t at, int32_t value) { std::memcpy(&bytes_[at], &value, sizeof(value)); }
  std::string Take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Reads FlatBuffers with every position checked against the buffer.
class FlatBufferReader {
 public:
  explicit FlatBufferReader(absl::string_view bytes) : bytes_(bytes) {}

  template <typename T>
  absl::StatusOr<T> Get(size_t at) const {
    if (at > bytes_.size() || bytes_.size() - at < sizeof(T)) return Truncated(at);
    T value;
    std::memcpy(&value, bytes_.data() + at, sizeof(T));
    return value;
  }
  // The position a uoffset at `at` points to.
  absl::StatusOr<size_t> Follow(size_t at) const {
    absl::StatusOr<uint32_t> offset = Get<uint32_t>(at);
    if (!offset.ok()) return offset.status();
    if (*offset == 0 || at + *offset >= bytes_.size()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                     absl::StrCat("an offset at byte ", at, " points outside the file"));
    }
    return at + *offset;
  }
  // The position of field `slot` of the table at `table`, or 0 when the field is absent.
  absl::StatusOr<size_t> Field(size_t table, int slot) const {
    absl::StatusOr<int32_t> back = Get<int32_t>(table);
    if (!back.ok()) return back.status();
    const int64_t vtable = static_cast<int64_t>(table) - *back;
    if (vtable < 0 || static_cast<uint64_t>(vtable) >= bytes_.size()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                     absl::StrCat("the table at byte ", table, " has no vtable"));
    }
    absl::StatusOr<uint16_t> vtable_size = Get<uint16_t>(vtable);
    absl::StatusOr<uint16_t> table_size = Get<uint16_t>(vtable + 2);
    if (!vtable_size.ok() || !table_size.ok()) return Truncated(vtable);
    const size_t entry = 4 + 2 * slot;
    if (entry + 2 > *vtable_size) return 0;
    absl::StatusOr<uint16_t> offset = Get<uint16_t>(vtable + entry);
    if (!offset.ok()) return offset.status();
    if (*offset == 0) return 0;
    if (*offset + 4u > *table_size) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                     absl::StrCat("a field of the table at byte ", table, " lies outside it"));
    }
    return table + *offset;
  }
  // A vector's element count and the position of its first element; `element_size` bytes each must fit.
  absl::StatusOr<std::pair<uint32_t, size_t>> Vector(size_t at, size_t element_size) const {
    absl::StatusOr<uint32_t> count = Get<uint32_t>(at);
    if (!count.ok()) return count.status();
    if ((bytes_.size() - at - 4) / element_size < *count) return Truncated(at);
    return std::make_pair(*count, at + 4);
  }
  absl::string_view Slice(size_t at, size_t length) const { return bytes_.substr(at, length); }

 private:
  absl::Status Truncated(size_t at) const {
    return Failure(
        absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
        absl::StrCat("the file ends at byte ", bytes_.size(), ", inside what byte ", at, " begins (truncated?)"));
  }
  absl::string_view bytes_;
};

// prod(dims) * the element size, or nullopt for an unsized element type, a negative dim or an overflow.
std::optional<uint64_t> DataSize(const std::vector<int64_t>& dims, int32_t type) {
  const size_t element = ElementSize(type);
  return element == 0 ? std::nullopt : CheckedByteSize(dims, element);
}

}  // namespace

std::string AdapterParameterName(absl::string_view module, char which) {
  return absl::StrCat(module, which == 'A' ? kSuffixA : kSuffixB);
}

bool ParseAdapterParameterName(absl::string_view name, char* which, std::string* module) {
  char found = 0;
  if (absl::EndsWith(name, kSuffixA)) {
    found = 'A';
  } else if (absl::EndsWith(name, kSuffixB)) {
    found = 'B';
  }
  const size_t suffix = sizeof(kSuffixA) - 1;
  if (found == 0 || name.size() == suffix) return false;
  if (which != nullptr) *which = found;
  if (module != nullptr) *module = std::string(name.substr(0, name.size() - suffix));
  return true;
}

std::string CanonicalModulePath(absl::string_view path) {
  std::vector<std::string> segments = absl::StrSplit(absl::StrReplaceAll(path, {{"/", "."}}), '.', absl::SkipEmpty());
  size_t first = 0;
  while (first < segments.size() &&
         (segments[first] == "m" || segments[first] == "base_model" || segments[first] == "model")) {
    ++first;
  }
  size_t end = segments.size();
  for (size_t i = first; i < segments.size(); ++i) {
    if (segments[i] == "lora_A" || segments[i] == "lora_B" || segments[i] == "base_layer") {
      end = i;
      break;
    }
  }
  if (first >= end) return "";
  return absl::StrJoin(segments.begin() + first, segments.begin() + end, ".");
}

std::vector<const onnx::ValueInfoProto*> AdapterInputs(const onnx::ModelProto& model) {
  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const auto& input : model.graph().input()) {
    if (ParseAdapterParameterName(input.name())) inputs.push_back(&input);
  }
  return inputs;
}

std::vector<onnx::TensorProto> TakeAdapterDefaults(onnx::ModelProto* model) {
  std::map<std::string, char> adapter_inputs;
  for (const onnx::ValueInfoProto* input : AdapterInputs(*model)) {
    char which = 0;
    ParseAdapterParameterName(input->name(), &which);
    adapter_inputs[input->name()] = which;
  }
  std::vector<onnx::TensorProto> taken;
  for (onnx::TensorProto& tensor : *model->mutable_graph()->mutable_initializer()) {
    auto it = adapter_inputs.find(tensor.name());
    if (it == adapter_inputs.end() || tensor.dims_size() != 2) continue;
    onnx::TensorProto empty;
    empty.set_name(tensor.name());
    empty.set_data_type(tensor.data_type());
    // A [in, r] -> [in, 0]; B [r, out] -> [0, out].
    empty.add_dims(it->second == 'A' ? tensor.dims(0) : 0);
    empty.add_dims(it->second == 'A' ? 0 : tensor.dims(1));
    empty.set_raw_data("");
    taken.push_back(std::move(tensor));
    tensor = std::move(empty);
  }
  return taken;
}

absl::StatusOr<std::string> SerializeAdapter(const std::vector<onnx::TensorProto>& parameters, int adapter_version,
                                             int model_version) {
  FlatBufferWriter out;
  const size_t root = out.Put(uint32_t{0});
  out.PutBytes(kIdentifier);
  const size_t adapter = out.FourFieldTable();
  out.Set(adapter + 4, kFormatVersion);
  out.Set(adapter + 8, adapter_version);
  out.Set(adapter + 12, model_version);
  out.Point(root, adapter);
  out.Align(4);
  const size_t vector = out.Put(static_cast<uint32_t>(parameters.size()));
  out.Point(adapter + 16, vector);
  std::vector<size_t> slots;
  for (size_t i = 0; i < parameters.size(); ++i) slots.push_back(out.Put(uint32_t{0}));
  for (size_t i = 0; i < parameters.size(); ++i) {
    const onnx::TensorProto& tensor = parameters[i];
    std::string scratch;
    absl::StatusOr<absl::string_view> data = TensorBytes(tensor, &scratch);  // fills its dims
    if (!data.ok()) return data.status();
    const std::vector<int64_t> dims(tensor.dims().begin(), tensor.dims().end());
    if (dims.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter parameter '", tensor.name(), "' is a scalar; ONNX Runtime reads tensors of rank >= 1"));
    }
    const size_t table = out.FourFieldTable();
    out.Point(slots[i], table);
    out.Set(table + 12, tensor.data_type());  // the format's TensorDataType numbers are ONNX's
    out.Align(4);
    out.Point(table + 4, out.Put(static_cast<uint32_t>(tensor.name().size())));
    out.PutBytes(tensor.name());
    out.PutBytes(absl::string_view("\0", 1));
    out.Align(8, 4);
    out.Point(table + 8, out.Put(static_cast<uint32_t>(dims.size())));
    for (int64_t dim : dims) out.Put(dim);
    out.Align(16, 4);
    out.Point(table + 16, out.Put(static_cast<uint32_t>(data->size())));
    out.PutBytes(*data);
    // FlatBuffers' offsets are 32-bit, and ONNX Runtime's verifier stops at 2 GiB.
    if (out.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_TOO_LARGE,
                     "an .onnx_adapter file holds at most 2 GiB");
    }
  }
  return out.Take();
}

absl::StatusOr<std::vector<onnx::TensorProto>> ParseAdapter(absl::string_view bytes) {
  if (bytes.size() < 8 || bytes.substr(4, 4) != kIdentifier) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                   "not an .onnx_adapter file (no \"TORT\" identifier at byte 4)");
  }
  FlatBufferReader in(bytes);
  absl::StatusOr<size_t> adapter = in.Follow(0);
  if (!adapter.ok()) return adapter.status();
  absl::StatusOr<size_t> version_field = in.Field(*adapter, 0);
  if (!version_field.ok()) return version_field.status();
  absl::StatusOr<int32_t> version = *version_field == 0 ? 0 : in.Get<int32_t>(*version_field);
  if (!version.ok()) return version.status();
  if (*version != kFormatVersion) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                   absl::StrCat("adapter format version ", *version, "; ONNX Runtime reads version 1"));
  }
  absl::StatusOr<size_t> parameters_field = in.Field(*adapter, 3);
  if (!parameters_field.ok()) return parameters_field.status();
  std::vector<onnx::TensorProto> parameters;
  uint64_t copied = 0;
  if (*parameters_field == 0) return parameters;
  absl::StatusOr<size_t> vector_at = in.Follow(*parameters_field);
  if (!vector_at.ok()) return vector_at.status();
  absl::StatusOr<std::pair<uint32_t, size_t>> vector = in.Vector(*vector_at, 4);
  if (!vector.ok()) return vector.status();
  for (uint32_t i = 0; i < vector->first; ++i) {
    absl::StatusOr<size_t> table = in.Follow(vector->second + 4 * i);
    if (!table.ok()) return table.status();
    auto field = [&](int slot) -> absl::StatusOr<size_t> {
      absl::StatusOr<size_t> at = in.Field(*table, slot);
      if (at.ok() && *at == 0) {
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                       absl::StrCat("parameter ", i, " lacks its ",
                                    std::vector<std::string>{"name", "dims", "data type", "data"}[slot]));
      }
      return at;
    };
    absl::StatusOr<size_t> name_field = field(0), dims_field = field(1), type_field = field(2), data_field = field(3);
    for (const auto* status : {&name_field, &dims_field, &type_field, &data_field}) {
      if (!status->ok()) return status->status();
    }
    onnx::TensorProto tensor;
    absl::StatusOr<size_t> name_at = in.Follow(*name_field);
    if (!name_at.ok()) return name_at.status();
    absl::StatusOr<std::pair<uint32_t, size_t>> name = in.Vector(*name_at, 1);
    if (!name.ok()) return name.status();
    tensor.set_name(std::string(in.Slice(name->second, name->first)));
    absl::StatusOr<size_t> dims_at = in.Follow(*dims_field);
    if (!dims_at.ok()) return dims_at.status();
    absl::StatusOr<std::pair<uint32_t, size_t>> dims = in.Vector(*dims_at, 8);
    if (!dims.ok()) return dims.status();
    std::vector<int64_t> shape;
    for (uint32_t d = 0; d < dims->first; ++d) shape.push_back(*in.Get<int64_t>(dims->second + 8 * d));
    absl::StatusOr<int32_t> type = in.Get<int32_t>(*type_field);
    if (!type.ok()) return type.status();
    absl::StatusOr<size_t> data_at = in.Follow(*data_field);
    if (!data_at.ok()) return data_at.status();
    absl::StatusOr<std::pair<uint32_t, size_t>> data = in.Vector(*data_at, 1);
    if (!data.ok()) return data.status();
    const std::optional<uint64_t> expected = DataSize(shape, *type);
    if (shape.empty() || !expected || *expected != data->first) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                     absl::StrCat("parameter '", tensor.name(), "' [", absl::StrJoin(shape, ", "), "] of type ", *type,
                                  " holds ", data->first, " bytes",
                                  expected ? absl::StrCat(", not ", *expected) : " (unsupported type or dims)"));
    }
    tensor.set_data_type(*type);
    for (int64_t dim : shape) tensor.add_dims(dim);
    // Each parameter's data is its own: tables pointing at one payload would multiply what is copied.
    copied += data->first;
    if (copied > bytes.size()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                     "parameters share their data (the file repeats a payload)");
    }
    tensor.set_raw_data(std::string(in.Slice(data->second, data->first)));
    parameters.push_back(std::move(tensor));
  }
  return parameters;
}

absl::StatusOr<std::vector<onnx::TensorProto>> ConcatenateAdapters(
    const std::vector<std::vector<onnx::TensorProto>>& adapters) {
  // Per parameter, in first-seen order: its parts (one an adapter), checked, then joined once.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const onnx::TensorProto*>> parts;
  for (const auto& adapter : adapters) {
    for (const onnx::TensorProto& tensor : adapter) {
      if (parts.count(tensor.name()) == 0) order.push_back(tensor.name());
      parts[tensor.name()].push_back(&tensor);
    }
  }
  std::vector<onnx::TensorProto> merged;
  for (const std::string& name : order) {
    char which = 0;
    if (!ParseAdapterParameterName(name, &which)) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_INVALID,
                     absl::StrCat("'", name, "' is no LoRA matrix's name"));
    }
    const std::vector<const onnx::TensorProto*>& pieces = parts[name];
    const onnx::TensorProto& first = *pieces.front();
    const int kept_axis = which == 'A' ? 0 : 1;  // A [in, r]: in agrees; B [r, out]: out agrees
    std::vector<std::string> scratch(pieces.size());
    std::vector<absl::string_view> bytes;
    int64_t rank = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
      const onnx::TensorProto* piece = pieces[p];
      absl::StatusOr<absl::string_view> data = TensorBytes(*piece, &scratch[p]);  // fills its dims
      if (!data.ok()) return data.status();
      const std::vector<int64_t> dims(piece->dims().begin(), piece->dims().end());
      if (piece->data_type() != first.data_type() || dims.size() != 2 || first.dims_size() != 2 ||
          dims[kept_axis] != first.dims(kept_axis)) {
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                       absl::StrCat("'", name, "' is [", absl::StrJoin(dims, ", "), "] of type ", piece->data_type(),
                                    " in one adapter and [", absl::StrJoin(first.dims(), ", "), "] of type ",
                                    first.data_type(), " in another"));
      }
      rank += dims[1 - kept_axis];
      bytes.push_back(*data);
    }
    onnx::TensorProto joined;
    joined.set_name(name);
    joined.set_data_type(first.data_type());
    joined.add_dims(which == 'A' ? first.dims(0) : rank);
    joined.add_dims(which == 'A' ? rank : first.dims(1));
    std::string* raw = joined.mutable_raw_data();
    if (which == 'B') {
      for (absl::string_view part : bytes) raw->append(part.data(), part.size());  // rows stacked
    } else {
      const size_t element = ElementSize(first.data_type());
      for (int64_t row = 0; row < first.dims(0); ++row) {  // each row side by side
        for (size_t i = 0; i < bytes.size(); ++i) {
          const size_t width = static_cast<size_t>(pieces[i]->dims(1)) * element;
          raw->append(bytes[i].data() + static_cast<size_t>(row) * width, width);
        }
      }
    }
    merged.push_back(std::move(joined));
  }
  return merged;
}

absl::Status CheckAdapterFitsModel(const std::vector<onnx::TensorProto>& parameters, const onnx::ModelProto& model) {
  std::map<std::string, const onnx::ValueInfoProto*> inputs;
  for (const onnx::ValueInfoProto* input : AdapterInputs(model)) inputs[input->name()] = input;
  std::map<std::string, std::map<char, int64_t>> ranks;  // module -> matrix -> rank
  for (const onnx::TensorProto& tensor : parameters) {
    auto it = inputs.find(tensor.name());
    if (it == inputs.end()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                     absl::StrCat("'", tensor.name(), "' is no adapter input of the model (it has ", inputs.size(),
                                  inputs.empty() ? "; extract_adapters makes them)" : ")"));
    }
    const auto& type = it->second->type().tensor_type();
    if (tensor.dims_size() != 2) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                     absl::StrCat("'", tensor.name(), "' has rank ", tensor.dims_size(), "; LoRA matrices have 2"));
    }
    if (type.elem_type() != tensor.data_type()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                     absl::StrCat("'", tensor.name(), "' is of element type ", tensor.data_type(), "; the model takes ",
                                  type.elem_type()));
    }
    if (type.shape().dim_size() != tensor.dims_size()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                     absl::StrCat("'", tensor.name(), "' has rank ", tensor.dims_size(), "; the model takes ",
                                  type.shape().dim_size()));
    }
    for (int d = 0; d < tensor.dims_size(); ++d) {
      const auto& dim = type.shape().dim(d);
      if (dim.has_dim_value() && dim.dim_value() != tensor.dims(d)) {
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                       absl::StrCat("'", tensor.name(), "' is [", absl::StrJoin(tensor.dims(), ", "),
                                    "]; the model takes ", dim.dim_value(), " along axis ", d));
      }
    }
    char which = 0;
    std::string module;
    ParseAdapterParameterName(tensor.name(), &which, &module);
    ranks[module][which] = tensor.dims(which == 'A' ? 1 : 0);
  }
  for (const auto& [module, matrices] : ranks) {
    if (matrices.size() != 2) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                     absl::StrCat("module '", module, "' has lora_", std::string(1, matrices.begin()->first),
                                  " but not the other matrix"));
    }
    if (matrices.at('A') != matrices.at('B')) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                     absl::StrCat("module '", module, "' has rank ", matrices.at('A'), " in lora_A and ",
                                  matrices.at('B'), " in lora_B"));
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxopt
