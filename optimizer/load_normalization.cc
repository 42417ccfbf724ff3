#include "optimizer/load_normalization.h"

#include <functional>
#include <queue>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace onnxopt {
namespace {

constexpr char kDefaultDomainAlias[] = "ai.onnx";
// ONNX Runtime's own domains, which it imports at their latest version when a model uses them without
// an opset import (each is at version 1 in ONNX Runtime 1.29).
constexpr const char* kRuntimeDomains[] = {"com.microsoft", "com.microsoft.nchwc"};

// Calls `fn` on `graph` and on every subgraph below it, subgraphs first.
void ForEachGraphBottomUp(onnx::GraphProto* graph, const std::function<void(onnx::GraphProto*)>& fn) {
  for (onnx::NodeProto& node : *graph->mutable_node()) {
    for (onnx::AttributeProto& attribute : *node.mutable_attribute()) {
      if (attribute.has_g()) ForEachGraphBottomUp(attribute.mutable_g(), fn);
      for (onnx::GraphProto& subgraph : *attribute.mutable_graphs()) ForEachGraphBottomUp(&subgraph, fn);
    }
  }
  fn(graph);
}

// Every node of `model`: its graphs' and its functions'.
void ForEachNode(onnx::ModelProto* model, const std::function<void(onnx::NodeProto*)>& fn) {
  ForEachGraphBottomUp(model->mutable_graph(), [&](onnx::GraphProto* graph) {
    for (onnx::NodeProto& node : *graph->mutable_node()) fn(&node);
  });
  for (onnx::FunctionProto& function : *model->mutable_functions()) {
    for (onnx::NodeProto& node : *function.mutable_node()) fn(&node);
  }
}

// The names `node` reads: its inputs and, for a node with subgraphs, every name read inside them (the
// ones produced there are not produced by the outer graph, so they add no edge there).
void NamesRead(const onnx::NodeProto& node, std::vector<const std::string*>* names) {
  for (const std::string& input : node.input()) {
    if (!input.empty()) names->push_back(&input);
  }
  for (const onnx::AttributeProto& attribute : node.attribute()) {
    auto read_graph = [&](const onnx::GraphProto& graph) {
      for (const onnx::NodeProto& inner : graph.node()) NamesRead(inner, names);
      for (const onnx::ValueInfoProto& output : graph.output()) names->push_back(&output.name());
    };
    if (attribute.has_g()) read_graph(attribute.g());
    for (const onnx::GraphProto& subgraph : attribute.graphs()) read_graph(subgraph);
  }
}

// Sorts one graph's own nodes; true when their order changed.
bool SortOneGraph(onnx::GraphProto* graph) {
  const int count = graph->node_size();
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < count; ++i) {
    for (const std::string& output : graph->node(i).output()) {
      if (!output.empty()) producer.emplace(output, i);
    }
  }
  std::vector<std::vector<int>> consumers(count);
  std::vector<int> waiting_on(count, 0);
  bool in_order = true;
  for (int i = 0; i < count; ++i) {
    std::vector<const std::string*> names;
    NamesRead(graph->node(i), &names);
    std::set<int> producers;
    for (const std::string* name : names) {
      auto it = producer.find(*name);
      if (it != producer.end() && it->second != i) producers.insert(it->second);
    }
    for (int from : producers) {
      consumers[from].push_back(i);
      in_order &= from < i;
    }
    waiting_on[i] = static_cast<int>(producers.size());
  }
  if (in_order) return false;
  // Kahn's algorithm, always taking the earliest written node that is ready: the written order stays
  // wherever the data flow allows it.
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < count; ++i) {
    if (waiting_on[i] == 0) ready.push(i);
  }
  std::vector<int> order;
  order.reserve(count);
  while (!ready.empty()) {
    const int next = ready.top();
    ready.pop();
    order.push_back(next);
    for (int consumer : consumers[next]) {
      if (--waiting_on[consumer] == 0) ready.push(consumer);
    }
  }
  if (static_cast<int>(order.size()) != count) return false;  // a cycle: no order runs it
  google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
  sorted.Reserve(count);
  for (int index : order) sorted.Add(std::move(*graph->mutable_node(index)));
  graph->mutable_node()->Swap(&sorted);
  return true;
}

