// Shape rules onnx 1.12's inference lacks for exported transformers, applied node by node during
// onnxopt's own inference sweep (shape_inference.h).
//
// Reshape targets in exports are computed at run time from Shape (Shape -> Gather -> Unsqueeze ->
// Concat -> Reshape). The rules track the values of small integer tensors symbolically (each element
// a number or a named dimension), give Reshape outputs their shape (0 copies the input's dim, -1 is
// solved by dividing symbolic products), and resolve a broadcast dim that onnx left unknown to the
// agreeing known non-1 size of the other inputs: any other value would make the model fail, and
// rewrites only need to agree with the original on inputs it accepts. ONNX Runtime's fused operators
// get their output shapes here too where their schemas leave them open.
#ifndef ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_
#define ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/arena.h"
#include "onnx/onnx_pb.h"

namespace onnxopt {

// Messages by value name. The messages and the names live on an arena the map owns: building and
// dropping a map of 100k heap messages at every inference was a seventh of a transformer pipeline,
// and a heap copy of every name a tenth of what a sweep spent on its own.
template <typename Message>
class MessagesByName {
 public:
  MessagesByName() : arena_(std::make_unique<google::protobuf::Arena>()) {}
  MessagesByName(MessagesByName&&) = default;
  MessagesByName& operator=(MessagesByName&&) = default;

  const Message* Find(absl::string_view name) const {
    auto it = messages_.find(name);
    return it == messages_.end() ? nullptr : it->second;
  }
  Message* FindMutable(absl::string_view name) {
    auto it = messages_.find(name);
    return it == messages_.end() ? nullptr : it->second;
  }
  // The message of `name`, added empty if there is none.
  Message* GetOrAdd(absl::string_view name) {
    return Emplace(name, [this] { return New(); }).first;
  }
  void Erase(absl::string_view name) { messages_.erase(name); }
  // An empty message on this map's arena.
  Message* New() { return google::protobuf::Arena::CreateMessage<Message>(arena_.get()); }
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [name, message] : messages_) fn(name, message);
  }

 protected:
  // Adds `name` with make()'s message unless it has one (one lookup either way); the key is a copy of
  // the name on the arena. Returns the name's message and whether it was added.
  template <typename Make>
  std::pair<Message*, bool> Emplace(absl::string_view name, Make make) {
    bool added = false;
    auto it = messages_.lazy_emplace(name, [&](const auto& construct) {
      char* copy = google::protobuf::Arena::CreateArray<char>(arena_.get(), name.size());
      std::copy(name.begin(), name.end(), copy);
      construct(absl::string_view(copy, name.size()), make());
      added = true;
    });
    return {it->second, added};
  }

 private:
  std::unique_ptr<google::protobuf::Arena> arena_;  // declared first: the names and messages die with it
  absl::flat_hash_map<absl::string_view, Message*> messages_;
};

// Types by value name.
class TypeMap : public MessagesByName<onnx::TypeProto> {
 public:
  // Adds `name` with a copy of `type` unless it has a type already.
  void AddIfAbsent(absl::string_view name, const onnx::TypeProto& type) {
    Emplace(name, [&] {
      onnx::TypeProto* copy = New();
      *copy = type;
      return copy;
    });
  }
  // Adds `name` with `type`, which must come from New(); false (and nothing changed) if it has one.
  bool AddNew(absl::string_view name, onnx::TypeProto* type) {
    return Emplace(name, [type] { return type; }).second;
  }
  // AddNew in one lookup, for a name that may have a type: nullptr if `type` was added, else the
  // type `name` has (and `type` is left unused).
  onnx::TypeProto* AddNewOrFind(absl::string_view name, onnx::TypeProto* type) {
    auto [present, added] = Emplace(name, [type] { return type; });
    return added ? nullptr : present;
  }
};

// Node outputs that are small integer tensors (shape arithmetic) whose every element the shapes fix
// to a number or a named dim, e.g. the static last dim of a [batch, sequence, 64] tensor read through
// Shape -> Gather, key_length - query_length when both are the same symbolic dim (0), or "sequence".
using KnownIntValues = absl::flat_hash_map<std::string, std::vector<onnx::TensorShapeProto::Dimension>>;

// Declared dims that name a sum the sweep works out: a cache's present declared [.., total_sequence, ..]
// that is the Concat of the past [.., past_sequence, ..] and the new keys [.., sequence, ..] says
// total_sequence = past_sequence + sequence. A sweep that starts from them reads every declared
// total_sequence as that sum, so a mask expanded from attention_mask [batch, total_sequence] to a
// computed [.., sequence, past_sequence + sequence] and the scores over the concatenated keys have one
// key length. The name, by the sum's spelling (dim_sums.h).
using DimAliases = absl::flat_hash_map<std::string, std::string>;

class SymbolicShapes {
 public:
  // `opset`: the model's default-domain opset (Shape's start/end exist from 15).
  explicit SymbolicShapes(int64_t opset);
  ~SymbolicShapes();
  SymbolicShapes(const SymbolicShapes&) = delete;
  SymbolicShapes& operator=(const SymbolicShapes&) = delete;

  // An initializer: its value is tracked when it is a small integer tensor.
  void TrackConstant(const std::string& name, const onnx::TensorProto& tensor);
  // Called for every node in topological order, after onnx's inference of it: improves the types of
  // its outputs in `types` and tracks the value of its first output. Returns the outputs improved.
  int Apply(const onnx::NodeProto& node, TypeMap* types);
  // The tracked value of `name` in onnx's data-propagation form (unknown elements as empty dims).
  bool ShapeData(const std::string& name, onnx::TensorShapeProto* data) const;
  // Adds to `known` the computed values (not Constants) whose every element is known.
  void AddKnown(KnownIntValues* known) const;
  // The declared dims this sweep found to be sums (DimAliases), by their names.
  const DimAliases& learned_aliases() const;
  // A graph output declared with dim `declared` whose rule computes `computed` there (a first step's
  // present declared [.., total_sequence, ..] over keys [.., sequence, ..]): `declared` names
  // `computed`. Numbers and generated names say nothing.
  void NoteDeclaredDim(const onnx::TensorShapeProto::Dimension& declared,
                       const onnx::TensorShapeProto::Dimension& computed);

 private:
  struct State;  // the tracked values
  int64_t opset_;
  std::unique_ptr<State> state_;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_SYMBOLIC_SHAPES_H_
