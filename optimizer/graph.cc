#include "optimizer/graph.h"

#include <algorithm>
#include <queue>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"

namespace onnxopt {
namespace {

// Keeps the elements of a repeated field for which keep(element) is true, in their order.
template <typename T, typename Keep>
void CompactRepeated(google::protobuf::RepeatedPtrField<T>* field, Keep keep) {
  int write = 0;
  for (int read = 0; read < field->size(); ++read) {
    if (!keep(field->Get(read))) continue;
    if (write != read) field->SwapElements(write, read);
    ++write;
  }
  while (field->size() > write) field->RemoveLast();
}

}  // namespace

bool Graph::BySequence(const Node* a, const Node* b) { return a->sequence_ < b->sequence_; }

const onnx::AttributeProto* FindAttribute(const onnx::NodeProto& node, absl::string_view name) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.name() == name) return &attribute;
  }
  return nullptr;
}

int64_t GetAttributeInt(const onnx::NodeProto& node, absl::string_view name, int64_t fallback) {
  const onnx::AttributeProto* attribute = FindAttribute(node, name);
  return attribute != nullptr ? attribute->i() : fallback;
}

const onnx::AttributeProto* Node::FindAttribute(absl::string_view name) const {
  return onnxopt::FindAttribute(proto_, name);
}

int64_t Node::GetAttributeInt(absl::string_view name, int64_t default_value) const {
  return onnxopt::GetAttributeInt(proto_, name, default_value);
}

onnx::NodeProto Node::ProtoWithBodies() const {
  onnx::NodeProto copy = proto_;
  size_t next = 0;  // subgraphs_ follow the attributes' order (TakeSubgraphs)
  auto fill = [&](onnx::GraphProto* body) {
    const Graph& graph = *subgraphs_[next++];
    body->clear_node();
    for (const Node* inner : graph.Nodes()) *body->add_node() = inner->ProtoWithBodies();
  };
  for (auto& attribute : *copy.mutable_attribute()) {
    if (attribute.has_g()) fill(attribute.mutable_g());
    for (auto& body : *attribute.mutable_graphs()) fill(&body);
  }
  return copy;
}

float Node::GetAttributeFloat(absl::string_view name, float default_value) const {
  const onnx::AttributeProto* attribute = FindAttribute(name);
  return attribute != nullptr ? attribute->f() : default_value;
}

Graph::Graph(onnx::GraphProto* proto) : Graph(proto, nullptr) {}

Graph::Graph(onnx::GraphProto* proto, Graph* root) : proto_(proto), root_(root != nullptr ? root : this) {
  for (const auto& input : proto_->input()) graph_inputs_.insert(input.name());
  for (const auto& output : proto_->output()) ++graph_outputs_[output.name()];
  for (const auto& initializer : proto_->initializer()) initializers_[initializer.name()] = &initializer;

  nodes_.reserve(proto_->node_size());
  // A graph stored in topological order (exporters write one) is what TopologicalOrder() would
  // give: the first checkpoint can then take its fast path too.
  bool topological = true;
  for (int i = 0; i < proto_->node_size(); ++i) {
    std::unique_ptr<Node> node(new Node());
    node->proto_.Swap(proto_->mutable_node(i));
    node->order_ = i;
    node->sequence_ = next_sequence_++;
    TakeSubgraphs(node.get());
    for (const auto& output : node->proto_.output()) {
      if (topological && !output.empty() && consumers_.contains(output)) topological = false;  // read before written
    }
    IndexNode(node.get());
    ++live_nodes_;
    nodes_.push_back(std::move(node));
  }
  checkpointed_sequence_ = next_sequence_;
  topological_ = topological;
}

Graph::~Graph() = default;

void Graph::TakeSubgraphs(Node* node) {
  for (auto& attribute : *node->proto_.mutable_attribute()) {
    if (attribute.has_g()) node->subgraphs_.emplace_back(new Graph(attribute.mutable_g(), root_));
    for (auto& graph : *attribute.mutable_graphs()) node->subgraphs_.emplace_back(new Graph(&graph, root_));
  }
  if (!node->subgraphs_.empty()) ++nodes_with_bodies_;
  for (const auto& subgraph : node->subgraphs_) subgraph->CollectOuterReads(&node->implicit_inputs_);
}

