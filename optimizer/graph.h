// Graph IR over onnx::GraphProto.
//
// A Graph takes the nodes of a GraphProto into Node objects while it is being edited and keeps
// producer/consumer indexes, so that a rewrite costs the size of the rewrite, not of the graph.
// Commit() writes the nodes back. The IR is lossless: everything a pass does not touch (metadata,
// doc strings, value_info, unknown fields, other domains) comes out as it went in, and a graph no pass
// edited is written back byte-identical, in its original order. Edited graphs are written in a stable
// topological order: untouched nodes keep their relative order and new nodes sit where they were
// anchored.
//
// Subgraphs (If/Loop/Scan bodies, any graph-valued attribute) are Graphs too, owned by their Node.
// Values a subgraph reads from an outer scope are "implicit inputs" of the node that owns it, so the
// outer graph counts that node as their consumer and renames reach into the subgraph.
#ifndef ONNXOPT_OPTIMIZER_GRAPH_H_
#define ONNXOPT_OPTIMIZER_GRAPH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "onnx/onnx_pb.h"

namespace onnxopt {

class Graph;

class Node {
 public:
  const onnx::NodeProto& proto() const { return proto_; }
  // Views: passes compare them with literals thousands of times a run, and a view compares the
  // lengths first (std::string == "literal" measured its length and called compare, 4% of a run).
  absl::string_view op_type() const { return proto_.op_type(); }
  // "" for the default ONNX domain ("ai.onnx" is normalized to "").
  absl::string_view domain() const {
    const absl::string_view domain = proto_.domain();
    return domain == "ai.onnx" ? absl::string_view() : domain;
  }
  const std::string& name() const { return proto_.name(); }
  int input_size() const { return proto_.input_size(); }
  int output_size() const { return proto_.output_size(); }
  // Optional inputs/outputs may be "" (absent).
  const std::string& input(int i) const { return proto_.input(i); }
  const std::string& output(int i) const { return proto_.output(i); }
  bool removed() const { return removed_; }
  const std::vector<std::unique_ptr<Graph>>& subgraphs() const { return subgraphs_; }
  // Outer-scope values read by this node's subgraphs.
  const std::unordered_set<std::string>& implicit_inputs() const { return implicit_inputs_; }

  const onnx::AttributeProto* FindAttribute(absl::string_view name) const;
  // The node as a self-contained NodeProto: its graph attributes hold their bodies' live nodes (while
  // a Graph holds a body's nodes, the attribute's own node list is empty).
  onnx::NodeProto ProtoWithBodies() const;
  int64_t GetAttributeInt(absl::string_view name, int64_t default_value) const;
  float GetAttributeFloat(absl::string_view name, float default_value) const;

 private:
  friend class Graph;
  Node() = default;

  onnx::NodeProto proto_;
  // Position for emission: original index for loaded nodes, the anchor's for added ones;
  // sequence breaks ties so that nodes added later come later.
  double order_ = 0;
  uint64_t sequence_ = 0;
  bool removed_ = false;
  // Scratch for Graph::TopologicalOrder.
  int pending_producers_ = 0;
  const Node* last_released_by_ = nullptr;
  std::vector<std::unique_ptr<Graph>> subgraphs_;
  std::unordered_set<std::string> implicit_inputs_;
};

class Graph {
 public:
  // Takes the nodes out of `proto` (which must outlive the Graph) until Commit().
  explicit Graph(onnx::GraphProto* proto);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Writes nodes (and those of every subgraph) back into the GraphProto; drops removed initializers
  // and value_info of values that no longer exist. The Graph must not be used afterwards.
  absl::Status Commit();
  // Brings this graph and its subgraphs to the state Commit() and a fresh Graph over the result would
  // give, without giving the nodes back: live nodes in the order Commit would write them (Nodes() is
  // topological again), removed nodes, initializers and stale value_info gone, changed() false. Names
  // UniqueName gave out stay taken. The pass manager calls it between passes and keeps one Graph
  // across them: taking a 100k-node graph apart and writing it back for every pass cost 1.5 us a node
  // a pass.
  // Fails (the Graph still usable, unreordered) if a rewrite left a cycle.
  absl::Status Checkpoint();
  // Operators added minus removed since the last call, over this graph and its subgraphs (call it on
  // the main graph), keyed as OpKey; zero counts left out.
  std::map<std::string, int64_t> TakeOpDelta();
  // Names of this graph that checkpoints since the last call saw go (a removed node's outputs, a
  // renamed value's old name, removed initializers), so that facts kept about them can be dropped.
  std::vector<std::string> TakeVanishedValues();
  // The live nodes of this graph added since the last call, in their order; call it right after a
  // checkpoint (the nodes a later pass removes are freed at its checkpoint).
  std::vector<const Node*> TakeAddedNodes();
  // Names of the main graph's initializers added or replaced since the last call (some may have gone
  // again since).
  std::vector<std::string> TakeAddedInitializers();

