// fold_relative_position_buckets: an embedding lookup whose indices are an element-wise function of
// one integer tensor (a relative position) becomes a lookup in a small constant table, indexed by
// that integer clipped to where the function stops changing.
//
// T5 (and its relatives) bucket the relative position of every query/key pair: d = k[None, :] -
// q[:, None], then Abs, Log, Min, Where... (about twenty element-wise passes over S x S elements),
// then Gather(relative_attention_bias, bucket). In a small T5 encoder that is a third of the run time.
// The bucket depends on d alone and stops changing past max_distance, so:
//
// Before:  idx = f(d)  (f: element-wise ops of d and one-element constants)
//          y = Gather(W, idx, axis=0)
// After:   y = Gather(W', Add(Clip(d, -B, B), B), axis=0)     W'[i] = Gather(W, f(i - B))
//
// f and the Gather are evaluated in ONNX Runtime itself, on every d in [-65536, 65536]: B is the
// smallest bound past which f gives the value of its end on each side. That f keeps that value
// beyond the probe (|d| > 65536, sequences of more than 64k tokens) is the one thing assumed, as
// T5's Min(..., num_buckets - 1) makes it. Nothing changes where f does not settle within 4096, where
// W' would exceed 16 MiB, or below opset 12 (Clip on integers). d is the farthest value from idx that
// alone feeds f (T5: the Sub of the two position ranges), integer typed, of known rank >= 1, and no
// constant of f has more elements than one or more dims than d (so f maps each element of d alone).
#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"
#include "optimizer/passes/subgraph_session.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

constexpr int64_t kProbeRange = 65536;
constexpr int64_t kMaxBound = 4096;
constexpr int64_t kMaxTableBytes = int64_t{16} << 20;
constexpr size_t kMaxFunctionNodes = 64;

const std::set<std::string, std::less<>>& ElementwiseOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{
      "Abs",  "Neg",   "Add",     "Sub",          "Mul",         "Div",   "Mod",  "Log", "Exp",
      "Sqrt", "Pow",   "Floor",   "Ceil",         "Round",       "Sign",  "Less", "LessOrEqual",
      "Greater", "GreaterOrEqual", "Equal", "Not", "And", "Or", "Xor", "Where", "Min", "Max", "Cast",
      "Clip", "Identity", "Relu"};
  return *ops;
}

// The element-wise function from `stop` (or, with `stop` empty, from whatever leaves) to `idx`.
struct Function {
  std::vector<const Node*> nodes;
  std::set<std::string> leaves;           // non-constant values it reads
  std::map<std::string, int> depth;       // value -> distance from idx, for the leaf search
};

// A one-element constant of rank <= max_rank.
bool IsScalarConstant(const Graph& graph, const std::string& value, int max_rank) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  if (tensor == nullptr || tensor->dims_size() > max_rank) return false;
  for (int64_t dim : tensor->dims()) {
    if (dim != 1) return false;
  }
  return true;
}

// Walks back from `idx` through element-wise nodes (and ConstantOfShape(Shape(v)), full_like(v)).
// False if it meets a constant of more than one element or grows too large.
bool CollectFunction(const Graph& graph, const std::string& idx, const std::string& stop, int max_rank, Function* f) {
  std::unordered_set<const Node*> seen;
  std::vector<std::pair<std::string, int>> pending = {{idx, 0}};
  for (size_t steps = 0; !pending.empty(); ++steps) {
    if (steps > 16 * kMaxFunctionNodes) return false;  // many paths through a small function: not one
    const auto [value, depth] = pending.back();
    pending.pop_back();
    if (value.empty()) continue;
    auto [it, inserted] = f->depth.emplace(value, depth);
    if (!inserted && it->second >= depth) continue;
    it->second = std::max(it->second, depth);
    if (value == stop && depth > 0) {
      f->leaves.insert(value);
      continue;
    }
    if (ConstantTensor(graph, value) != nullptr) {
      if (!IsScalarConstant(graph, value, max_rank)) return false;
      continue;
    }
    const Node* producer = graph.Producer(value);
    std::vector<std::string> inputs;
    if (producer != nullptr && producer->domain().empty() && ElementwiseOps().count(producer->op_type()) > 0) {
      inputs.assign(producer->proto().input().begin(), producer->proto().input().end());
    } else if (producer != nullptr && producer->domain().empty() && producer->op_type() == "ConstantOfShape") {
      const Node* shape = graph.Producer(producer->input(0));
      if (shape == nullptr || shape->op_type() != "Shape" || !shape->domain().empty() ||
          shape->FindAttribute("start") != nullptr || shape->FindAttribute("end") != nullptr) {
        f->leaves.insert(value);
        continue;
      }
      if (seen.insert(shape).second) f->nodes.push_back(shape);
      inputs = {shape->input(0)};
    } else {
      f->leaves.insert(value);
      continue;
    }
    if (seen.insert(producer).second) f->nodes.push_back(producer);
    if (seen.size() > kMaxFunctionNodes) return false;
    for (const std::string& input : inputs) pending.push_back({input, depth + 1});
  }
  return true;
}