std::string OpKey(const onnx::NodeProto& node) {
  const bool default_domain = node.domain().empty() || node.domain() == "ai.onnx";
  return default_domain ? node.op_type() : absl::StrCat(node.domain(), "::", node.op_type());
}

void Graph::CountOps(const Node& node, int sign) {
  root_->op_delta_[OpKey(node.proto_)] += sign;
  for (const auto& subgraph : node.subgraphs_) {
    for (const auto& inner : subgraph->nodes_) {
      if (!inner->removed_) subgraph->CountOps(*inner, sign);
    }
  }
}

std::vector<const Node*> Graph::TakeAddedNodes() {
  std::vector<const Node*> added;
  for (Node* node : added_since_take_) {
    if (!node->removed_) added.push_back(node);
  }
  added_since_take_.clear();
  std::sort(added.begin(), added.end(), BySequence);
  return added;
}

std::vector<std::string> Graph::TakeAddedInitializers() {
  std::vector<std::string> added;
  added.swap(added_initializers_);
  return added;
}

std::vector<std::string> Graph::TakeVanishedValues() {
  std::vector<std::string> vanished;
  vanished.swap(vanished_);
  return vanished;
}

std::map<std::string, int64_t> Graph::TakeOpDelta() {
  std::map<std::string, int64_t> delta;
  for (const auto& [op, count] : op_delta_) {
    if (count != 0) delta.emplace(op, count);
  }
  op_delta_.clear();
  return delta;
}

void Graph::CollectOuterReads(std::unordered_set<std::string>* out) const {
  for (const auto& node : nodes_) {
    if (node->removed_) continue;
    for (const auto& input : node->proto_.input()) {
      if (!input.empty() && !IsDefinedHere(input)) out->insert(input);
    }
    for (const auto& implicit : node->implicit_inputs_) {
      if (!IsDefinedHere(implicit)) out->insert(implicit);
    }
  }
  for (const auto& output : proto_->output()) {
    if (!IsDefinedHere(output.name())) out->insert(output.name());
  }
}

bool Graph::IsDefinedHere(const std::string& value) const {
  return producer_.count(value) > 0 || graph_inputs_.count(value) > 0 || initializers_.count(value) > 0;
}

// Reader lists stay sorted by creation (sequence), so Consumers() needs no sort: readers are mostly
// added last, where the insert is an append.
void Graph::AddConsumer(const std::string& value, Node* node) {
  if (value.empty()) return;
  auto& list = consumers_[value];
  if (list.empty() || list.back()->sequence_ <= node->sequence_) {
    list.push_back(node);
    return;
  }
  auto at = std::upper_bound(list.begin(), list.end(), node->sequence_,
                             [](uint64_t sequence, const Node* reader) { return sequence < reader->sequence_; });
  list.insert(at, node);
}

void Graph::RemoveConsumer(const std::string& value, Node* node) {
  auto it = consumers_.find(value);
  if (it == consumers_.end()) return;
  auto& list = it->second;
  // From the back: the most recently indexed readers are the likeliest to go.
  auto position = std::find(list.rbegin(), list.rend(), node);
  if (position != list.rend()) list.erase(std::next(position).base());
  if (list.empty()) consumers_.erase(it);
}

void Graph::IndexNode(Node* node) {
  for (const auto& output : node->proto_.output()) {
    if (output.empty()) continue;
    producer_[output] = node;
    RememberName(output);
  }
  for (const auto& input : node->proto_.input()) AddConsumer(input, node);
  for (const auto& implicit : node->implicit_inputs_) AddConsumer(implicit, node);
}

void Graph::UnindexNode(Node* node) {
  for (const auto& output : node->proto_.output()) {
    auto it = producer_.find(output);
    if (it != producer_.end() && it->second == node) {
      producer_.erase(it);
      dropped_values_.insert(output);
    }
  }
  for (const auto& input : node->proto_.input()) RemoveConsumer(input, node);
  for (const auto& implicit : node->implicit_inputs_) RemoveConsumer(implicit, node);
}

