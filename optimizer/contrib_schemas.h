// ONNX Runtime's contrib operators that onnxopt's fusions emit (com.microsoft), made known to onnx's
// schema registry with their shape inference, so that one run of onnx's inference carries shapes
// through a fused model. Without them inference stops at every fused node and symbolic_shapes had to
// restart it node by node: a round per fused layer, 32 rounds at most, so the shapes of deep models
// ran out after about a dozen layers, and so did the fusions that need them.
//
// Also the two operators ONNX Runtime defines in the default domain below opset 17 (LayerNormalization,
// SimplifiedLayerNormalization), which its transformers optimizer writes: models already optimized by it
// come in with them (load_normalization.h).
//
// The schemas are permissive (any inputs and outputs, any attributes), so the ONNX checker accepts
// every use ONNX Runtime accepts; only shape inference relies on them, and only for the forms whose
// output shapes are certain (anything else is left unknown, as before).
#ifndef ONNXOPT_OPTIMIZER_CONTRIB_SCHEMAS_H_
#define ONNXOPT_OPTIMIZER_CONTRIB_SCHEMAS_H_

namespace onnxopt {

// Registers the schemas once per process; every use of onnx's registry (checker, inference) calls it
// first, so that what the checker accepts does not depend on what ran before.
void EnsureContribSchemas();

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_CONTRIB_SCHEMAS_H_