  const onnx::GraphProto& proto() const { return *proto_; }
  onnx::GraphProto* mutable_proto() { return proto_; }

  // Live nodes in their current order (removed ones are skipped). Safe to iterate while removing.
  std::vector<Node*> Nodes() const;
  int64_t NodeCount() const { return live_nodes_; }
  // Nodes of this graph and all its subgraphs.
  int64_t NodeCountRecursive() const;

  Node* Producer(const std::string& value) const;
  // Nodes that read `value`, explicitly or through a subgraph; one entry per node, in creation order.
  std::vector<Node*> Consumers(const std::string& value) const;
  bool HasConsumers(const std::string& value) const;
  // The readers of `value` without a copy: one entry per reading input, in creation order (a node
  // reading it twice is listed twice, adjacent); valid until the next edit. For loops over values
  // that thousands of nodes read (a model's shape tensors), where a copy per query is quadratic.
  const std::vector<Node*>& Readers(const std::string& value) const;
  // The node that reads `value` (once or more) if exactly one does, else nullptr; no copy.
  Node* SoleReader(const std::string& value) const;
  bool IsGraphInput(const std::string& value) const { return graph_inputs_.count(value) > 0; }
  bool IsGraphOutput(const std::string& value) const { return graph_outputs_.count(value) > 0; }
  const onnx::TensorProto* Initializer(const std::string& name) const;
  // A value defined in this graph (node output, graph input or initializer), not an outer one.
  bool IsDefinedHere(const std::string& value) const;

  // Adds a node ordered next to `anchor` (after it if `after`, else before); nullptr: at the end.
  Node* AddNode(onnx::NodeProto proto, const Node* anchor = nullptr, bool after = true);
  void RemoveNode(Node* node);
  // Points every consumer of `from` (in this graph and, through implicit inputs, its subgraphs) at
  // `to`. Graph outputs are not renamed: callers decide what to do with those.
  void ReplaceAllUsesWith(const std::string& from, const std::string& to);
  // Renames the value `from` everywhere it appears: its producer, consumers and graph outputs.
  // Fails if `from` is a graph input, an initializer, or comes from an outer scope.
  absl::Status RenameValue(const std::string& from, const std::string& to);
  void RemoveInitializer(const std::string& name);
  // Appends a graph input (a new value, or an initializer's name: the initializer is then its default).
  void AddGraphInput(onnx::ValueInfoProto input);
  // Whether this is the main graph, not a subgraph of it.
  bool is_main() const { return root_ == this; }
  // Drops `name` from the graph's inputs (the value itself stays defined if it is an initializer).
  void RemoveGraphInput(const std::string& name);
  // Replaces the data (and type) of initializer `tensor.name()`, which must exist, in place.
  void ReplaceInitializer(onnx::TensorProto tensor);
  // Appends an initializer to the GraphProto and indexes it; the name must be new.
  const onnx::TensorProto* AddInitializer(onnx::TensorProto tensor);
  // Sets input i of `node` and keeps the indexes right.
  void SetInput(Node* node, int index, const std::string& value);
  // Gives output i of `node` a new name (which must be new); readers of the old name are left as they
  // are, for the caller to point elsewhere or to define the old name again (precision conversion
  // keeps a value's name for its float32 readers with a Cast from the renamed float16 value).
  void SetOutput(Node* node, int index, const std::string& name);

  // Calls fn on this graph and then every subgraph, depth first.
  void ForEachGraph(const std::function<void(Graph&)>& fn);
  // A name (for a value or a node) starting with `hint` that is not used in the main graph or any of
  // its subgraphs and that UniqueName has not given out before, in this Graph's life.
  std::string UniqueName(absl::string_view hint);
  // Whether a rewrite touched this graph since it was built or last checkpointed.
  bool changed() const { return changed_; }