std::vector<Node*> Graph::Nodes() const {
  std::vector<Node*> live;
  live.reserve(live_nodes_);
  if (static_cast<int64_t>(nodes_.size()) == live_nodes_) {
    // Nothing removed since the last checkpoint: the pointers alone, without touching every node.
    for (const auto& node : nodes_) live.push_back(node.get());
    return live;
  }
  for (const auto& node : nodes_) {
    if (!node->removed_) live.push_back(node.get());
  }
  return live;
}

int64_t Graph::NodeCountRecursive() const {
  if (nodes_with_bodies_ == 0) return live_nodes_;
  int64_t count = 0;
  for (const auto& node : nodes_) {
    if (node->removed_) continue;
    ++count;
    for (const auto& subgraph : node->subgraphs_) count += subgraph->NodeCountRecursive();
  }
  return count;
}

Node* Graph::Producer(const std::string& value) const {
  auto it = producer_.find(value);
  return it == producer_.end() ? nullptr : it->second;
}

std::vector<Node*> Graph::Consumers(const std::string& value) const {
  auto it = consumers_.find(value);
  if (it == consumers_.end()) return {};
  std::vector<Node*> result = it->second;  // sorted by sequence: a node reading twice is adjacent
  result.erase(std::unique(result.begin(), result.end()), result.end());
  return result;
}

bool Graph::HasConsumers(const std::string& value) const { return consumers_.count(value) > 0; }

const std::vector<Node*>& Graph::Readers(const std::string& value) const {
  static const std::vector<Node*> kNone;
  auto it = consumers_.find(value);
  return it == consumers_.end() ? kNone : it->second;
}

Node* Graph::SoleReader(const std::string& value) const {
  const std::vector<Node*>& readers = Readers(value);
  // Entries of one node are adjacent: the first and last are the same node only if it is the one.
  return !readers.empty() && readers.front() == readers.back() ? readers.front() : nullptr;
}

const onnx::TensorProto* Graph::Initializer(const std::string& name) const {
  auto it = initializers_.find(name);
  return it == initializers_.end() ? nullptr : it->second;
}

Node* Graph::AddNode(onnx::NodeProto proto, const Node* anchor, bool after) {
  std::unique_ptr<Node> node(new Node());
  node->proto_ = std::move(proto);
  if (anchor != nullptr) {
    node->order_ = after ? anchor->order_ : anchor->order_ - 0.5;
  } else {
    node->order_ = nodes_.empty() ? 0 : nodes_.back()->order_ + 1;
  }
  node->sequence_ = next_sequence_++;
  TakeSubgraphs(node.get());
  if (root_->names_collected_) {
    for (const auto& subgraph : node->subgraphs_) subgraph->CollectGeneratedNames(&root_->used_names_);
  }
  IndexNode(node.get());
  CountOps(*node, +1);
  ++live_nodes_;
  changed_ = true;
  touched_.push_back(node.get());
  added_.push_back(node.get());
  RememberName(node->proto_.name());
  nodes_.push_back(std::move(node));
  return nodes_.back().get();
}

void Graph::RemoveNode(Node* node) {
  if (node->removed_) return;
  UnindexNode(node);
  CountOps(*node, -1);
  node->removed_ = true;
  --live_nodes_;
  if (!node->subgraphs_.empty()) --nodes_with_bodies_;
  changed_ = true;
}

void Graph::SetInput(Node* node, int index, const std::string& value) {
  RemoveConsumer(node->proto_.input(index), node);
  node->proto_.set_input(index, value);
  AddConsumer(value, node);
  CheckRewiredInput(node, value.empty() ? nullptr : Producer(value));
  changed_ = true;
}

// Node positions (order_, sequence_) do not move between checkpoints, so an edge that is in order
// when it is made stays so; edges the checkpoint must check are those made since. Checking a rewired
// input here costs one lookup, where checking its node at the checkpoint cost one per input of a
// node touched as often as it was rewired (thousands of readers of merged twins).
void Graph::CheckRewiredInput(const Node* reader, const Node* producer) {
  if (producer != nullptr && producer != reader && !EmittedBefore(producer, reader)) order_broken_ = true;
}

