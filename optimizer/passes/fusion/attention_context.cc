// The context of an attention block merged back to [B,S,H] (attention_match.h).
#include "optimizer/passes/fusion/attention_match.h"

namespace onnxopt::attention {
namespace {

// The one reader of `value` that is `op` reading it as its first input. Other readers (shape
// arithmetic) are allowed here; the pattern check decides about them.
Node* OnlyReader(const Graph& graph, const std::string& value, const char* op) {
  if (graph.IsGraphOutput(value)) return nullptr;
  Node* found = nullptr;
  for (Node* reader : graph.Consumers(value)) {
    if (reader->op_type() != op || !reader->domain().empty() || reader->input(0) != value) continue;
    if (found != nullptr) return nullptr;
    found = reader;
  }
  return found;
}

// [B,N,S,D] -> (0,2,1,3) -> Reshape to [B,S,H], or flattened to [B*S, H] for a Gemm (the dynamo export
// of GPT-2's Conv1D), which the fused node's output is reshaped to again.
MatchResult<ContextOutput> MatchBatchFirst(const Graph& graph, const ShapeInfo& shapes, Node* transpose,
                                           ContextOutput out) {
  if (PermOf(transpose) != Perm{0, 2, 1, 3}) return Fail();
  Node* reshape = OnlyReader(graph, transpose->output(0), "Reshape");
  if (reshape == nullptr) return Fail();
  const int rank = shapes.Rank(reshape->output(0)).value_or(0);
  auto target = ConstantInts(graph, reshape->input(1));
  out.flattened = rank == 2 && target && target->size() == 2 && (*target)[0] == -1 && (*target)[1] > 0;
  if (out.flattened) out.flat_width = (*target)[1];
  if (rank != 3 && !out.flattened) return Fail();
  out.nodes.push_back(reshape);
  out.reshapes.push_back(reshape);
  out.output = reshape->output(0);
  return out;
}

// The output projection after the merge: Gemm(c, W, b) on [S*B, H] or Add(MatMul(c, W), b); its
// output.
MatchResult<std::string> MatchOutputProjection(const Graph& graph, const std::string& merged, int merged_rank,
                                               ContextOutput* out) {
  Node* projection = OnlyReader(graph, merged, "Gemm");
  if (projection == nullptr) projection = OnlyReader(graph, merged, "MatMul");
  if (projection == nullptr) return Fail();
  if (projection->op_type() == "Gemm" && merged_rank == 2 && projection->GetAttributeInt("transA", 0) == 0 &&
      projection->GetAttributeFloat("alpha", 1.0f) == 1.0f && projection->GetAttributeFloat("beta", 1.0f) == 1.0f &&
      projection->input_size() == 3) {
    out->out_weight = projection->input(1);
    out->out_bias = projection->input(2);
    out->out_weight_transposed = projection->GetAttributeInt("transB", 0) != 0;
    out->nodes.push_back(projection);
    return projection->output(0);
  }
  if (projection->op_type() != "MatMul" || projection->input(0) != merged) return Fail();
  Node* add = SoleConsumer(graph, projection->output(0));
  if (add == nullptr || add->op_type() != "Add" || !add->domain().empty()) return Fail();
  out->out_weight = projection->input(1);
  out->out_bias = OtherInput(*add, add->input(0) == projection->output(0) ? 0 : 1);
  out->nodes.insert(out->nodes.end(), {projection, add});
  return add->output(0);
}

// [B*N,S,D] -> (1,0,2) -> [S,B*N,D] -> Reshape [S*B,H] or [S,B,H] -> projection -> [S,B,H] -> (1,0,2).
MatchResult<ContextOutput> MatchSequenceFirst(const Graph& graph, const ShapeInfo& shapes, Node* transpose,
                                              ContextOutput out) {
  if (PermOf(transpose) != Perm{1, 0, 2}) return Fail();
  Node* merge = OnlyReader(graph, transpose->output(0), "Reshape");
  if (merge == nullptr) return Fail();
  out.nodes.push_back(merge);
  out.reshapes.push_back(merge);
  const int merged_rank = shapes.Rank(merge->output(0)).value_or(0);
  MatchResult<std::string> projected = MatchOutputProjection(graph, merge->output(0), merged_rank, &out);
  if (!projected) return projected.failure();
  std::string value = *projected;
  if (merged_rank == 2) {
    Node* split = OnlyReader(graph, value, "Reshape");
    if (split == nullptr || shapes.Rank(split->output(0)).value_or(0) != 3) return Fail();
    out.nodes.push_back(split);
    out.reshapes.push_back(split);
    value = split->output(0);
  } else if (merged_rank != 3) {
    return Fail();
  }
  Node* back = OnlyReader(graph, value, "Transpose");
  if (back == nullptr || PermOf(back) != Perm{1, 0, 2}) return Fail();
  out.nodes.push_back(back);
  out.output = back->output(0);
  return out;
}

}  // namespace

MatchResult<ContextOutput> MatchContext(const Graph& graph, const ShapeInfo& shapes, Layout layout,
                                        Node* context_matmul) {
  ContextOutput out;
  out.matmul = context_matmul;
  Node* transpose = OnlyReader(graph, context_matmul->output(0), "Transpose");
  if (transpose == nullptr) return Fail();
  out.nodes.push_back(transpose);
  return layout == Layout::kBatchFirst ? MatchBatchFirst(graph, shapes, transpose, std::move(out))
                                       : MatchSequenceFirst(graph, shapes, transpose, std::move(out));
}

}  // namespace onnxopt::attention
