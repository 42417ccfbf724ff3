#include "optimizer/validation/bisect.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace onnxopt {
namespace {

// A node's identity across two versions of a graph: what it is and what it makes.
std::string NodeIdentity(const onnx::NodeProto& node) {
  return absl::StrCat(node.domain(), "::", node.op_type(), "(", absl::StrJoin(node.output(), ","), ")");
}

std::string Describe(const onnx::NodeProto& node) {
  return absl::StrCat(node.op_type(), " '", node.name().empty() ? (node.output_size() > 0 ? node.output(0) : "") : node.name(),
                      "'");
}

// The model after the first `changes` graph-changing pass runs of the pipeline, without `excluded`.
absl::StatusOr<onnx::ModelProto> Replay(const onnx::ModelProto& original, const Pipeline& pipeline,
                                        const std::set<std::string>& excluded, int64_t changes,
                                        const RunContext& run) {
  onnx::ModelProto model = original;
  PassManagerOptions options;
  options.run = run;
  options.stop_after_changes = changes;
  options.excluded_passes = excluded;
  std::vector<v1::PassReport> reports;
  absl::Status status = RunPipeline(pipeline, &model, options, &reports);
  if (!status.ok()) return status;
  return model;
}

// The output that fails worst in a parity report.
const v1::OutputParity* WorstFailingOutput(const v1::ParityReport& parity) {
  const v1::OutputParity* worst = nullptr;
  for (const auto& output : parity.outputs()) {
    if (output.passed()) continue;
    if (worst == nullptr || output.max_abs_error() > worst->max_abs_error()) worst = &output;
  }
  return worst;
}

}  // namespace

std::vector<std::string> RemovedNodes(const onnx::GraphProto& before, const onnx::GraphProto& after, size_t limit) {
  std::set<std::string> kept;
  for (const auto& node : after.node()) kept.insert(NodeIdentity(node));
  std::vector<std::string> removed;
  for (const auto& node : before.node()) {
    if (kept.count(NodeIdentity(node)) > 0) continue;
    if (removed.size() == limit) {
      removed.push_back("...");
      break;
    }
    removed.push_back(Describe(node));
  }
  return removed;
}

absl::StatusOr<BisectionResult> BisectAndRecover(const onnx::ModelProto& original, const Pipeline& pipeline,
                                                 const onnx::ModelProto& failed,
                                                 const std::vector<v1::PassReport>& failed_run,
                                                 const ParityProbe& probe, const RunContext& run) {
  BisectionResult result;
  v1::Bisection& bisection = result.bisection;
  bisection.set_ran(true);
  std::set<std::string> excluded;
  onnx::ModelProto failing = failed;
  std::vector<v1::PassReport> reports = failed_run;
  for (int round = 0; round < kMaxCulprits; ++round) {
    // The graph-changing pass runs of the failing pipeline, in order.
    std::vector<const v1::PassReport*> changes;
    for (const auto& report : reports) {
      if (PassChangedGraph(report)) changes.push_back(&report);
    }
    if (changes.empty()) break;  // nothing rewrote the graph: ONNX Runtime disagrees with itself
    // Invariant: the model after `low` changes passes, the one after `high` fails.
    int64_t low = 0, high = static_cast<int64_t>(changes.size());
    onnx::ModelProto passing = original;
    v1::ParityReport failing_parity;
    while (high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      absl::StatusOr<onnx::ModelProto> probe_model = Replay(original, pipeline, excluded, middle, run);
      if (!probe_model.ok()) return probe_model.status();
      v1::ParityReport parity;
      absl::StatusOr<bool> passed = probe(*probe_model, &parity);
      bisection.set_probes(bisection.probes() + 1);
      if (!passed.ok()) return passed.status();
      if (*passed) {
        low = middle;
        passing = *std::move(probe_model);
      } else {
        high = middle;
        failing = *std::move(probe_model);
        failing_parity = std::move(parity);
      }
    }
    if (failing_parity.outputs_size() == 0) {
      // The failing end is still the pipeline's own output: judge it once for the report.
      absl::StatusOr<bool> passed = probe(failing, &failing_parity);
      bisection.set_probes(bisection.probes() + 1);
      if (!passed.ok()) return passed.status();
    }
    const v1::PassReport& culprit_run = *changes[static_cast<size_t>(high - 1)];
    v1::ParityCulprit* culprit = bisection.add_culprits();
    culprit->set_pass(culprit_run.name());
    culprit->set_iteration(culprit_run.iteration());
    culprit->set_position(static_cast<int32_t>(high));
    for (auto& node : RemovedNodes(passing.graph(), failing.graph())) culprit->add_removed_nodes(std::move(node));
    for (auto& node : RemovedNodes(failing.graph(), passing.graph())) culprit->add_added_nodes(std::move(node));
    if (const v1::OutputParity* worst = WorstFailingOutput(failing_parity)) {
      culprit->set_worst_output(worst->name());
      culprit->set_max_abs_error(worst->max_abs_error());
    }
    excluded.insert(culprit_run.name());
    bisection.add_excluded_passes(culprit_run.name());

    // The whole pipeline again, without the culprit.
    onnx::ModelProto candidate = original;
    reports.clear();
    PassManagerOptions options;
    options.run = run;
    options.excluded_passes = excluded;
    absl::Status ran = RunPipeline(pipeline, &candidate, options, &reports);
    if (!ran.ok()) return ran;
    v1::ParityReport parity;
    absl::StatusOr<bool> passed = probe(candidate, &parity);
    bisection.set_probes(bisection.probes() + 1);
    if (!passed.ok()) return passed.status();
    if (*passed) {
      bisection.set_recovered(true);
      bisection.set_note(absl::StrCat("the pipeline without ", absl::StrJoin(excluded, ", "), " passes parity"));
      result.model = std::move(candidate);
      result.passes = std::move(reports);
      result.parity = std::move(parity);
      return result;
    }
    failing = std::move(candidate);
  }
  // Nothing short of the original passed.
  v1::ParityReport parity;
  absl::StatusOr<bool> passed = probe(original, &parity);
  if (!passed.ok()) return passed.status();
  bisection.set_recovered(*passed);
  bisection.set_returned_original(true);
  bisection.set_note(bisection.culprits_size() == 0
                         ? "no pass changed the graph, yet the outputs differ: ONNX Runtime runs the same graph differently"
                         : absl::StrCat("still failing without ", absl::StrJoin(excluded, ", "),
                                        "; the original model is returned"));
  result.model = original;
  result.parity = std::move(parity);
  return result;
}

}  // namespace onnxopt