// The tensor `d` of the element type `type` holding first, first + 1, ..., last.
onnx::TensorProto Counting(const std::string& name, int32_t type, int64_t first, int64_t last) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(type);
  tensor.add_dims(last - first + 1);
  for (int64_t v = first; v <= last; ++v) {
    if (type == onnx::TensorProto::INT64) {
      tensor.add_int64_data(v);
    } else {
      tensor.add_int32_data(static_cast<int32_t>(v));
    }
  }
  return tensor;
}

// Runs f (and the Gather after it) in ONNX Runtime on a 1-D `d`.
class FunctionProbe {
 public:
  static absl::StatusOr<FunctionProbe> Create(const Graph& graph, const PassContext& context, const Function& f,
                                              const std::string& d, int32_t d_type, const Node& gather) {
    onnx::ValueInfoProto input;
    input.set_name(d);
    input.mutable_type()->mutable_tensor_type()->set_elem_type(d_type);
    input.mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_param("n");
    // f's nodes and the Gather, with the Constant nodes they read, in graph order.
    std::unordered_set<const Node*> members(f.nodes.begin(), f.nodes.end());
    members.insert(&gather);
    std::unordered_set<std::string> read;
    for (const Node* member : members) read.insert(member->proto().input().begin(), member->proto().input().end());
    std::vector<const Node*> nodes;
    for (const Node* node : graph.Nodes()) {
      const bool feeding_constant =
          node->op_type() == "Constant" && node->domain().empty() && read.count(node->output(0)) > 0;
      if (members.count(node) > 0 || feeding_constant) nodes.push_back(node);
    }
    auto session = SubgraphSession(graph, context, nodes, {input}, {gather.input(1), gather.output(0)},
                                   "relative_position_probe");
    if (!session.ok()) return session.status();
    return FunctionProbe(*std::move(session), d, d_type, gather.input(1), gather.output(0));
  }

  // f(d) for d in [first, last], widened to int64.
  absl::StatusOr<std::vector<int64_t>> Indices(int64_t first, int64_t last) {
    auto result = Run(first, last, index_);
    if (!result.ok()) return result.status();
    auto proto = OrtValueToTensorProto(*result, index_);
    if (!proto.ok()) return proto.status();
    auto ints = TensorInts(*proto);
    if (!ints) return absl::FailedPreconditionError("the indices are not integers");
    return *ints;
  }

  // The Gather's rows for d in [first, last].
  absl::StatusOr<onnx::TensorProto> Rows(int64_t first, int64_t last, const std::string& name) {
    auto result = Run(first, last, rows_);
    if (!result.ok()) return result.status();
    return OrtValueToTensorProto(*result, name);
  }

 private:
  FunctionProbe(std::unique_ptr<Ort::Session> session, std::string d, int32_t d_type, std::string index, std::string rows)
      : session_(std::move(session)), d_(std::move(d)), d_type_(d_type), index_(std::move(index)), rows_(std::move(rows)) {}

  absl::StatusOr<Ort::Value> Run(int64_t first, int64_t last, const std::string& output) {
    auto input = TensorProtoToOrtValue(Counting(d_, d_type_, first, last));
    if (!input.ok()) return input.status();
    const char* input_name = d_.c_str();
    const char* output_name = output.c_str();
    try {
      auto results = session_->Run(Ort::RunOptions{nullptr}, &input_name, &*input, 1, &output_name, 1);
      return std::move(results[0]);
    } catch (const std::exception& e) {
      return absl::FailedPreconditionError(e.what());
    }
  }

  std::unique_ptr<Ort::Session> session_;
  std::string d_;
  int32_t d_type_;
  std::string index_, rows_;
};

// The smallest b in [0, range] such that f(d) == f(range) for all d in [b, range] and f(d) ==
// f(-range) for all d in [-range, -b]; `values` holds f(-range) ... f(range).
int64_t SettlingBound(const std::vector<int64_t>& values, int64_t range) {
  int64_t high = range, low = range;
  while (high > 0 && values[range + high - 1] == values[2 * range]) --high;
  while (low > 0 && values[range - low + 1] == values[0]) --low;
  return std::max(high, low);
}

// What folding one Gather takes: the function f of d feeding its index, and the table of rows.
struct BucketFold {
  Node* gather = nullptr;
  Function f;
  std::string d;
  int32_t d_type = onnx::TensorProto::INT64;
  int64_t bound = 0;
  onnx::TensorProto table;  // the rows for d = -bound..bound, named for the graph
};

