// fuse_attention, rotary half: LLaMA-style attention (RMSNorm, rotary position embeddings applied
// to Q and K after the head split, SwiGLU around it) into ONNX Runtime's MultiHeadAttention.
//
// Before:
//   q = rope(Transpose(Reshape(MatMul(x, Wq), [B,S,N,D]), (0,2,1,3)))  rope(t) = t*cos + rotate_half(t)*sin
//   k = rope(...) -> Transpose(0,1,3,2);  v as BERT's;  scores + mask term -> Softmax -> ... -> [B,S,H]
// After:
//   y = MultiHeadAttention(rope'(x Wq), rope'(x Wk), x Wv, attention_bias = the mask term)
// Attention needs the projections inside it, and the rotation sits between them and the scores, so
// MultiHeadAttention (projections outside) is the operator that fits. rope' is described where it is
// built (fuse_rotary_attention.cc). The mask term becomes attention_bias, -inf as the lowest float.
#ifndef ONNXOPT_OPTIMIZER_PASSES_FUSION_FUSE_ROTARY_ATTENTION_H_
#define ONNXOPT_OPTIMIZER_PASSES_FUSION_FUSE_ROTARY_ATTENTION_H_

#include <string>
#include <vector>

#include "optimizer/passes/fusion/attention_match.h"

namespace onnxopt::attention {

// True if `heads` is x * cos + rotate_half(x) * sin: an Add of two Muls, one of them reading a Concat
// whose first part is negated (LLaMA-style rotary position embeddings).
bool HasRotaryEmbedding(const Graph& graph, const std::string& heads);

// Fuses the attention whose scores `scores` feed `softmax`, when Q and K are rotated; false with a
// reason when a check fails (the graph is then unchanged).
bool FuseRotaryAttention(Graph& graph, Node* softmax, const ShapeInfo& shapes, PassContext& context,
                         const Scores& scores, const std::vector<Node*>& nan_guard, Node* context_matmul,
                         const ContextOutput& out, FusionState* state, std::string* reason);

}  // namespace onnxopt::attention

#endif  // ONNXOPT_OPTIMIZER_PASSES_FUSION_FUSE_ROTARY_ATTENTION_H_
