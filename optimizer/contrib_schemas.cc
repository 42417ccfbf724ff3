#include "optimizer/contrib_schemas.h"

#include <functional>
#include <mutex>
#include <string>

#include "onnx/defs/schema.h"
#include "onnx/defs/shape_inference.h"

namespace onnxopt {
namespace {

constexpr char kMicrosoft[] = "com.microsoft";

// Output `out` gets input `in`'s element type and shape (when the input has them).
void SameAsInput(onnx::InferenceContext& ctx, size_t in, size_t out) {
  if (ctx.getNumOutputs() <= out || ctx.getNumInputs() <= in || ctx.getInputType(in) == nullptr) return;
  onnx::propagateElemTypeFromInputToOutput(ctx, in, out);
  if (onnx::hasInputShape(ctx, in)) onnx::propagateShapeFromInputToOutput(ctx, in, out);
}

// [input dims but the last, `last`] with input `in`'s element type.
void WithLastDim(onnx::InferenceContext& ctx, size_t in, const onnx::TensorShapeProto::Dimension& last) {
  if (ctx.getNumOutputs() < 1 || !onnx::hasInputShape(ctx, in)) return;
  const onnx::TensorShapeProto& shape = onnx::getInputShape(ctx, in);
  if (shape.dim_size() != 3) return;
  onnx::propagateElemTypeFromInputToOutput(ctx, in, 0);
  onnx::TensorShapeProto* output = ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape();
  output->clear_dim();
  *output->add_dim() = shape.dim(0);
  *output->add_dim() = shape.dim(1);
  *output->add_dim() = last;
}

// Attention(input [B,S,H_in], weights [H_in, Q+K+V], ...): [B, S, V], V from qkv_hidden_sizes or a
// third of the weights' columns.
void AttentionShape(onnx::InferenceContext& ctx) {
  std::vector<int64_t> sizes;
  onnx::TensorShapeProto::Dimension v;
  if (onnx::getRepeatedAttribute(ctx, "qkv_hidden_sizes", sizes) && sizes.size() == 3) {
    v.set_dim_value(sizes[2]);
  } else if (onnx::hasInputShape(ctx, 1)) {
    const onnx::TensorShapeProto& weights = onnx::getInputShape(ctx, 1);
    if (weights.dim_size() != 2 || !weights.dim(1).has_dim_value() || weights.dim(1).dim_value() % 3 != 0) return;
    v.set_dim_value(weights.dim(1).dim_value() / 3);
  } else {
    return;
  }
  WithLastDim(ctx, 0, v);
}

// MultiHeadAttention(query [B,S,D], key, value [B,L,Dv], ...): [B, S, Dv] for 3-D query and value.
void MultiHeadAttentionShape(onnx::InferenceContext& ctx) {
  if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 2)) return;
  const onnx::TensorShapeProto& value = onnx::getInputShape(ctx, 2);
  if (value.dim_size() != 3) return;
  WithLastDim(ctx, 0, value.dim(2));
}

// EmbedLayerNormalization(input_ids [B,S], segment_ids, word_embedding [V,H], ...):
// output [B,S,H], mask_index [B] int32, embedding_sum [B,S,H].
void EmbedLayerNormalizationShape(onnx::InferenceContext& ctx) {
  if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 2) || ctx.getNumOutputs() < 1) return;
  const onnx::TensorShapeProto& ids = onnx::getInputShape(ctx, 0);
  const onnx::TensorShapeProto& table = onnx::getInputShape(ctx, 2);
  if (ids.dim_size() != 2 || table.dim_size() != 2) return;
  for (size_t out : {size_t{0}, size_t{2}}) {
    if (ctx.getNumOutputs() <= out) continue;
    onnx::propagateElemTypeFromInputToOutput(ctx, 2, out);
    onnx::TensorShapeProto* shape = ctx.getOutputType(out)->mutable_tensor_type()->mutable_shape();
    shape->clear_dim();
    *shape->add_dim() = ids.dim(0);
    *shape->add_dim() = ids.dim(1);
    *shape->add_dim() = table.dim(1);
  }
  if (ctx.getNumOutputs() > 1) {
    onnx::TypeProto* mask = ctx.getOutputType(1);
    mask->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT32);
    onnx::TensorShapeProto* shape = mask->mutable_tensor_type()->mutable_shape();
    shape->clear_dim();
    *shape->add_dim() = ids.dim(0);
  }
}

// The [rows, columns] output 0 of a packed operator, with input 0's element type.
void PackedOutput(onnx::InferenceContext& ctx, const onnx::TensorShapeProto::Dimension& rows,
                  const onnx::TensorShapeProto::Dimension& columns) {
  onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
  onnx::TensorShapeProto* shape = ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape();
  shape->clear_dim();
  *shape->add_dim() = rows;
  *shape->add_dim() = columns;
}