void Graph::ReplaceInitializer(onnx::TensorProto tensor) {
  auto it = initializers_.find(tensor.name());
  if (it == initializers_.end()) return;
  // The index points into proto_'s repeated field, which this Graph owns for editing.
  *const_cast<onnx::TensorProto*>(it->second) = std::move(tensor);
  // Its type may be another now: what was known of it goes, as of a value that went.
  if (root_ == this) {
    vanished_.push_back(it->first);
    added_initializers_.push_back(it->first);
  }
  changed_ = true;
}

void Graph::SetOutput(Node* node, int index, const std::string& name) {
  const std::string old = node->proto_.output(index);
  auto it = producer_.find(old);
  if (it != producer_.end() && it->second == node) {
    producer_.erase(it);
    dropped_values_.insert(old);
  }
  node->proto_.set_output(index, name);
  producer_[name] = node;
  RememberName(name);
  touched_.push_back(node);
  changed_ = true;
}

void Graph::RenameInSubgraphs(Node* node, const std::string& from, const std::string& to) {
  for (const auto& subgraph : node->subgraphs_) subgraph->RenameOuterUse(from, to);
}

void Graph::ReplaceAllUsesWith(const std::string& from_name, const std::string& to_name) {
  // Copies: callers pass names that live in node protos this function rewrites (a reader's input).
  const std::string from = from_name, to = to_name;
  if (from == to) return;
  changed_ = true;
  auto it = consumers_.find(from);
  if (it == consumers_.end()) return;
  std::vector<Node*> readers = std::move(it->second);
  consumers_.erase(it);
  const Node* producer = Producer(to);
  const Node* previous = nullptr;
  for (Node* node : readers) {
    if (node == previous) continue;  // a node reading `from` twice is listed twice, adjacent
    previous = node;
    CheckRewiredInput(node, producer);
    for (int i = 0; i < node->proto_.input_size(); ++i) {
      if (node->proto_.input(i) == from) node->proto_.set_input(i, to);
    }
    if (node->implicit_inputs_.erase(from) > 0) {
      node->implicit_inputs_.insert(to);
      RenameInSubgraphs(node, from, to);  // the bodies' own indexes, not this graph's
    }
  }
  // Merging thousands of twins into one value one at a time must not cost a walk of its whole list
  // each time: a few readers are placed by binary search, more are merged from where they start.
  // (Merging always, even one reader, was slower: inplace_merge takes a buffer every call.)
  auto& target = consumers_[to];
  if (readers.size() <= 8) {
    for (Node* reader : readers) {
      target.insert(std::upper_bound(target.begin(), target.end(), reader, BySequence), reader);
    }
  } else {
    const auto start = std::upper_bound(target.begin(), target.end(), readers.front(), BySequence) - target.begin();
    const auto middle = target.insert(target.end(), readers.begin(), readers.end());
    std::inplace_merge(target.begin() + start, middle, target.end(), BySequence);
  }
}

void Graph::RenameGraphOutput(const std::string& from, const std::string& to) {
  auto it = graph_outputs_.find(from);
  if (it != graph_outputs_.end()) {
    for (auto& output : *proto_->mutable_output()) {
      if (output.name() == from) output.set_name(to);
    }
    const int times = it->second;
    graph_outputs_.erase(it);
    graph_outputs_[to] += times;
  }
}

void Graph::RenameOuterUse(const std::string& from, const std::string& to) {
  ReplaceAllUsesWith(from, to);
  RenameGraphOutput(from, to);
}

