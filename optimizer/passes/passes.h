// Factories for every pass onnxopt ships; pass_registry.cc registers them.
#ifndef ONNXOPT_OPTIMIZER_PASSES_PASSES_H_
#define ONNXOPT_OPTIMIZER_PASSES_PASSES_H_

#include <memory>

#include "optimizer/pass.h"

namespace onnxopt {

std::unique_ptr<Pass> MakeEliminateIdentityPass();
std::unique_ptr<Pass> MakeEliminateDropoutPass();
std::unique_ptr<Pass> MakeEliminateDeadNodesPass();
std::unique_ptr<Pass> MakeEliminateUnusedInitializersPass();
std::unique_ptr<Pass> MakeEliminateNoopOpsPass();
std::unique_ptr<Pass> MakeEliminateCommonSubexpressionsPass();
std::unique_ptr<Pass> MakeEliminateDuplicateInitializersPass();
std::unique_ptr<Pass> MakeFoldConstantsPass();
std::unique_ptr<Pass> MakeGatherRangeToSlicePass();
std::unique_ptr<Pass> MakeFoldRelativePositionBucketsPass();
std::unique_ptr<Pass> MakeFuseConvBatchNormPass();
std::unique_ptr<Pass> MakeFuseConsecutiveTransposesPass();
std::unique_ptr<Pass> MakeFixDynamicDimsPass();
std::unique_ptr<Pass> MakeEliminateInitializerInputsPass();
std::unique_ptr<Pass> MakeFuseReshapeChainsPass();
std::unique_ptr<Pass> MakeFuseMatMulAddIntoGemmPass();
std::unique_ptr<Pass> MakeFuseConvAddMulPass();
std::unique_ptr<Pass> MakeFuseHardSwishPass();
std::unique_ptr<Pass> MakeFoldActivationScaleIntoConvPass();
std::unique_ptr<Pass> MakeFoldAffineIntoConvPass();
std::unique_ptr<Pass> MakeConvertOpsetPass();
std::unique_ptr<Pass> MakeUpstreamSlicePass();
std::unique_ptr<Pass> MakeFuseTransposeIntoGemmPass();
std::unique_ptr<Pass> MakeFuseLayerNormPass();
std::unique_ptr<Pass> MakeFuseGeluPass();
std::unique_ptr<Pass> MakeFuseSkipLayerNormPass();
std::unique_ptr<Pass> MakeFuseRotaryEmbeddingPass();
std::unique_ptr<Pass> MakeFuseAttentionPass();
std::unique_ptr<Pass> MakeUnflattenGemmPass();
std::unique_ptr<Pass> MakeFuseEmbedLayerNormPass();
std::unique_ptr<Pass> MakeCanonicalizeSwapLastAxesPass();
std::unique_ptr<Pass> MakeLowerEinsumPass();
std::unique_ptr<Pass> MakeCanonicalizeFlatHeadsPass();
std::unique_ptr<Pass> MakeCanonicalizeFlattenedRowsPass();
std::unique_ptr<Pass> MakeCanonicalizeSummedMasksPass();
std::unique_ptr<Pass> MakeCanonicalizeHeadBiasesPass();
std::unique_ptr<Pass> MakeCanonicalizePackedHeadSplitPass();
std::unique_ptr<Pass> MakeCanonicalizeInterleavedQkvPass();
std::unique_ptr<Pass> MakeCanonicalizeShapeReadsPass();
std::unique_ptr<Pass> MakeCanonicalizeMaskedScoresPass();
std::unique_ptr<Pass> MakeInlineKnownBranchesPass();
// Precision (run after a pipeline when the config's precision section asks; listed for explicit use).
std::unique_ptr<Pass> MakeConvertFloatPrecisionPass();
std::unique_ptr<Pass> MakeQuantizeDynamicInt8Pass();
std::unique_ptr<Pass> MakeQuantizeEmbeddingsInt8Pass();
std::unique_ptr<Pass> MakeQuantizeEmbeddingsInt4Pass();
std::unique_ptr<Pass> MakeQuantizeStaticInt8Pass();
std::unique_ptr<Pass> MakeMakeDimsDynamicPass();
std::unique_ptr<Pass> MakeExtractAdaptersPass();
std::unique_ptr<Pass> MakeLogitsToKeepPass();
std::unique_ptr<Pass> MakeAppendImagePreprocessingPass();
std::unique_ptr<Pass> MakeAppendClassificationPostprocessingPass();
std::unique_ptr<Pass> MakeQuantizeWeightsInt4Pass();
std::unique_ptr<Pass> MakeRemovePaddingPass();

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_PASSES_H_
