// The pipeline for the branches of a main-graph If that hold attention: Optimum's merged decoder (the
// decoder without a past and the one with it, as the branches of an If on `use_cache_branch`, their
// weights in the outer graph). The passes fuse a main graph, whose inputs, shapes and weights they see;
// a branch reads all three from the outer scope. So each such branch is run as a model of its own, whose
// inputs are the outer values it reads (declared as the outer graph declares them) and whose
// initializers are copies of the outer weights it reads, and is put back:
//
// Before:  y = If(c, then_branch: {decoder with a past}, else_branch: {decoder})       (weights outside)
// After:   y = If(c, then_branch: {fused decoder}, else_branch: {fused decoder})
//
// A branch initializer equal to the outer one of its name is dropped (the branch reads the outer one, as
// before); one the passes made or changed stays in the branch, renamed where its name is taken outside;
// initializers equal in every branch of the If (the packed Q/K/V the fusions make from shared weights)
// move to the outer graph once. A branch whose run changed its interface (added an input, changed its
// outputs) is left as it was. Transient memory: each branch's copy of the weights it reads.
#ifndef ONNXOPT_OPTIMIZER_BRANCH_PIPELINES_H_
#define ONNXOPT_OPTIMIZER_BRANCH_PIPELINES_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"

namespace onnxopt {

// Runs a pipeline on one model in place (RunPipeline with the caller's pipeline and options, the
// change budget given: < 0 none), appending its reports; returns its status.
using ModelPipeline =
    std::function<absl::Status(onnx::ModelProto* model, int64_t stop_after_changes, std::vector<v1::PassReport>*)>;

// Whether `graph` (a branch) holds attention: a Softmax at any depth.
bool HoldsAttention(const onnx::GraphProto& graph);

// Runs `run` on every branch of every main-graph If of `model` that holds attention, as above, in
// order, appending the runs' reports to `reports` and sharing `stop_after_changes` (< 0: none) among
// them; `*changes` gets the pass runs that changed a branch. Returns the first failing run's status
// (the model is then whole, the branches so far optimized).
absl::Status RunPipelineOnBranches(onnx::ModelProto* model, const ModelPipeline& run, int64_t stop_after_changes,
                                   std::vector<v1::PassReport>* reports, int64_t* changes);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_BRANCH_PIPELINES_H_