absl::Status Graph::RenameValue(const std::string& from_name, const std::string& to_name) {
  // Copies, as in ReplaceAllUsesWith: renaming the readers of `from` would otherwise change it midway
  // (a name taken from a reader's input), and the graph-output rename then dropped the output.
  const std::string from = from_name, to = to_name;
  Node* producer = Producer(from);
  if (producer == nullptr || IsGraphInput(from) || Initializer(from) != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot rename '", from, "': not a node output of this graph"));
  }
  if (IsDefinedHere(to)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot rename '", from, "' to '", to, "': name in use"));
  }
  for (int i = 0; i < producer->proto_.output_size(); ++i) {
    if (producer->proto_.output(i) == from) producer->proto_.set_output(i, to);
  }
  producer_.erase(from);
  producer_[to] = producer;
  touched_.push_back(producer);
  RememberName(to);
  ReplaceAllUsesWith(from, to);
  RenameGraphOutput(from, to);
  // Keep the type information of `from` under its new name unless `to` already has its own.
  bool to_has_info = false;
  for (const auto& value_info : proto_->value_info()) to_has_info |= value_info.name() == to;
  if (!to_has_info) {
    for (auto& value_info : *proto_->mutable_value_info()) {
      if (value_info.name() == from) value_info.set_name(to);
    }
  }
  dropped_values_.insert(from);  // the name is gone (its value_info, if any, moved to `to` above)
  changed_ = true;
  return absl::OkStatus();
}

void Graph::RemoveInitializer(const std::string& name) {
  if (initializers_.erase(name) == 0) return;
  removed_initializers_.insert(name);
  changed_ = true;
}

void Graph::RemoveGraphInput(const std::string& name) {
  if (graph_inputs_.erase(name) == 0) return;
  CompactRepeated(proto_->mutable_input(), [&](const onnx::ValueInfoProto& input) { return input.name() != name; });
  changed_ = true;
}

void Graph::AddGraphInput(onnx::ValueInfoProto input) {
  graph_inputs_.insert(input.name());
  RememberName(input.name());
  *proto_->add_input() = std::move(input);
  changed_ = true;
}

const onnx::TensorProto* Graph::AddInitializer(onnx::TensorProto tensor) {
  onnx::TensorProto* added = proto_->add_initializer();
  *added = std::move(tensor);
  removed_initializers_.erase(added->name());
  initializers_[added->name()] = added;
  if (root_ == this) added_initializers_.push_back(added->name());
  RememberName(added->name());
  changed_ = true;
  return added;
}

void Graph::ForEachGraph(const std::function<void(Graph&)>& fn) {
  fn(*this);
  if (nodes_with_bodies_ == 0) return;
  for (const auto& node : nodes_) {
    if (node->removed_) continue;
    for (const auto& subgraph : node->subgraphs_) subgraph->ForEachGraph(fn);
  }
}

namespace {
constexpr absl::string_view kGeneratedInfix = "_onnxopt_";
}  // namespace

// Only names with the infix can equal a generated one, so only those are kept: hashing every name
// of a 100k-node graph for each pass that adds a node cost more than the passes' own work.
void Graph::CollectGeneratedNames(absl::flat_hash_set<std::string>* names) const {
  auto collect = [&](const std::string& name) {
    if (absl::StrContains(name, kGeneratedInfix)) names->insert(name);
  };
  for (const auto& value : proto_->input()) collect(value.name());
  for (const auto& value : proto_->output()) collect(value.name());
  for (const auto& value : proto_->value_info()) collect(value.name());
  for (const auto& tensor : proto_->initializer()) collect(tensor.name());
  for (const auto& node : nodes_) {
    collect(node->proto_.name());  // node names share the space: ONNX Runtime wants them unique too
    for (const auto& name : node->proto_.input()) collect(name);
    for (const auto& name : node->proto_.output()) collect(name);
    for (const auto& subgraph : node->subgraphs_) subgraph->CollectGeneratedNames(names);
  }
}

void Graph::RememberName(const std::string& name) {
  Graph& root = *root_;
  if (root.names_collected_ && absl::StrContains(name, kGeneratedInfix)) root.used_names_.insert(name);
}

// One namespace for the main graph and every body: a body's value must not shadow an outer one, so
// a name generated in either is taken in both. Names are reserved for the Graph's whole life (a
// checkpoint keeps them), so a generated name never comes back for another value in a later pass.
std::string Graph::UniqueName(absl::string_view hint) {
  Graph& root = *root_;
  if (!root.names_collected_) {  // built on first use: most pipelines name little
    root.CollectGeneratedNames(&root.used_names_);
    root.names_collected_ = true;
  }
  std::string candidate;
  do {
    candidate = absl::StrCat(hint, kGeneratedInfix, root.unique_counter_++);
  } while (root.used_names_.count(candidate) > 0);
  root.used_names_.insert(candidate);
  return candidate;
}

