#include "optimizer/branch_pipelines.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "optimizer/graph_bodies.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_manager.h"

namespace onnxopt {
namespace {

// A branch output's type, its dims named as the If's output declares them where the outer graph names
// one: the names tie the branch to the main graph's interface. A merged decoder's first branch computes
// its present over [.., sequence, ..] and declares that; the If declares [.., total_sequence, ..], as
// attention_mask [batch, total_sequence] is, which in that branch says total_sequence is sequence
// (the sweep's DimAliases read it so, and the mask's key length is the scores'). A number stays.
void DeclareAsTheIf(const onnx::TypeProto& declared, onnx::ValueInfoProto* output) {
  if (!output->has_type()) {
    *output->mutable_type() = declared;
    return;
  }
  if (!declared.tensor_type().has_shape() || !output->type().tensor_type().has_shape()) return;
  const auto& named = declared.tensor_type().shape();
  auto* dims = output->mutable_type()->mutable_tensor_type()->mutable_shape();
  if (named.dim_size() != dims->dim_size()) return;
  for (int d = 0; d < named.dim_size(); ++d) {
    if (!named.dim(d).dim_param().empty() && !dims->dim(d).has_dim_value()) {
      dims->mutable_dim(d)->set_dim_param(named.dim(d).dim_param());
    }
  }
}

// The names `graph` defines (initializers, inputs, node outputs, at any depth) and those it reads.
void CollectNames(const onnx::GraphProto& graph, std::set<std::string>* defined, std::set<std::string>* read) {
  for (const auto& tensor : graph.initializer()) defined->insert(tensor.name());
  for (const auto& input : graph.input()) defined->insert(input.name());
  for (const auto& node : graph.node()) {
    for (const auto& input : node.input()) {
      if (!input.empty()) read->insert(input);
    }
    for (const auto& output : node.output()) {
      if (!output.empty()) defined->insert(output);
    }
    ForEachBody(node, [&](const onnx::GraphProto& body) { CollectNames(body, defined, read); });
  }
  for (const auto& output : graph.output()) read->insert(output.name());
}

// Renames values (their definitions and every use) in `graph` and its bodies.
void Rename(onnx::GraphProto* graph, const std::map<std::string, std::string>& renames) {
  if (renames.empty()) return;
  auto renamed = [&](std::string* name) {
    auto it = renames.find(*name);
    if (it != renames.end()) *name = it->second;
  };
  for (auto& tensor : *graph->mutable_initializer()) renamed(tensor.mutable_name());
  for (auto* values : {graph->mutable_input(), graph->mutable_output(), graph->mutable_value_info()}) {
    for (auto& value : *values) renamed(value.mutable_name());
  }
  for (auto& node : *graph->mutable_node()) {
    for (auto& input : *node.mutable_input()) renamed(&input);
    for (auto& output : *node.mutable_output()) renamed(&output);
    ForEachMutableBody(&node, [&](onnx::GraphProto* body) { Rename(body, renames); });
  }
}

// Same type, dims and bytes. Tensors by reference at one location (a branch's untouched copy of an outer
// weight) are the same without reading them.
bool SameTensor(const onnx::TensorProto& a, const onnx::TensorProto& b) {
  if (a.data_type() != b.data_type() || !std::equal(a.dims().begin(), a.dims().end(), b.dims().begin(), b.dims().end())) {
    return false;
  }
  const bool raw_a = a.has_raw_data() || IsByReference(a), raw_b = b.has_raw_data() || IsByReference(b);
  if (raw_a && raw_b) {
    const auto same_entry = [](const onnx::StringStringEntryProto& x, const onnx::StringStringEntryProto& y) {
      return x.key() == y.key() && x.value() == y.value();
    };
    if (IsByReference(a) && IsByReference(b) &&
        std::equal(a.external_data().begin(), a.external_data().end(), b.external_data().begin(),
                   b.external_data().end(), same_entry)) {
      return true;
    }
    return TensorDataBytes(a) == TensorDataBytes(b) && SameTensorBytes(a, b);
  }
  onnx::TensorProto x = a, y = b;  // typed fields (small, by nature), or external data not resolved here
  x.clear_name();
  y.clear_name();
  return x.SerializeAsString() == y.SerializeAsString();
}

// A name starting with `hint` that none of `taken` is; added to `taken`.
std::string FreshName(const std::string& hint, std::set<std::string>* taken) {
  std::string name = hint;
  for (int i = 1; taken->count(name) > 0; ++i) name = absl::StrCat(hint, "_", i);
  taken->insert(name);
  return name;
}

// The main graph as the branches see it from inside.
struct OuterScope {
  std::map<std::string, const onnx::TensorProto*> initializers;
  std::map<std::string, const onnx::ValueInfoProto*> types;
  std::set<std::string> inputs;
  std::vector<std::string> input_order;  // as the main graph lists them
  std::set<std::string> names;  // everything the main graph defines: a branch must not define it again
};

OuterScope ScopeOf(const onnx::GraphProto& main) {
  OuterScope scope;
  for (const auto& tensor : main.initializer()) scope.initializers[tensor.name()] = &tensor;
  for (const auto* values : {&main.value_info(), &main.output(), &main.input()}) {
    for (const auto& value : *values) {
      if (value.has_type()) scope.types[value.name()] = &value;
    }
  }
  for (const auto& input : main.input()) {
    scope.inputs.insert(input.name());
    scope.input_order.push_back(input.name());
  }
  std::set<std::string> read;
  CollectNames(main, &scope.names, &read);
  return scope;
}

// `branch` as a model of its own (`model`'s opsets and functions), or false where a value it reads from
// outside has no declared type.
bool BranchModel(const onnx::ModelProto& model, const onnx::NodeProto& node, const onnx::GraphProto& branch,
                 const OuterScope& outer, onnx::ModelProto* made) {
  made->set_ir_version(model.ir_version());
  *made->mutable_opset_import() = model.opset_import();
  *made->mutable_functions() = model.functions();
  made->set_producer_name(model.producer_name());
  onnx::GraphProto* graph = made->mutable_graph();
  graph->set_name(branch.name());
  std::set<std::string> defined, read;
  CollectNames(branch, &defined, &read);
  // The main graph's inputs the branch reads, in the main graph's order (passes that pick one of several
  // equal values, as shape arithmetic's reads of the batch, go by it), then the other outer values.
  for (const std::string& name : outer.input_order) {
    if (read.count(name) == 0 || defined.count(name) > 0) continue;
    auto type = outer.types.find(name);
    if (type == outer.types.end()) return false;
    *graph->add_input() = *type->second;
  }
  for (const std::string& name : read) {
    if (defined.count(name) > 0 || outer.inputs.count(name) > 0) continue;
    auto weight = outer.initializers.find(name);
    auto type = outer.types.find(name);
    if (weight != outer.initializers.end()) {
      *graph->add_initializer() = *weight->second;
    } else if (type != outer.types.end()) {
      *graph->add_input() = *type->second;
    } else {
      return false;
    }
  }
  for (const auto& tensor : branch.initializer()) *graph->add_initializer() = tensor;
  *graph->mutable_node() = branch.node();
  *graph->mutable_value_info() = branch.value_info();
  for (int i = 0; i < branch.output_size(); ++i) {
    onnx::ValueInfoProto output = branch.output(i);
    auto declared = i < node.output_size() ? outer.types.find(node.output(i)) : outer.types.end();
    if (declared != outer.types.end()) DeclareAsTheIf(declared->second->type(), &output);
    *graph->add_output() = std::move(output);
  }
  // The outputs under the If's names (`present.0.key`, as the decoder exported alone has them), which
  // tell the cache interface (cache_interface.h) and the mask probe the past's role; AsBranch renames
  // them back out of the outer names.
  std::map<std::string, std::string> renames;
  std::set<std::string> targets;
  for (int i = 0; i < graph->output_size() && i < node.output_size(); ++i) {
    const std::string& name = graph->output(i).name();
    if (defined.count(name) == 0 || renames.count(name) > 0 || node.output(i).empty() ||
        defined.count(node.output(i)) > 0 || read.count(node.output(i)) > 0 || !targets.insert(node.output(i)).second) {
      continue;
    }
    renames[name] = node.output(i);
  }
  Rename(graph, renames);
  return true;
}

// Whether the run kept the branch's interface: the same outputs, no input it was not given.
bool KeptInterface(const onnx::GraphProto& before, const onnx::GraphProto& after) {
  if (before.output_size() != after.output_size()) return false;
  for (int i = 0; i < before.output_size(); ++i) {
    if (before.output(i).name() != after.output(i).name()) return false;
  }
  std::set<std::string> given;
  for (const auto& input : before.input()) given.insert(input.name());
  return std::all_of(after.input().begin(), after.input().end(),
                     [&](const onnx::ValueInfoProto& input) { return given.count(input.name()) > 0; });
}

// The optimized branch model's graph as the If's branch again: no inputs, the outer weights it still
// reads unchanged read from outside, what it defines under a name the outer graph has renamed.
onnx::GraphProto AsBranch(onnx::GraphProto optimized, OuterScope* outer) {
  optimized.clear_input();
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (auto& tensor : *optimized.mutable_initializer()) {
    auto same = outer->initializers.find(tensor.name());
    if (same != outer->initializers.end() && SameTensor(*same->second, tensor)) continue;
    *kept.Add() = std::move(tensor);
  }
  optimized.mutable_initializer()->Swap(&kept);
  std::set<std::string> defined, read;
  CollectNames(optimized, &defined, &read);
  std::set<std::string> taken = outer->names;
  taken.insert(defined.begin(), defined.end());
  taken.insert(read.begin(), read.end());
  std::map<std::string, std::string> renames;
  for (const std::string& name : defined) {
    if (outer->names.count(name) > 0) renames[name] = FreshName(absl::StrCat(optimized.name(), "/", name), &taken);
  }
  Rename(&optimized, renames);
  return optimized;
}

// Initializers of `a` equal to one of `b` (the packed weights both branches made from the same outer
// ones) become one initializer of `main`.
void HoistShared(onnx::GraphProto* a, onnx::GraphProto* b, onnx::GraphProto* main, OuterScope* outer) {
  std::multimap<std::pair<size_t, int32_t>, int> by_size;  // b's by (bytes, type)
  for (int i = 0; i < b->initializer_size(); ++i) {
    const onnx::TensorProto& tensor = b->initializer(i);
    if (!tensor.raw_data().empty()) by_size.emplace(std::make_pair(tensor.raw_data().size(), tensor.data_type()), i);
  }
  std::set<std::string> taken = outer->names, defined, read;
  for (const onnx::GraphProto* branch : {a, b}) {
    CollectNames(*branch, &defined, &read);
  }
  taken.insert(defined.begin(), defined.end());
  taken.insert(read.begin(), read.end());
  std::map<std::string, std::string> renames_a, renames_b;
  std::set<int> hoisted_a, hoisted_b;
  for (int i = 0; i < a->initializer_size(); ++i) {
    const onnx::TensorProto& tensor = a->initializer(i);
    if (tensor.raw_data().empty()) continue;
    auto [first, last] = by_size.equal_range(std::make_pair(tensor.raw_data().size(), tensor.data_type()));
    for (auto it = first; it != last; ++it) {
      if (hoisted_b.count(it->second) > 0 || !SameTensor(tensor, b->initializer(it->second))) continue;
      const std::string name = FreshName(tensor.name(), &taken);
      renames_a[tensor.name()] = name;
      renames_b[b->initializer(it->second).name()] = name;
      hoisted_a.insert(i);
      hoisted_b.insert(it->second);
      break;
    }
  }
  if (hoisted_a.empty()) return;
  // a's hoisted tensors go to the main graph under the shared names, b's go.
  auto take_out = [&](onnx::GraphProto* branch, const std::set<int>& hoisted, bool to_main) {
    google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
    for (int i = 0; i < branch->initializer_size(); ++i) {
      onnx::TensorProto* tensor = branch->mutable_initializer(i);
      if (hoisted.count(i) == 0) {
        *kept.Add() = std::move(*tensor);
      } else if (to_main) {
        const std::string& shared = renames_a.at(tensor->name());
        outer->names.insert(shared);
        tensor->set_name(shared);
        *main->add_initializer() = std::move(*tensor);
      }
    }
    branch->mutable_initializer()->Swap(&kept);
  };
  take_out(a, hoisted_a, /*to_main=*/true);
  take_out(b, hoisted_b, /*to_main=*/false);
  Rename(a, renames_a);
  Rename(b, renames_b);
}

}  // namespace

bool HoldsAttention(const onnx::GraphProto& graph) {
  for (const auto& node : graph.node()) {
    if (node.op_type() == "Softmax") return true;
    bool inside = false;
    ForEachBody(node, [&](const onnx::GraphProto& body) { inside = inside || HoldsAttention(body); });
    if (inside) return true;
  }
  return false;
}

absl::Status RunPipelineOnBranches(onnx::ModelProto* model, const ModelPipeline& run, int64_t stop_after_changes,
                                   std::vector<v1::PassReport>* reports, int64_t* changes) {
  *changes = 0;
  onnx::GraphProto* main = model->mutable_graph();
  OuterScope outer;
  bool scoped = false;
  for (int n = 0; n < main->node_size(); ++n) {
    onnx::NodeProto* node = main->mutable_node(n);
    if (node->op_type() != "If" || !(node->domain().empty() || node->domain() == "ai.onnx")) continue;
    std::vector<onnx::GraphProto*> branches;
    ForEachMutableBody(node, [&](onnx::GraphProto* body) {
      if (HoldsAttention(*body)) branches.push_back(body);
    });
    if (branches.empty()) continue;
    if (!scoped) {
      outer = ScopeOf(*main);
      scoped = true;
    }
    std::vector<onnx::GraphProto*> optimized;
    for (onnx::GraphProto* branch : branches) {
      const int64_t budget = stop_after_changes < 0 ? -1 : std::max<int64_t>(0, stop_after_changes - *changes);
      if (budget == 0) return absl::OkStatus();
      onnx::ModelProto branch_model;
      if (!BranchModel(*model, *node, *branch, outer, &branch_model)) continue;
      const onnx::GraphProto interface_before = [&] {
        onnx::GraphProto interface;
        *interface.mutable_input() = branch_model.graph().input();
        *interface.mutable_output() = branch_model.graph().output();
        return interface;
      }();
      std::vector<v1::PassReport> branch_reports;
      absl::Status status = run(&branch_model, budget, &branch_reports);
      for (auto& report : branch_reports) {
        if (PassChangedGraph(report)) ++*changes;
        report.add_notes(absl::StrCat("in the branch '", branch->name(), "' of If '", node->name(),
                                      "', run as a model of its own"));
        reports->push_back(std::move(report));
      }
      if (!status.ok()) return status;
      if (!KeptInterface(interface_before, branch_model.graph())) continue;
      const std::string name = branch->name();
      const auto declared_outputs = branch->output();  // the branch's own types, which the run borrowed
      *branch = AsBranch(std::move(*branch_model.mutable_graph()), &outer);
      branch->set_name(name);
      for (int i = 0; i < branch->output_size() && i < declared_outputs.size(); ++i) {
        if (branch->output(i).name() == declared_outputs[i].name()) *branch->mutable_output(i) = declared_outputs[i];
      }
      optimized.push_back(branch);
    }
    if (optimized.size() == 2) {
      HoistShared(optimized[0], optimized[1], main, &outer);
      outer = ScopeOf(*main);  // the hoisted initializers are the main graph's now
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxopt
