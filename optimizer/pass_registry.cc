#include "optimizer/pass_registry.h"

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {

absl::Status PassRegistry::Register(std::unique_ptr<Pass> pass) {
  std::string name(pass->name());
  if (!passes_.emplace(name, std::move(pass)).second) {
    return absl::AlreadyExistsError(absl::StrCat("a pass named '", name, "' is registered already"));
  }
  return absl::OkStatus();
}

absl::Status PassRegistry::AddPreset(Preset preset) {
  for (const std::string& pass : preset.AllPasses()) {
    if (FindPass(pass) == nullptr) {
      return absl::NotFoundError(absl::StrCat("preset '", preset.name, "' names pass '", pass, "', which is not registered"));
    }
  }
  std::string name = preset.name;
  if (!presets_.emplace(name, std::move(preset)).second) {
    return absl::AlreadyExistsError(absl::StrCat("a preset named '", name, "' exists already"));
  }
  return absl::OkStatus();
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
    // The registry is code: a duplicate name or a preset naming an unknown pass is a programming
    // error that the registry's own test catches; nothing can run on such a build.
    auto must = [](const absl::Status& status) {
      if (status.ok()) return;
      std::cerr << "onnxopt: the pass registry is broken: " << status << std::endl;
      std::abort();
    };
    must(built->Register(MakeEliminateIdentityPass()));
    must(built->Register(MakeEliminateDropoutPass()));
    must(built->Register(MakeEliminateNoopOpsPass()));
    must(built->Register(MakeFoldConstantsPass()));
    must(built->Register(MakeEliminateCommonSubexpressionsPass()));
    must(built->Register(MakeEliminateDuplicateInitializersPass()));
    must(built->Register(MakeEliminateDeadNodesPass()));
    must(built->Register(MakeEliminateUnusedInitializersPass()));
    must(built->Register(MakeGatherRangeToSlicePass()));
    must(built->Register(MakeFoldRelativePositionBucketsPass()));
    must(built->Register(MakeFuseConvBatchNormPass()));
    must(built->Register(MakeFuseConsecutiveTransposesPass()));
    must(built->Register(MakeFixDynamicDimsPass()));
    must(built->Register(MakeEliminateInitializerInputsPass()));
    must(built->Register(MakeFuseReshapeChainsPass()));
    must(built->Register(MakeFuseMatMulAddIntoGemmPass()));
    must(built->Register(MakeFuseConvAddMulPass()));
    must(built->Register(MakeFuseHardSwishPass()));
    must(built->Register(MakeFoldActivationScaleIntoConvPass()));
    must(built->Register(MakeFoldAffineIntoConvPass()));
    must(built->Register(MakeConvertOpsetPass()));
    must(built->Register(MakeUpstreamSlicePass()));
    must(built->Register(MakeFuseTransposeIntoGemmPass()));
    must(built->Register(MakeFuseLayerNormPass()));
    must(built->Register(MakeFuseGeluPass()));
    must(built->Register(MakeFuseSkipLayerNormPass()));
    must(built->Register(MakeFuseRotaryEmbeddingPass()));
    must(built->Register(MakeFuseAttentionPass()));
    must(built->Register(MakeUnflattenGemmPass()));
    must(built->Register(MakeFuseEmbedLayerNormPass()));
    must(built->Register(MakeCanonicalizeSwapLastAxesPass()));
    must(built->Register(MakeLowerEinsumPass()));
    must(built->Register(MakeCanonicalizeFlatHeadsPass()));
    must(built->Register(MakeCanonicalizeFlattenedRowsPass()));
    must(built->Register(MakeCanonicalizeSummedMasksPass()));
    must(built->Register(MakeCanonicalizeHeadBiasesPass()));
    must(built->Register(MakeCanonicalizePackedHeadSplitPass()));
    must(built->Register(MakeCanonicalizeInterleavedQkvPass()));
    must(built->Register(MakeCanonicalizeShapeReadsPass()));
    must(built->Register(MakeCanonicalizeMaskedScoresPass()));
    must(built->Register(MakeInlineKnownBranchesPass()));
    must(built->Register(MakeConvertFloatPrecisionPass()));
    must(built->Register(MakeQuantizeDynamicInt8Pass()));
    must(built->Register(MakeQuantizeEmbeddingsInt8Pass()));
    must(built->Register(MakeQuantizeEmbeddingsInt4Pass()));
    must(built->Register(MakeQuantizeStaticInt8Pass()));
    must(built->Register(MakeMakeDimsDynamicPass()));
    must(built->Register(MakeExtractAdaptersPass()));
    must(built->Register(MakeLogitsToKeepPass()));
    must(built->Register(MakeAppendImagePreprocessingPass()));
    must(built->Register(MakeAppendClassificationPostprocessingPass()));
    must(built->Register(MakeQuantizeWeightsInt4Pass()));
    must(built->Register(MakeRemovePaddingPass()));
    const std::vector<std::string> cleanups = {
        "eliminate_identity",         "eliminate_dropout",       "eliminate_noop_ops",
        "fold_constants",             "eliminate_common_subexpressions", "eliminate_duplicate_initializers",
        "eliminate_dead_nodes",       "eliminate_unused_initializers"};
    std::vector<std::string> extended = {"eliminate_initializer_inputs", "fuse_conv_batchnorm", "fuse_conv_add_mul", "fuse_hard_swish",
                                         "fold_activation_scale_into_conv", "fold_affine_into_conv",
                                         "fuse_matmul_add_into_gemm", "fuse_transpose_into_gemm", "fuse_consecutive_transposes",
                                         "fuse_reshape_chains", "gather_range_to_slice", "fold_relative_position_buckets",
                                         "upstream_slice"};
    extended.insert(extended.end(), cleanups.begin(), cleanups.end());
    std::vector<std::string> transformer = {"inline_known_branches", "lower_einsum", "canonicalize_flat_heads", "canonicalize_swap_last_axes", "canonicalize_packed_head_split", "canonicalize_interleaved_qkv", "canonicalize_shape_reads",
                                            "canonicalize_head_biases", "canonicalize_masked_scores", "canonicalize_summed_masks", "canonicalize_flattened_rows", "unflatten_gemm", "fuse_layer_norm", "fuse_embed_layer_norm", "fuse_gelu", "fuse_skip_layer_norm",
                                            "fuse_rotary_embedding", "canonicalize_shape_reads", "fuse_attention"};
    transformer.insert(transformer.end(), extended.begin(), extended.end());
    must(built->AddPreset({"none", "no rewrites: validate and benchmark the model as it is", {}}));
    // Resolved per model by BuildPipeline; listed here so it is named, described and validated.
    must(built->AddPreset({kAutoPreset,
                      "the default: the transformer preset for a transformer (any family onnxopt detects), "
                      "extended for anything else; never a pass that changes the model's inputs",
                      {}}));
    must(built->AddPreset({"basic",
                      "safe cleanups until nothing changes: Identity, inference Dropout and no-op nodes, constant "
                      "folding (ONNX Runtime as the evaluator), common subexpressions, duplicate and unused "
                      "initializers, dead nodes",
                      {{cleanups, true}}}));
    must(built->AddPreset({"extended",
                      "basic plus fusions: Conv+BatchNormalization, Conv+Add/Mul, hard-swish into HardSigmoid, MatMul+Add into Gemm, Transposes into Gemm, Transpose "
                      "and Reshape/Squeeze/Unsqueeze chains, Range+Gather into Slice, relative position buckets into a table, slices "
                      "moved upstream; initializers listed as inputs "
                      "become constants (they can no longer be fed)",
                      {{extended, true}}}));
    // The cleanups run to a fixed point first, so the fusions see constants as initializers; the
    // fusions come before extended's structural rewrites (upstream_slice would cut into the last
    // layer's attention).
    must(built->AddPreset({"transformer",
                      "basic, then transformer fusions with extended: Attention, EmbedLayerNormalization, "
                      "MultiHeadAttention and RotaryEmbedding, LayerNormalization (and RMSNorm), SkipLayerNormalization and the Gelu family",
                      {{cleanups, true}, {transformer, true}}}));
    return built;
  }();
  return *registry;
}

}  // namespace onnxopt