std::vector<Node*> Graph::TopologicalOrder() const {
  // Kahn's algorithm, the ready node earliest in (order, sequence) first. Counts and marks live in
  // the nodes; a node's dependents are the readers of its outputs.
  using Key = std::tuple<double, uint64_t, Node*>;
  auto ready = std::priority_queue<Key, std::vector<Key>, std::greater<Key>>();
  std::vector<Node*> producers;
  for (const auto& node : nodes_) {
    if (node->removed_) continue;
    producers.clear();
    auto add_dependency = [&](const std::string& value) {
      Node* producer = Producer(value);
      if (producer != nullptr && producer != node.get() &&
          std::find(producers.begin(), producers.end(), producer) == producers.end()) {
        producers.push_back(producer);
      }
    };
    for (const auto& input : node->proto_.input()) add_dependency(input);
    for (const auto& implicit : node->implicit_inputs_) add_dependency(implicit);
    node->pending_producers_ = static_cast<int>(producers.size());
    node->last_released_by_ = nullptr;
    if (producers.empty()) ready.emplace(node->order_, node->sequence_, node.get());
  }
  std::vector<Node*> order;
  order.reserve(live_nodes_);
  while (!ready.empty()) {
    Node* node = std::get<2>(ready.top());
    ready.pop();
    order.push_back(node);
    for (const auto& output : node->proto_.output()) {
      if (output.empty() || Producer(output) != node) continue;  // a name defined twice counts once
      auto readers = consumers_.find(output);
      if (readers == consumers_.end()) continue;
      for (Node* reader : readers->second) {
        // Once per (producer, reader), however many of its values the reader reads.
        if (reader == node || reader->last_released_by_ == node) continue;
        reader->last_released_by_ = node;
        if (--reader->pending_producers_ == 0) ready.emplace(reader->order_, reader->sequence_, reader);
      }
    }
  }
  return order;
}

bool Graph::ChangedInside() const {
  if (changed_) return true;
  if (nodes_with_bodies_ == 0) return false;
  for (const auto& node : nodes_) {
    if (node->removed_) continue;
    for (const auto& subgraph : node->subgraphs_) {
      if (subgraph->ChangedInside()) return true;
    }
  }
  return false;
}

bool Graph::EmittedBefore(const Node* a, const Node* b) {
  return a->order_ < b->order_ || (a->order_ == b->order_ && a->sequence_ < b->sequence_);
}

void Graph::Renumber() {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i]->order_ = static_cast<double>(i);
    nodes_[i]->sequence_ = i;
  }
  next_sequence_ = nodes_.size();
  checkpointed_sequence_ = next_sequence_;
}

// Edges change only at touched nodes (added, outputs or implicit inputs changed) and at rewired
// inputs, checked as they were made (CheckRewiredInput): if nothing was out of order then and every
// touched node still comes after the producers of what it reads and before the readers of what it
// writes, the emission order of the whole graph is still topological.
bool Graph::EditsKeptTheOrder() const {
  if (order_broken_) return false;
  for (const Node* node : touched_) {
    if (node->removed_) continue;
    auto produced_before = [&](const std::string& value) {
      const Node* producer = Producer(value);
      return producer == nullptr || producer == node || EmittedBefore(producer, node);
    };
    for (const auto& input : node->proto_.input()) {
      if (!produced_before(input)) return false;
    }
    for (const auto& implicit : node->implicit_inputs_) {
      if (!produced_before(implicit)) return false;
    }
    for (const auto& output : node->proto_.output()) {
      if (output.empty() || Producer(output) != node) continue;
      auto readers = consumers_.find(output);
      if (readers == consumers_.end()) continue;
      for (const Node* reader : readers->second) {
        if (reader != node && !EmittedBefore(node, reader)) return false;
      }
    }
  }
  return true;
}

