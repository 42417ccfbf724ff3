// Building what a rewrite emits: nodes (MakeNode, the one node builder), attributes, Casts, and chains
// of new nodes one after another.
#ifndef ONNXOPT_OPTIMIZER_PASSES_REWRITE_H_
#define ONNXOPT_OPTIMIZER_PASSES_REWRITE_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"

namespace onnxopt {

onnx::AttributeProto MakeIntAttribute(const std::string& name, int64_t value);
onnx::AttributeProto MakeIntsAttribute(const std::string& name, const std::vector<int64_t>& values);
onnx::AttributeProto MakeFloatAttribute(const std::string& name, float value);

// A node of `op` (in `domain`, "" for ONNX's own) reading `inputs` and writing `outputs`.
onnx::NodeProto MakeNode(const std::string& op, const std::string& name, std::vector<std::string> inputs,
                         std::vector<std::string> outputs, const std::string& domain = "");

// Adds a 1-D int64 initializer named after `hint` (made unique) holding `values`; returns its name.
std::string AddInt64Initializer(Graph& graph, const std::string& hint, const std::vector<int64_t>& values);
// The same for a scalar (Gather's index of one element, a step's constant); returns its unique name.
std::string AddInt64Scalar(Graph& graph, const std::string& hint, int64_t value);

// Splits the last axis of `x` [B, S, P * part_width] into P equal parts and reshapes each to heads
// [B, S, heads, head_size] (one of the two may be -1), writing part p to `outputs[p]`: the packed-projection
// form the attention fusion reads. Adds the Split (a 'split' input from opset 13, an attribute before) and
// the Reshapes after `after`.
void SplitPartsIntoHeads(Graph& graph, const std::string& x, int64_t part_width, int64_t heads, int64_t head_size,
                         const std::vector<std::string>& outputs, int64_t opset, const Node* after);

// Removes the default-domain nodes among `nodes` whose outputs nothing reads (no reader, no graph
// output), then their producers that this leaves unread, transitively: what a rewrite that adds twins
// beside the nodes it replaces leaves behind (and every twin that led nowhere).
void RemoveUnreadNodes(Graph& graph, std::vector<Node*> nodes);

// Adds Cast(value, to) before `anchor` and returns its output (ONNX Runtime's contrib operators take
// int32 ids and masks where exports have int64).
std::string AddCast(Graph& graph, const std::string& value, int32_t to, const Node* anchor);

// Casts to one type made once per pass run and shared by every node that reads them (the masks of all
// the layers' fused attention).
class CastCache {
 public:
  explicit CastCache(int32_t to) : to_(to) {}
  // `value` cast to the type: the Cast made for it before, else a new one before `anchor`.
  const std::string& Get(Graph& graph, const std::string& value, const Node* anchor);

 private:
  int32_t to_;
  std::unordered_map<std::string, std::string> casts_;
};

// New nodes one after another, the first after `anchor`: a rewrite's replacement in reading order.
class NodeChain {
 public:
  NodeChain(Graph& graph, const Node* anchor) : graph_(graph), last_(anchor) {}
  // Adds a node of one output; the node and its output are named after `hint`. Returns the output.
  std::string Add(const std::string& op, std::vector<std::string> inputs, const std::string& hint,
                  std::vector<onnx::AttributeProto> attributes = {}, const std::string& domain = "");
  // Adds a node built by the caller.
  const Node* AddNode(onnx::NodeProto node);
  // The last node added (the anchor while there is none).
  const Node* last() const { return last_; }

 private:
  Graph& graph_;
  const Node* last_;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_REWRITE_H_
