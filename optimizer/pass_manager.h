// Builds a pipeline from a job's config and runs it: ordered steps, each one pass or a fixed-point
// group of passes repeated until a sweep rewrites nothing or its iteration cap is reached.
// Instrumentation around every pass records wall time, node counts, the op histogram change, rewrites
// and skip reasons; cancellation is checked between passes.
#ifndef ONNXOPT_OPTIMIZER_PASS_MANAGER_H_
#define ONNXOPT_OPTIMIZER_PASS_MANAGER_H_

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/pass_registry.h"
#include "optimizer/run_context.h"
#include "optimizer/shape_info.h"

namespace onnxopt {

struct PassInvocation {
  const Pass* pass;
  PassParams params;
};

struct PipelineStep {
  std::vector<PassInvocation> passes;
  int max_iterations = 1;  // > 1: a fixed-point group
};

struct Pipeline {
  std::vector<PipelineStep> steps;
  ModelHints hints;  // from the config's transformer options
  ActivationRanges activation_ranges;  // calibrated, for int8_static (precision.h)
  std::string preset;  // what runs: a preset's name, "auto: transformer (bert)", or "passes"
  int PassCount() const;  // invocations in one sweep of every step
  std::string ToString() const;  // e.g. "fixed_point(a,b)<=8"
};

inline constexpr int kDefaultMaxIterations = 8;

// One step a pass, each run once: an explicit pass list (`passes`, `passes_before`, `passes_after`).
absl::StatusOr<std::vector<PipelineStep>> PassListSteps(const google::protobuf::RepeatedPtrField<v1::PassSpec>& specs,
                                                        const PassRegistry& registry);

// `passes_before` come first (`passes_after` are checked, not included). INVALID_ARGUMENT for unknown passes/presets, unknown parameters and ill-typed values. The `auto`
// preset (the default) looks at `model`: a transformer (any family DetectTransformer names) gets the
// `transformer` preset's passes, anything else `extended`'s, both without the passes that change the
// model's interface. Without a model (checking a config) it builds the transformer variant.
absl::StatusOr<Pipeline> BuildPipeline(const v1::OptimizationConfig& config, const PassRegistry& registry,
                                       const onnx::ModelProto* model = nullptr);

struct PassManagerOptions {
  RunContext run;  // stops the run when the job is cancelled
  // Called before each pass run with its name, how many runs came before and how many the pipeline
  // makes as far as is known (the passes once, plus each repeated sweep of a fixed-point group).
  std::function<void(const std::string& pass, int done, int total)> on_pass_start;
  // Replays a prefix of the pipeline (bisection): stop once this many pass runs have changed the
  // graph. Passes are deterministic, so the model is then what the full run had at that point.
  int64_t stop_after_changes = -1;
  // Passes to leave out wherever the pipeline names them.
  std::set<std::string> excluded_passes;
};

// Whether a pass run (as reported) changed the graph.
bool PassChangedGraph(const v1::PassReport& report);

// The shapes of a model as it was given, and the seconds their inference took.
struct InitialShapes {
  ShapeInfo shapes;
  double seconds = 0;
};
InitialShapes InferInitialShapes(const onnx::ModelProto& model);

// Whether the pipeline's first pass run that needs shapes comes before any that could change value
// types. RunPipeline then infers the model's shapes before its first pass, so that a caller may infer
// them beside other work and hand them over; the first pass that reads them is reported with their
// inference time, as it would have run it.
bool InfersShapesFirst(const Pipeline& pipeline, const PassManagerOptions& options);

// Runs `pipeline` on `model` in place, appending one PassReport per pass run to `reports`.
// `initial_shapes`: InferInitialShapes(*model), if the caller has it and InfersShapesFirst.
// CANCELLED if cancellation was requested; the model is then as the last finished pass left it.
absl::Status RunPipeline(const Pipeline& pipeline, onnx::ModelProto* model, const PassManagerOptions& options,
                         std::vector<v1::PassReport>* reports,
                         std::optional<InitialShapes> initial_shapes = std::nullopt);

// "Domain::OpType" (plain OpType for the default domain) -> count, over all subgraphs.
std::map<std::string, int64_t> OpHistogram(const onnx::GraphProto& graph);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASS_MANAGER_H_