// "ai.onnx" in an opset import list becomes "" (dropped where "" is imported too); true if any was.
bool AliasDefaultDomainImport(google::protobuf::RepeatedPtrField<onnx::OperatorSetIdProto>* imports) {
  bool has_default = false, changed = false;
  for (const onnx::OperatorSetIdProto& opset : *imports) has_default |= opset.domain().empty();
  for (int i = imports->size() - 1; i >= 0; --i) {
    if ((*imports)[i].domain() != kDefaultDomainAlias) continue;
    changed = true;
    if (has_default) {
      imports->DeleteSubrange(i, 1);
    } else {
      (*imports)[i].set_domain("");
      has_default = true;
    }
  }
  return changed;
}

std::string DefaultDomainAlias(onnx::ModelProto* model) {
  int nodes = 0;
  ForEachNode(model, [&](onnx::NodeProto* node) {
    if (node->domain() != kDefaultDomainAlias) return;
    node->set_domain("");
    ++nodes;
  });
  bool imports = AliasDefaultDomainImport(model->mutable_opset_import());
  for (onnx::FunctionProto& function : *model->mutable_functions()) {
    imports |= AliasDefaultDomainImport(function.mutable_opset_import());
  }
  if (nodes == 0 && !imports) return "";
  return absl::StrCat("the default domain was spelled '", kDefaultDomainAlias, "' (", nodes,
                      " nodes", imports ? " and the opset import" : "", "): read as ONNX Runtime reads it, the default domain");
}

std::string UntypedValueInfo(onnx::ModelProto* model) {
  int dropped = 0;
  ForEachGraphBottomUp(model->mutable_graph(), [&](onnx::GraphProto* graph) {
    auto* infos = graph->mutable_value_info();
    for (int i = infos->size() - 1; i >= 0; --i) {
      const onnx::ValueInfoProto& info = (*infos)[i];
      if (info.has_type() && info.type().value_case() != onnx::TypeProto::VALUE_NOT_SET) continue;
      infos->DeleteSubrange(i, 1);
      ++dropped;
    }
  });
  if (dropped == 0) return "";
  return absl::StrCat(dropped, " value_info entries without a type were dropped (ONNX Runtime ignores them)");
}

std::string MissingRuntimeImports(onnx::ModelProto* model) {
  std::set<std::string> imported, used;
  for (const onnx::OperatorSetIdProto& opset : model->opset_import()) imported.insert(opset.domain());
  ForEachGraphBottomUp(model->mutable_graph(), [&](onnx::GraphProto* graph) {
    for (const onnx::NodeProto& node : graph->node()) used.insert(node.domain());
  });
  std::vector<std::string> added;
  for (const char* domain : kRuntimeDomains) {
    if (used.count(domain) == 0 || imported.count(domain) != 0) continue;
    onnx::OperatorSetIdProto* opset = model->add_opset_import();
    opset->set_domain(domain);
    opset->set_version(1);
    added.push_back(domain);
  }
  if (added.empty()) return "";
  return absl::StrCat("operators of ", absl::StrJoin(added, ", "),
                      " were used without an opset import: imported at version 1, as ONNX Runtime imports them");
}

}  // namespace

int SortNodesTopologically(onnx::GraphProto* graph) {
  int reordered = 0;
  ForEachGraphBottomUp(graph, [&](onnx::GraphProto* each) { reordered += SortOneGraph(each) ? 1 : 0; });
  return reordered;
}

std::vector<std::string> NormalizeAsOnnxRuntimeReads(onnx::ModelProto* model) {
  std::vector<std::string> notes;
  auto note = [&](std::string line) {
    if (!line.empty()) notes.push_back(std::move(line));
  };
  note(DefaultDomainAlias(model));
  note(MissingRuntimeImports(model));
  note(UntypedValueInfo(model));
  if (const int reordered = SortNodesTopologically(model->mutable_graph()); reordered > 0) {
    note(absl::StrCat("nodes were out of topological order in ", reordered,
                      reordered == 1 ? " graph" : " graphs", ": sorted, as ONNX Runtime sorts them"));
  }
  return notes;
}

}  // namespace onnxopt