void Graph::RefreshImplicitInputs(Node* node) {
  std::unordered_set<std::string> reads;
  for (const auto& subgraph : node->subgraphs_) subgraph->CollectOuterReads(&reads);
  if (reads == node->implicit_inputs_) return;
  for (const auto& implicit : node->implicit_inputs_) RemoveConsumer(implicit, node);
  node->implicit_inputs_ = std::move(reads);
  for (const auto& implicit : node->implicit_inputs_) AddConsumer(implicit, node);
  touched_.push_back(node);
  changed_ = true;
}

// Drops removed initializers and the value_info of values a pass removed; everything else stays.
void Graph::CompactTensorsAndValueInfo() {
  if (!removed_initializers_.empty()) {
    CompactRepeated(proto_->mutable_initializer(), [&](const onnx::TensorProto& tensor) {
      return removed_initializers_.count(tensor.name()) == 0 || initializers_.count(tensor.name()) > 0;
    });
  }
  CompactRepeated(proto_->mutable_value_info(), [&](const onnx::ValueInfoProto& info) {
    const bool dropped = dropped_values_.count(info.name()) > 0 || removed_initializers_.count(info.name()) > 0;
    return !dropped || IsDefinedHere(info.name());
  });
}

absl::Status Graph::Checkpoint() {
  if (committed_) return absl::FailedPreconditionError("graph already committed");
  for (const auto& node : nodes_) {
    if (nodes_with_bodies_ == 0) break;
    if (node->removed_ || node->subgraphs_.empty()) continue;
    bool inner_changed = false;
    for (const auto& subgraph : node->subgraphs_) {
      inner_changed |= subgraph->ChangedInside();
      absl::Status status = subgraph->Checkpoint();
      if (!status.ok()) return status;
    }
    // A pass on the body may have dropped or added reads of this graph's values.
    if (inner_changed) RefreshImplicitInputs(node.get());
  }
  if (!changed_) return absl::OkStatus();
  // touched_ and added_ may name removed nodes: read them before those are freed.
  const bool order_kept = topological_ && EditsKeptTheOrder();
  std::vector<Node*> live_added;
  for (Node* node : added_) {
    if (!node->removed_) live_added.push_back(node);
  }
  touched_.clear();
  order_broken_ = false;
  added_.clear();
  added_since_take_.erase(std::remove_if(added_since_take_.begin(), added_since_take_.end(),
                                         [](const Node* node) { return node->removed_; }),
                          added_since_take_.end());
  if (static_cast<int64_t>(nodes_.size()) != live_nodes_) {
    nodes_.erase(
        std::remove_if(nodes_.begin(), nodes_.end(), [](const std::unique_ptr<Node>& node) { return node->removed_; }),
        nodes_.end());
  }
  if (order_kept) {
    // Emission order is already topological, so it is what TopologicalOrder() would return (Kahn's
    // algorithm taking the earliest ready node emits a topological sequence in its own order).
    // nodes_ runs in sequence: the nodes kept from the last checkpoint, already in emission order,
    // then those added since, which are sorted and merged in.
    if (live_added.empty()) {
      // Only removals and rewiring: the order left is the order kept, and numbers may keep their gaps.
      checkpointed_sequence_ = next_sequence_;
    } else {
      auto emitted_before = [](const std::unique_ptr<Node>& a, const std::unique_ptr<Node>& b) {
        return EmittedBefore(a.get(), b.get());
      };
      auto first_added = std::partition_point(nodes_.begin(), nodes_.end(), [&](const std::unique_ptr<Node>& node) {
        return node->sequence_ < checkpointed_sequence_;
      });
      std::sort(first_added, nodes_.end(), emitted_before);
      std::inplace_merge(nodes_.begin(), first_added, nodes_.end(), emitted_before);
      Renumber();
      // Only lists with a node added since the last checkpoint can be out of the new order; each is
      // sorted once (a shared constant may have thousands of readers, many of them new).
      absl::flat_hash_set<std::string> resort;
      for (Node* node : live_added) {
        for (const auto& input : node->proto_.input()) {
          if (!input.empty()) resort.insert(input);
        }
        for (const auto& implicit : node->implicit_inputs_) resort.insert(implicit);
      }
      for (const std::string& value : resort) {
        auto readers = consumers_.find(value);
        if (readers != consumers_.end()) std::sort(readers->second.begin(), readers->second.end(), BySequence);
      }
    }
  } else {
    std::vector<Node*> order = TopologicalOrder();
    if (static_cast<int64_t>(order.size()) != live_nodes_) {
      return absl::InternalError(absl::StrCat("graph '", proto_->name(), "' has a cycle after rewriting"));
    }
    for (size_t i = 0; i < order.size(); ++i) order[i]->sequence_ = i;
    std::sort(nodes_.begin(), nodes_.end(),
              [](const std::unique_ptr<Node>& a, const std::unique_ptr<Node>& b) { return a->sequence_ < b->sequence_; });
    Renumber();
    for (auto& [value, readers] : consumers_) std::sort(readers.begin(), readers.end(), BySequence);
  }
  topological_ = true;
  if (root_ == this) {  // only the main graph's values have shapes kept about them
    added_since_take_.insert(added_since_take_.end(), live_added.begin(), live_added.end());
    for (const auto* names : {&dropped_values_, &removed_initializers_}) {
      for (const auto& name : *names) {
        if (!IsDefinedHere(name)) vanished_.push_back(name);
      }
    }
  }
  if (!removed_initializers_.empty() || !dropped_values_.empty()) CompactTensorsAndValueInfo();
  if (!removed_initializers_.empty()) {
    initializers_.clear();
    for (const auto& initializer : proto_->initializer()) initializers_[initializer.name()] = &initializer;
  }
  removed_initializers_.clear();
  dropped_values_.clear();
  changed_ = false;
  reordered_ = true;
  return absl::OkStatus();
}