// The index of `gather` as f(d): d the farthest value that alone feeds f, probed in ONNX Runtime.
MatchResult<BucketFold> MatchBuckets(Graph& graph, Node* gather, const ShapeInfo& shapes, const PassContext& context) {
  if (gather->op_type() != "Gather" || !gather->domain().empty() || gather->GetAttributeInt("axis", 0) != 0 ||
      ConstantTensor(graph, gather->input(0)) == nullptr) {
    return Fail();
  }
  const std::string idx = gather->input(1);
  Function everything;
  if (!CollectFunction(graph, idx, "", 8, &everything) || everything.nodes.size() < 3) return Fail();
  std::vector<std::pair<int, std::string>> candidates;
  for (const auto& [value, depth] : everything.depth) {
    if (depth > 0 && ConstantTensor(graph, value) == nullptr) candidates.push_back({depth, value});
  }
  std::sort(candidates.rbegin(), candidates.rend());
  BucketFold fold;
  fold.gather = gather;
  for (const auto& [depth, value] : candidates) {
    const auto type = shapes.ElementType(value);
    const auto rank = shapes.Rank(value);
    if (!type || (*type != onnx::TensorProto::INT64 && *type != onnx::TensorProto::INT32) || !rank || *rank < 1) {
      continue;
    }
    Function candidate;
    if (CollectFunction(graph, idx, value, *rank, &candidate) && candidate.leaves == std::set<std::string>{value}) {
      fold.d = value;
      fold.f = std::move(candidate);
      break;
    }
  }
  if (fold.d.empty() || fold.f.nodes.size() < 3) return Fail();
  fold.d_type = *shapes.ElementType(fold.d);
  auto probe = FunctionProbe::Create(graph, context, fold.f, fold.d, fold.d_type, *gather);
  if (!probe.ok()) return Fail(absl::StrCat("the index function does not run on its own: ", probe.status().message()));
  auto values = probe->Indices(-kProbeRange, kProbeRange);
  if (!values.ok() || values->size() != static_cast<size_t>(2 * kProbeRange + 1)) {
    return Fail("the index function does not map each position to one index");
  }
  fold.bound = SettlingBound(*values, kProbeRange);
  if (fold.bound > kMaxBound) {
    return Fail(absl::StrCat("the index function still changes at |d| = ", fold.bound, " (over ", kMaxBound, ")"));
  }
  auto table = probe->Rows(-fold.bound, fold.bound, graph.UniqueName(gather->input(0) + "_by_position"));
  if (!table.ok()) return Fail(absl::StrCat("the table does not build: ", table.status().message()));
  if (static_cast<int64_t>(table->ByteSizeLong()) > kMaxTableBytes) return Fail("the table would be larger than 16 MiB");
  fold.table = *std::move(table);
  return fold;
}

// Gather(W', Add(Clip(d, -B, B), B)); f's nodes that nothing reads any more go.
void Fold(Graph& graph, BucketFold fold, PassContext& context) {
  Node* gather = fold.gather;
  auto scalar = [&](const std::string& hint, int64_t v) {
    return graph.AddInitializer(MakeIntScalar(graph.UniqueName(hint), fold.d_type, v))->name();
  };
  auto add_node = [&](const std::string& op, std::vector<std::string> inputs, const std::string& hint) {
    const std::string name = graph.UniqueName(hint);
    const std::string output = graph.UniqueName(hint);
    graph.AddNode(MakeNode(op, name, std::move(inputs), {output}), gather, /*after=*/false);
    return output;
  };
  const int64_t bound = fold.bound;
  const std::string clipped = add_node("Clip", {fold.d, scalar("position_low", -bound), scalar("position_high", bound)},
                                       "relative_position_clipped");
  const std::string row = add_node("Add", {clipped, scalar("position_offset", bound)}, "relative_position_row");
  const std::string table_name = fold.table.name();
  graph.AddInitializer(std::move(fold.table));
  graph.SetInput(gather, 0, table_name);
  graph.SetInput(gather, 1, row);
  for (bool removed = true; removed;) {
    removed = false;
    for (const Node* node : fold.f.nodes) {
      Node* mutable_node = graph.Producer(node->output(0));
      if (mutable_node == nullptr || mutable_node->removed()) continue;
      bool read = false;
      for (const std::string& output : mutable_node->proto().output()) {
        read |= graph.HasConsumers(output) || graph.IsGraphOutput(output);
      }
      if (!read) {
        graph.RemoveNode(mutable_node);
        removed = true;
      }
    }
  }
  context.CountRewrite();
}

class FoldRelativePositionBucketsPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fold_relative_position_buckets"; }
  absl::string_view description() const override {
    return "Replace an element-wise function of a relative position feeding an embedding Gather (T5's position "
           "buckets) by a constant table over the positions where the function changes";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    if (context.OpsetVersion("") < 12) return absl::OkStatus();
    RewriteEachMatch(
        graph, context, "fold_relative_position_buckets: ",
        [&](Node* gather) { return MatchBuckets(graph, gather, shapes, context); },
        [&](BucketFold fold) { Fold(graph, std::move(fold), context); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFoldRelativePositionBucketsPass() {
  return std::make_unique<FoldRelativePositionBucketsPass>();
}

}  // namespace onnxopt
