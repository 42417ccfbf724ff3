#include "optimizer/pass_registry.h"

#include "optimizer/passes/passes.h"

namespace onnxopt {

void PassRegistry::Register(std::unique_ptr<Pass> pass) {
  std::string name(pass->name());
  passes_[name] = std::move(pass);
}

void PassRegistry::AddPreset(Preset preset) {
  std::string name = preset.name;
  presets_[name] = std::move(preset);
}

const Pass* PassRegistry::FindPass(const std::string& name) const {
  auto it = passes_.find(name);
  return it == passes_.end() ? nullptr : it->second.get();
}

const Preset* PassRegistry::FindPreset(const std::string& name) const {
  auto it = presets_.find(name);
  return it == presets_.end() ? nullptr : &it->second;
}

std::vector<const Pass*> PassRegistry::passes() const {
  std::vector<const Pass*> result;
  for (const auto& entry : passes_) result.push_back(entry.second.get());
  return result;
}

std::vector<const Preset*> PassRegistry::presets() const {
  std::vector<const Preset*> result;
  for (const auto& entry : presets_) result.push_back(&entry.second);
  return result;
}

std::vector<std::string> Preset::AllPasses() const {
  std::vector<std::string> all;
  for (const auto& group : groups) all.insert(all.end(), group.passes.begin(), group.passes.end());
  return all;
}

const PassRegistry& DefaultPassRegistry() {
  static const PassRegistry* const registry = [] {
    auto* built = new PassRegistry();
    built->Register(MakeEliminateIdentityPass());
    built->Register(MakeEliminateDropoutPass());
    built->Register(MakeEliminateNoopOpsPass());
    built->Register(MakeFoldConstantsPass());
    built->Register(MakeEliminateCommonSubexpressionsPass());
    built->Register(MakeEliminateDuplicateInitializersPass());
    built->Register(MakeEliminateDeadNodesPass());
    built->Register(MakeEliminateUnusedInitializersPass());
    built->Register(MakeGatherRangeToSlicePass());
    built->Register(MakeFoldRelativePositionBucketsPass());
    built->Register(MakeFuseConvBatchNormPass());
    built->Register(MakeFuseConsecutiveTransposesPass());
    built->Register(MakeFixDynamicDimsPass());
    built->Register(MakeEliminateInitializerInputsPass());
    built->Register(MakeFuseReshapeChainsPass());
    built->Register(MakeFuseMatMulAddIntoGemmPass());
    built->Register(MakeFuseConvAddMulPass());
    built->Register(MakeConvertOpsetPass());
    built->Register(MakeUpstreamSlicePass());
    built->Register(MakeFuseTransposeIntoGemmPass());
    built->Register(MakeFuseLayerNormPass());
    built->Register(MakeFuseGeluPass());
    built->Register(MakeFuseSkipLayerNormPass());
    built->Register(MakeFuseAttentionPass());
    built->Register(MakeUnflattenGemmPass());
    built->Register(MakeFuseEmbedLayerNormPass());
    built->Register(MakeCanonicalizeSwapLastAxesPass());
    built->Register(MakeCanonicalizeShapeReadsPass());
    built->Register(MakeConvertFloatPrecisionPass());
    built->Register(MakeQuantizeDynamicInt8Pass());
    built->Register(MakeQuantizeEmbeddingsInt8Pass());
    built->Register(MakeQuantizeStaticInt8Pass());
    built->Register(MakeMakeDimsDynamicPass());
    built->Register(MakeQuantizeWeightsInt4Pass());
    built->Register(MakeRemovePaddingPass());
    const std::vector<std::string> cleanups = {
        "eliminate_identity",         "eliminate_dropout",       "eliminate_noop_ops",
        "fold_constants",             "eliminate_common_subexpressions", "eliminate_duplicate_initializers",
        "eliminate_dead_nodes",       "eliminate_unused_initializers"};
    std::vector<std::string> extended = {"eliminate_initializer_inputs", "fuse_conv_batchnorm", "fuse_conv_add_mul",
                                         "fuse_matmul_add_into_gemm", "fuse_transpose_into_gemm", "fuse_consecutive_transposes",
                                         "fuse_reshape_chains", "gather_range_to_slice", "fold_relative_position_buckets",
                                         "upstream_slice"};
    extended.insert(extended.end(), cleanups.begin(), cleanups.end());
    std::vector<std::string> transformer = {"canonicalize_swap_last_axes", "canonicalize_shape_reads", "unflatten_gemm", "fuse_layer_norm", "fuse_embed_layer_norm", "fuse_gelu", "fuse_skip_layer_norm", "fuse_attention"};
    transformer.insert(transformer.end(), extended.begin(), extended.end());
    built->AddPreset({"none", "no rewrites: validate and benchmark the model as it is", {}});
    // Resolved per model by BuildPipeline; listed here so it is named, described and validated.
    built->AddPreset({kAutoPreset,
                      "the default: the transformer preset for a transformer (any family onnxopt detects), "
                      "extended for anything else; never a pass that changes the model's inputs",
                      {}});
    built->AddPreset({"basic",
                      "safe cleanups until nothing changes: Identity, inference Dropout and no-op nodes, constant "
                      "folding (ONNX Runtime as the evaluator), common subexpressions, duplicate and unused "
                      "initializers, dead nodes",
                      {{cleanups, true}}});
    built->AddPreset({"extended",
                      "basic plus fusions: Conv+BatchNormalization, Conv+Add/Mul, MatMul+Add into Gemm, Transposes into Gemm, Transpose "
                      "and Reshape/Squeeze/Unsqueeze chains, Range+Gather into Slice, relative position buckets into a table, slices "
                      "moved upstream; initializers listed as inputs "
                      "become constants (they can no longer be fed)",
                      {{extended, true}}});
    // The cleanups run to a fixed point first, so the fusions see constants as initializers; the
    // fusions come before extended's structural rewrites (upstream_slice would cut into the last
    // layer's attention).
    built->AddPreset({"transformer",
                      "basic, then transformer fusions with extended: Attention, EmbedLayerNormalization, "
                      "LayerNormalization (and RMSNorm), SkipLayerNormalization and the Gelu family",
                      {{cleanups, true}, {transformer, true}}});
    return built;
  }();
  return *registry;
}

}  // namespace onnxopt