// RemovePadding(input [B,S,H], sequence_token_count [B]): output [T,H], token_offset [B,S],
// cumulated_seq_len [B+1], max_seq_len [1], the last three int32.
void RemovePaddingShape(onnx::InferenceContext& ctx) {
  if (ctx.getInputType(0) == nullptr || ctx.getNumOutputs() < 1) return;
  onnx::TensorShapeProto::Dimension tokens, hidden;
  const bool shaped = onnx::hasInputShape(ctx, 0) && onnx::getInputShape(ctx, 0).dim_size() == 3;
  if (shaped) hidden = onnx::getInputShape(ctx, 0).dim(2);
  PackedOutput(ctx, tokens, hidden);
  for (size_t out = 1; out < ctx.getNumOutputs(); ++out) {
    onnx::TypeProto_Tensor* tensor = ctx.getOutputType(out)->mutable_tensor_type();
    tensor->set_elem_type(onnx::TensorProto::INT32);
    if (out == 1 && shaped) {
      onnx::TensorShapeProto* shape = tensor->mutable_shape();
      shape->clear_dim();
      *shape->add_dim() = onnx::getInputShape(ctx, 0).dim(0);
      *shape->add_dim() = onnx::getInputShape(ctx, 0).dim(1);
    }
  }
}

// RestorePadding(input [T,H], token_offset [B,S]): [B,S,H].
void RestorePaddingShape(onnx::InferenceContext& ctx) {
  if (ctx.getInputType(0) == nullptr || ctx.getNumOutputs() < 1) return;
  onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
  if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 1)) return;
  const onnx::TensorShapeProto& packed = onnx::getInputShape(ctx, 0);
  const onnx::TensorShapeProto& offsets = onnx::getInputShape(ctx, 1);
  if (packed.dim_size() != 2 || offsets.dim_size() != 2) return;
  onnx::TensorShapeProto* shape = ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape();
  shape->clear_dim();
  *shape->add_dim() = offsets.dim(0);
  *shape->add_dim() = offsets.dim(1);
  *shape->add_dim() = packed.dim(1);
}

// PackedAttention(input [T,H_in], weights [H_in, Q+K+V], ...): [T, V].
void PackedAttentionShape(onnx::InferenceContext& ctx) {
  if (ctx.getInputType(0) == nullptr || ctx.getNumOutputs() < 1) return;
  std::vector<int64_t> sizes;
  onnx::TensorShapeProto::Dimension tokens, v;
  if (onnx::hasInputShape(ctx, 0) && onnx::getInputShape(ctx, 0).dim_size() == 2) {
    tokens = onnx::getInputShape(ctx, 0).dim(0);
  }
  if (onnx::getRepeatedAttribute(ctx, "qkv_hidden_sizes", sizes) && sizes.size() == 3) {
    v.set_dim_value(sizes[2]);
  } else if (onnx::hasInputShape(ctx, 1)) {
    const onnx::TensorShapeProto& weights = onnx::getInputShape(ctx, 1);
    if (weights.dim_size() == 2 && weights.dim(1).has_dim_value() && weights.dim(1).dim_value() % 3 == 0) {
      v.set_dim_value(weights.dim(1).dim_value() / 3);
    }
  }
  PackedOutput(ctx, tokens, v);
}

void Register(const std::string& name, std::function<void(onnx::InferenceContext&)> inference,
              const char* domain = kMicrosoft) {
  onnx::OpSchema schema;
  schema.SetName(name)
      .SetDomain(domain)
      .SinceVersion(1)
      .AllowUncheckedAttributes()
      .Input(0, "inputs", "", "T", onnx::OpSchema::Variadic, /*is_homogeneous=*/false, /*min_arity=*/1)
      .Output(0, "outputs", "", "T", onnx::OpSchema::Variadic, /*is_homogeneous=*/false, /*min_arity=*/1)
      .TypeConstraint("T", onnx::OpSchema::all_tensor_types_with_bfloat(), "any tensor")
      .TypeAndShapeInferenceFunction(std::move(inference));
  onnx::OpSchemaRegistry::OpSchemaRegisterOnce registered(schema);
}

}  // namespace

void EnsureContribSchemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& domains = onnx::OpSchemaRegistry::DomainToVersionRange::Instance();
    if (domains.Map().count(kMicrosoft) == 0) domains.AddDomainToVersion(kMicrosoft, 1, 1);
    auto same_as_input = [](onnx::InferenceContext& ctx) { SameAsInput(ctx, 0, 0); };
    // GroupQueryAttention's output is the query's shape as the fusion writes it (Q, K and V not packed).
    for (const char* name : {"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd", "RotaryEmbedding",
                             "GroupQueryAttention"}) {
      Register(name, same_as_input);
    }
    // Output 3, when asked for, is input + skip (+ bias): the input's shape too.
    for (const char* name : {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}) {
      Register(name, [](onnx::InferenceContext& ctx) {
        SameAsInput(ctx, 0, 0);
        SameAsInput(ctx, 0, 3);
      });
    }
    Register("Attention", AttentionShape);
    Register("MultiHeadAttention", MultiHeadAttentionShape);
    Register("EmbedLayerNormalization", EmbedLayerNormalizationShape);
    Register("RemovePadding", RemovePaddingShape);
    Register("RestorePadding", RestorePaddingShape);
    Register("PackedAttention", PackedAttentionShape);
    // ONNX Runtime defines these two in the default domain since version 1 (ONNX's own
    // LayerNormalization came at 17, and the registry still picks it from opset 17 on); its
    // transformers optimizer writes them into models of any opset. Output 0 is the input's shape.
    for (const char* name : {"LayerNormalization", "SimplifiedLayerNormalization"}) {
      Register(name, same_as_input, "");
    }
  });
}

}  // namespace onnxopt