 private:
  Graph(onnx::GraphProto* proto, Graph* root);
  static bool BySequence(const Node* a, const Node* b);
  // Whether this graph or any body below it changed since its last checkpoint.
  bool ChangedInside() const;
  // The order Commit writes nodes in when it can: by (order_, sequence_).
  static bool EmittedBefore(const Node* a, const Node* b);
  bool EditsKeptTheOrder() const;
  // Notes a break in the order if `reader`, rewired to a value `producer` writes, comes before it.
  void CheckRewiredInput(const Node* reader, const Node* producer);
  // order_ and sequence_ become the position in nodes_.
  void Renumber();
  // Builds Graphs for the node's graph-valued attributes and collects what they read from outside.
  void TakeSubgraphs(Node* node);
  void RefreshImplicitInputs(Node* node);
  void CompactTensorsAndValueInfo();
  // Adds `sign` for the node and every node of its subgraphs to the main graph's operator delta.
  void CountOps(const Node& node, int sign);
  void IndexNode(Node* node);
  void UnindexNode(Node* node);
  void AddConsumer(const std::string& value, Node* node);
  void RemoveConsumer(const std::string& value, Node* node);
  void RenameInSubgraphs(Node* node, const std::string& from, const std::string& to);
  // Renames uses of an outer value inside this (sub)graph.
  void RenameOuterUse(const std::string& from, const std::string& to);
  // Renames the graph outputs that name `from`.
  void RenameGraphOutput(const std::string& from, const std::string& to);
  void CollectOuterReads(std::unordered_set<std::string>* out) const;
  std::vector<Node*> TopologicalOrder() const;

  onnx::GraphProto* proto_;
  Graph* root_;  // the main graph (this one unless this is a subgraph)
  std::vector<std::unique_ptr<Node>> nodes_;
  int64_t live_nodes_ = 0;
  int64_t nodes_with_bodies_ = 0;  // live nodes with subgraphs: none spares the walks looking for them
  uint64_t next_sequence_ = 0;
  uint64_t checkpointed_sequence_ = 0;  // nodes with a smaller sequence are in emission order
  bool changed_ = false;
  bool reordered_ = false;  // a checkpoint put the nodes in another order than the proto's
  bool topological_ = false;  // nodes_ is in topological order (as built, or by a checkpoint)
  // Since the last checkpoint: nodes added, or whose outputs or implicit inputs changed, which the
  // checkpoint checks against the order; a rewired input is checked as it is set (order_broken_).
  std::vector<Node*> touched_;
  bool order_broken_ = false;
  std::vector<Node*> added_;    // since the last checkpoint
  std::vector<std::string> vanished_;  // see TakeVanishedValues
  std::vector<Node*> added_since_take_;  // see TakeAddedNodes
  std::vector<std::string> added_initializers_;  // see TakeAddedInitializers
  bool committed_ = false;
  absl::flat_hash_map<std::string, int64_t> op_delta_;  // on the main graph only
  absl::flat_hash_map<std::string, Node*> producer_;
  // value -> readers, one entry per reading input (a node reading a value twice is listed twice)
  absl::flat_hash_map<std::string, std::vector<Node*>> consumers_;
  absl::flat_hash_set<std::string> graph_inputs_;
  absl::flat_hash_map<std::string, int> graph_outputs_;  // name -> times listed
  absl::flat_hash_map<std::string, const onnx::TensorProto*> initializers_;
  absl::flat_hash_set<std::string> removed_initializers_;
  absl::flat_hash_set<std::string> dropped_values_;  // values whose producer was removed
  // On the main graph only: the names in it and its subgraphs that UniqueName could generate (or has
  // generated), collected when it is first called and kept up to date by the edits after that.
  void CollectGeneratedNames(absl::flat_hash_set<std::string>* names) const;
  void RememberName(const std::string& name);
  absl::flat_hash_set<std::string> used_names_;
  bool names_collected_ = false;
  uint64_t unique_counter_ = 0;
};

// The attribute `name` of a node, or nullptr; an INT attribute's value, or `fallback` when absent.
const onnx::AttributeProto* FindAttribute(const onnx::NodeProto& node, absl::string_view name);
int64_t GetAttributeInt(const onnx::NodeProto& node, absl::string_view name, int64_t fallback);

// A node's operator as reports count it: "Relu", or "com.microsoft::FastGelu" outside the default domain.
std::string OpKey(const onnx::NodeProto& node);

// The value of `key` in the node's metadata_props (NodeProto field 9, ONNX IR 10: the dynamo exporter's
// `pkg.torch.onnx.name_scopes`), which onnx 1.12 keeps as unknown bytes; "" when absent.
std::string NodeMetadataValue(const onnx::NodeProto& node, absl::string_view key);

// Counts nodes of a ModelProto's main graph and all subgraphs without building a Graph.
int64_t CountNodes(const onnx::GraphProto& graph);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_GRAPH_H_