absl::Status Graph::Commit() {
  if (committed_) return absl::FailedPreconditionError("graph already committed");
  committed_ = true;
  for (const auto& node : nodes_) {
    if (node->removed_) continue;
    for (const auto& subgraph : node->subgraphs_) {
      absl::Status status = subgraph->Commit();
      if (!status.ok()) return status;
    }
  }
  if (!changed_ && !reordered_) {
    // Untouched: every node goes back to the slot it came from.
    for (size_t i = 0; i < nodes_.size(); ++i) proto_->mutable_node(static_cast<int>(i))->Swap(&nodes_[i]->proto_);
    return absl::OkStatus();
  }
  if (!changed_ && topological_) {
    // Untouched since a checkpoint put nodes_ in the order TopologicalOrder() would give.
    proto_->clear_node();
    proto_->mutable_node()->Reserve(static_cast<int>(nodes_.size()));
    for (const auto& node : nodes_) proto_->add_node()->Swap(&node->proto_);
    return absl::OkStatus();
  }
  std::vector<Node*> order = TopologicalOrder();
  if (static_cast<int64_t>(order.size()) != live_nodes_) {
    return absl::InternalError(absl::StrCat("graph '", proto_->name(), "' has a cycle after rewriting"));
  }
  proto_->clear_node();
  proto_->mutable_node()->Reserve(static_cast<int>(order.size()));
  for (Node* node : order) proto_->add_node()->Swap(&node->proto_);
  CompactTensorsAndValueInfo();
  return absl::OkStatus();
}

int64_t CountNodes(const onnx::GraphProto& graph) {
  int64_t count = graph.node_size();
  for (const auto& node : graph.node()) {
    for (const auto& attribute : node.attribute()) {
      if (attribute.has_g()) count += CountNodes(attribute.g());
      for (const auto& subgraph : attribute.graphs()) count += CountNodes(subgraph);
    }
  }
  return count;
}

std::string NodeMetadataValue(const onnx::NodeProto& node, absl::string_view key) {
  constexpr int kNodeMetadataProps = 9;
  const google::protobuf::UnknownFieldSet& unknown = node.GetReflection()->GetUnknownFields(node);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& field = unknown.field(i);
    if (field.number() != kNodeMetadataProps || field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      continue;
    }
    onnx::StringStringEntryProto entry;
    if (entry.ParseFromString(field.length_delimited()) && entry.key() == key) return entry.value();
  }
  return "";
}

}  // namespace onnxopt
