#include "client/report_format.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"

namespace onnxopt::client {
namespace {

std::string PhaseName(v1::JobPhase phase) {
  std::string name(absl::StripPrefix(v1::JobPhase_Name(phase), "PHASE_"));
  return absl::AsciiStrToLower(name);
}

std::string Latency(const v1::LatencyStats& stats) {
  return absl::StrFormat("%9.3f %9.3f %9.3f %9.3f %9.3f %8.3f %6d %10s", stats.p50_ms(), stats.p90_ms(), stats.p95_ms(),
                         stats.p99_ms(), stats.mean_ms(), stats.stddev_ms(), stats.runs(),
                         stats.peak_memory_bytes() > 0 ? FormatBytes(stats.peak_memory_bytes()) : "-");
}

std::string Shapes(const google::protobuf::Map<std::string, std::string>& shapes) {
  std::vector<std::string> parts;
  for (const auto& shape : shapes) parts.push_back(absl::StrCat(shape.first, "=", shape.second));
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, ", ");
}

void AppendTransformer(const v1::TransformerReport& transformer, std::string* out) {
  if (transformer.family().empty()) return;
  absl::StrAppend(out, "\ntransformer: ", transformer.family(), " (", transformer.family_source(), "), ",
                  transformer.layers(), " layers, ", transformer.num_heads(), " heads, hidden ", transformer.hidden_size(),
                  transformer.fully_fused() ? ", fully fused\n" : ", NOT fully fused\n");
  std::vector<std::string> counts;
  for (const auto& [kind, expected] : transformer.expected_ops()) {
    auto have = transformer.fused_kinds().find(kind);
    counts.push_back(absl::StrCat(kind, " ", have == transformer.fused_kinds().end() ? 0 : have->second, "/", expected));
  }
  absl::StrAppend(out, "fused (have/expected): ", absl::StrJoin(counts, ", "), "\n");
  for (const auto& missing : transformer.missing()) absl::StrAppend(out, "  missing ", missing, "\n");
}

void AppendBisection(const v1::Bisection& bisection, std::string* out) {
  if (!bisection.ran()) return;
  absl::StrAppend(out, "bisection (", bisection.probes(), " probes): ", bisection.note(), "\n");
  for (const auto& culprit : bisection.culprits()) {
    absl::StrAppend(out, "  culprit ", culprit.pass(), " (pass run ", culprit.position(), ", sweep ", culprit.iteration(),
                    ")", culprit.worst_output().empty() ? "" : absl::StrFormat(": %s off by %.3e", culprit.worst_output(),
                                                                                  culprit.max_abs_error()),
                    "\n");
    // The first few nodes say what the pass did; the HTML and JSON reports list them all.
    auto some = [](const google::protobuf::RepeatedPtrField<std::string>& nodes) {
      constexpr int kShown = 6;
      std::vector<std::string> shown(nodes.begin(), nodes.begin() + std::min(nodes.size(), kShown));
      if (nodes.size() > kShown) shown.push_back(absl::StrCat("and ", nodes.size() - kShown, " more"));
      return absl::StrJoin(shown, ", ");
    };
    if (culprit.removed_nodes_size() > 0) absl::StrAppend(out, "    removed ", some(culprit.removed_nodes()), "\n");
    if (culprit.added_nodes_size() > 0) absl::StrAppend(out, "    added   ", some(culprit.added_nodes()), "\n");
  }
}

// "Report for <job> (onnxopt <version>, <seconds>)" and the pipeline the job ran.
void AppendReportTitle(const v1::Report& report, std::string* out) {
  absl::StrAppend(out, "Report for ", report.job().empty() ? "local run" : report.job(), " (onnxopt ",
                  report.optimizer_version(), ", ", absl::StrFormat("%.2f s", report.total_seconds()), ")\n");
  if (!report.pipeline().empty()) absl::StrAppend(out, "pipeline: ", report.pipeline(), "\n");
}

// Nodes, initializers and bytes of both models, side by side.
void AppendModelSizes(const v1::Report& report, std::string* out) {
  absl::StrAppend(out, "\n", absl::StrFormat("%-12s %10s %10s\n", "model", "original", "optimized"));
  absl::StrAppend(out,
                  absl::StrFormat("%-12s %10d %10d\n", "nodes", report.original().nodes(), report.optimized().nodes()));
  absl::StrAppend(out, absl::StrFormat("%-12s %10d %10d\n", "initializers", report.original().initializers(),
                                       report.optimized().initializers()));
  absl::StrAppend(out, absl::StrFormat("%-12s %10s %10s\n", "size", FormatBytes(report.original().model_bytes()),
                                       FormatBytes(report.optimized().model_bytes())));
}

// "op changes   Add 4->2, ..." for every operator whose count changed, in name order.
void AppendOpChanges(const v1::Report& report, std::string* out) {
  std::set<std::string> ops;
  for (const auto& op : report.original().op_histogram()) ops.insert(op.first);
  for (const auto& op : report.optimized().op_histogram()) ops.insert(op.first);
  std::vector<std::string> changed;
  for (const auto& op : ops) {
    const auto b = report.original().op_histogram().find(op);
    const auto a = report.optimized().op_histogram().find(op);
    const int64_t before = b == report.original().op_histogram().end() ? 0 : b->second;
    const int64_t after = a == report.optimized().op_histogram().end() ? 0 : a->second;
    if (before != after) changed.push_back(absl::StrCat(op, " ", before, "->", after));
  }
  if (!changed.empty()) absl::StrAppend(out, "op changes   ", absl::StrJoin(changed, ", "), "\n");
}

// A row per pass run: its time, the node counts around it, its rewrites and what it left alone.
void AppendPassesTable(const v1::Report& report, std::string* out) {
  if (report.passes_size() == 0) return;
  absl::StrAppend(out, "\n", absl::StrFormat("%-32s %4s %10s %14s %8s  %s\n", "pass", "iter", "time ms", "nodes",
                                             "rewrites", "skipped"));
  for (const auto& pass : report.passes()) {
    std::vector<std::string> skipped;
    for (const auto& skip : pass.skipped()) skipped.push_back(absl::StrCat(skip.count(), "x ", skip.reason()));
    absl::StrAppend(out, absl::StrFormat("%-32s %4d %10.3f %6d -> %-6d %8d  %s\n", pass.name(), pass.iteration(),
                                         pass.duration_seconds() * 1000, pass.nodes_before(), pass.nodes_after(),
                                         pass.rewrites(), absl::StrJoin(skipped, "; ")));
  }
}

// The verdict and how the inputs were made, then the input shapes compared.
void AppendParityHeader(const v1::ParityReport& parity, std::string* out) {
  absl::StrAppend(out, parity.passed() ? "PASSED" : "FAILED", " (",
                  parity.precision().empty() ? "fp32" : parity.precision(), ", ",
                  parity.supplied_inputs() ? "supplied inputs" : absl::StrCat("generated inputs, seed ", parity.seed()),
                  PaddedMasks(parity),
                  parity.valid_positions_of().empty()
                      ? ""
                      : absl::StrCat(", compared where ", parity.valid_positions_of(), " is not 0 (remove_padding)"),
                  parity.rows_masked_entirely_skipped() ? ", queries that see only masked keys not compared" : "",
                  ", ", parity.samples(), " sample(s) per shape, ONNX Runtime optimizations ",
                  parity.ort_optimization_level().empty() ? "disabled" : parity.ort_optimization_level(), ")\n");
  for (int i = 0; i < parity.shape_sets_size(); ++i) {
    absl::StrAppend(out, "shape ", i, ": ", Shapes(parity.shape_sets(i).shapes()), "\n");
  }
  if (parity.shape_sets_size() == 0 && parity.input_shapes_size() > 0) {
    absl::StrAppend(out, "inputs: ", Shapes(parity.input_shapes()), "\n");
  }
}

// A row per output and sample: its errors against the tolerances, and the verdict.
void AppendParityOutputs(const v1::ParityReport& parity, std::string* out) {
  absl::StrAppend(out, absl::StrFormat("%-24s %5s %6s %12s %12s %10s %9s %9s  %s\n", "output", "shape", "sample",
                                       "max abs err", "max rel err", "mismatch", "atol", "rtol", "verdict"));
  for (const auto& output : parity.outputs()) {
    absl::StrAppend(out, absl::StrFormat("%-24s %5d %6d %12.3e %12.3e %9.4f%% %9.1e %9.1e  %s%s\n", output.name(),
                                         output.shape_set(), output.sample(), output.max_abs_error(),
                                         output.max_rel_error(), output.mismatch_fraction() * 100, output.atol(),
                                         output.rtol(), output.passed() ? "ok" : "FAIL",
                                         output.note().empty() ? "" : absl::StrCat(" (", output.note(), ")")));
  }
}

// Compared on another device than the reference: each output's bound from the original's own deviation there.
void AppendParityDeviceJudgement(const v1::ParityReport& parity, std::string* out) {
  if (parity.device() == parity.reference()) return;
  absl::StrAppend(out, "reference: ", parity.reference(), "; compared on: ", parity.device(),
                  absl::StrFormat("; an output may stray %gx the original's own deviation there\n",
                                  parity.noise_factor()));
  for (const auto& output : parity.outputs()) {
    absl::StrAppend(out, absl::StrFormat("  %-22s device deviation %.3e, bound %.3e, judged by %s\n", output.name(),
                                         output.device_deviation(), output.noise_bound(),
                                         output.judged_by().empty() ? "-" : output.judged_by()));
  }
}

// A line per length the model ran at besides the exported one, and what could be compared there.
void AppendParityLengths(const v1::ParityReport& parity, std::string* out) {
  for (const auto& check : parity.lengths()) {
    absl::StrAppend(out, absl::StrFormat(
                             "%s at %d (exported %d): %s%s%s%s\n", check.dim(), check.length(), check.exported(),
                             !check.ran() ? "did not run" : check.passed() ? "ok" : "FAIL",
                             check.compared_outputs().empty()
                                 ? ""
                                 : absl::StrFormat(", compared %s on the first %d positions, max abs err %.3e",
                                                   absl::StrJoin(check.compared_outputs(), ", "), check.length(),
                                                   check.max_abs_error()),
                             check.uncompared_outputs().empty()
                                 ? ""
                                 : absl::StrCat(check.length() < check.exported() ? ", not comparable: " : ", ran: ",
                                                absl::StrJoin(check.uncompared_outputs(), ", ")),
                             check.note().empty() ? "" : absl::StrCat(" (", check.note(), ")")));
  }
}

// Cosine and top-1 agreement per output, shown for a reduced precision only (and only where measured).
void AppendParityAgreement(const v1::ParityReport& parity, std::string* out) {
  bool agreement = false;
  for (const auto& output : parity.outputs()) agreement |= output.cosine_similarity() != 0;
  if (!agreement || parity.precision() == "fp32" || parity.precision().empty()) return;
  absl::StrAppend(out, absl::StrFormat("%-24s %6s %12s %10s\n", "output", "sample", "cosine", "top-1"));
  for (const auto& output : parity.outputs()) {
    absl::StrAppend(out, absl::StrFormat("%-24s %6d %12.6f %10s\n", output.name(), output.sample(),
                                         output.cosine_similarity(),
                                         output.top1_agreement() < 0
                                             ? "-"
                                             : absl::StrFormat("%.2f%%", 100 * output.top1_agreement())));
  }
}

void AppendParity(const v1::ParityReport& parity, std::string* out) {
  absl::StrAppend(out, "\nparity: ");
  if (parity.skipped()) {
    absl::StrAppend(out, "skipped\n");
    return;
  }
  if (!parity.not_run().empty()) {
    absl::StrAppend(out, "not run: ", parity.not_run(), "\n");
    return;
  }
  AppendParityHeader(parity, out);
  AppendParityOutputs(parity, out);
  if (parity.has_perplexity()) {
    absl::StrAppend(out, "supplied tokens: ", parity.perplexity().note(), "\n");
  }
  if (parity.generation().ran()) {
    absl::StrAppend(out, "judged by greedy generation: ", parity.generation().passed() ? "PASSED" : "FAILED", " (",
                    parity.generation().note(), ")\n");
  }
  AppendParityDeviceJudgement(parity, out);
  AppendParityLengths(parity, out);
  AppendParityAgreement(parity, out);
  AppendBisection(parity.bisection(), out);
}

// The conversion's line (mode, sizes, nodes and weights converted), its note and the nodes kept in float32.
void AppendPrecisionSummary(const v1::PrecisionReport& precision, std::string* out) {
  const double ratio = precision.size_before_bytes() > 0
                           ? static_cast<double>(precision.size_after_bytes()) / precision.size_before_bytes()
                           : 0.0;
  absl::StrAppend(out, "\nprecision: ", precision.mode(), " -> ",
                  precision.precision().empty() ? "?" : precision.precision(),
                  absl::StrFormat(", size %s -> %s (%.2fx)", FormatBytes(precision.size_before_bytes()),
                                  FormatBytes(precision.size_after_bytes()), ratio),
                  ", ", precision.converted_nodes(), " node(s) converted");
  if (precision.quantized_weights() > 0) {
    absl::StrAppend(out, absl::StrFormat(", %d weight(s) %s -> %s", precision.quantized_weights(),
                                         FormatBytes(precision.weight_bytes_before()),
                                         FormatBytes(precision.weight_bytes_after())));
  }
  if (precision.clamped_weights() > 0) {
    absl::StrAppend(out, ", ", precision.clamped_weights(), " weight value(s) clamped");
  }
  if (precision.auto_mixed_attempts() > 0) {
    absl::StrAppend(out, ", automatic mixed precision judged ", precision.auto_mixed_attempts(), " candidate(s)");
  }
  absl::StrAppend(out, "\n");
  if (!precision.note().empty()) absl::StrAppend(out, "note: ", precision.note(), "\n");
  for (const auto& kept : precision.kept_nodes()) {
    absl::StrAppend(out, "  kept in float32: ", kept.node(), " (", kept.op_type(), "): ", kept.reason(), "\n");
  }
}

// The int4 projections' mean error, then the worst few (against round-to-nearest when another method ran).
void AppendProjectionErrors(const v1::PrecisionReport& precision, std::string* out) {
  if (precision.projections_size() == 0) return;
  const bool other_method = precision.method() != "rtn";
  auto figure = [](double value) { return value < 0 ? std::string("-") : absl::StrFormat("%.4f", value); };
  absl::StrAppend(out, "  int4 error (", precision.method(), "), mean over ", precision.projections_size(),
                  " projection(s): weight ", figure(precision.mean_weight_error()), ", output ",
                  figure(precision.mean_output_error()),
                  other_method ? absl::StrCat("; round-to-nearest: weight ", figure(precision.rtn_mean_weight_error()),
                                              ", output ", figure(precision.rtn_mean_output_error()))
                               : "",
                  "\n");
  if (!precision.projections_note().empty()) absl::StrAppend(out, "  ", precision.projections_note(), "\n");
  constexpr int kWorstShown = 5;
  for (int i = 0; i < precision.projections_size() && i < kWorstShown; ++i) {
    const v1::ProjectionError& projection = precision.projections(i);
    absl::StrAppend(out, absl::StrFormat("    %-48s %5dx%-6d int%d  weight %s  output %s", projection.node(),
                                         projection.k(), projection.n(), projection.bits(),
                                         figure(projection.weight_error()), figure(projection.output_error())),
                    other_method ? absl::StrCat("  (rtn ", figure(projection.rtn_weight_error()), ", ",
                                                figure(projection.rtn_output_error()), ")")
                                 : "",
                    "\n");
  }
}

// The precisions automatic mixed precision tried, and which one it chose.
void AppendPrecisionCandidates(const v1::PrecisionReport& precision, std::string* out) {
  for (const auto& candidate : precision.candidates()) {
    absl::StrAppend(out,
                    absl::StrFormat("  candidate %-5s %s", candidate.mode(), candidate.passed() ? "passed" : "failed"),
                    candidate.p50_ms() > 0 ? absl::StrFormat(", p50 %.3f ms, %.3fx float32", candidate.p50_ms(),
                                                             candidate.speedup())
                                           : "",
                    candidate.chosen() ? " [chosen]" : "",
                    candidate.note().empty() ? "" : absl::StrCat(" (", candidate.note(), ")"), "\n");
  }
}

void AppendPrecision(const v1::PrecisionReport& precision, std::string* out) {
  AppendPrecisionSummary(precision, out);
  AppendProjectionErrors(precision, out);
  AppendPrecisionCandidates(precision, out);
}

// Where and how the benchmark ran: device, provider, ONNX Runtime and its session options.
void AppendBenchmarkSettings(const v1::BenchmarkReport& benchmark, std::string* out) {
  absl::StrAppend(out, benchmark.device(), ", ", benchmark.execution_provider(), ", ONNX Runtime ",
                  benchmark.onnxruntime_version(), " (optimizations ", benchmark.ort_optimization_level(), ", ",
                  benchmark.execution_mode(), ", ",
                  benchmark.intra_op_threads() > 0 ? absl::StrCat(benchmark.intra_op_threads(), " threads")
                                                   : "default threads",
                  benchmark.thread_spinning() ? "" : ", no thread spinning", "), warm-up ", benchmark.warmup_runs(),
                  "\n");
  if (!benchmark.fallback().empty()) absl::StrAppend(out, "FALLBACK: ", benchmark.fallback(), "\n");
}

// Both models' latency statistics; `alone`: the result was timed without the original, which has no row.
void AppendLatencyTable(const v1::LatencyStats& original, const v1::LatencyStats& optimized, bool alone,
                        std::string* out) {
  absl::StrAppend(out, absl::StrFormat("%-10s %9s %9s %9s %9s %9s %8s %6s %10s\n", "model", "p50 ms", "p90 ms",
                                       "p95 ms", "p99 ms", "mean ms", "std ms", "runs", "peak mem"));
  if (!alone) absl::StrAppend(out, absl::StrFormat("%-10s %s\n", "original", Latency(original)));
  absl::StrAppend(out, absl::StrFormat("%-10s %s\n", "optimized", Latency(optimized)));
}

// A latency table per input shape (one for the whole run before shapes were reported), each with its speedup.
void AppendShapeLatencies(const v1::BenchmarkReport& benchmark, bool alone, std::string* out) {
  const bool several = benchmark.shapes_size() > 1;
  if (benchmark.shapes_size() == 0) AppendLatencyTable(benchmark.original(), benchmark.optimized(), alone, out);
  for (int i = 0; i < benchmark.shapes_size(); ++i) {
    const v1::ShapeBenchmark& shape = benchmark.shapes(i);
    if (several) absl::StrAppend(out, "shape ", i, ": ", Shapes(shape.input_shapes()), "\n");
    AppendLatencyTable(shape.original(), shape.optimized(), alone, out);
    if (alone) continue;
    absl::StrAppend(out, absl::StrFormat("speedup    %.3fx (p50 original / p50 optimized; side-by-side runs "
                                         "%.3fx-%.3fx, 10th-90th percentile), %s after %d windows (drift %.1f%%)\n",
                                         shape.speedup(), shape.speedup_p10(), shape.speedup_p90(),
                                         shape.stable() ? "stable" : "NOT stable", shape.windows(),
                                         shape.median_drift() * 100));
  }
  if (alone) {
    absl::StrAppend(out, "original not timed: ", benchmark.original_not_timed(), "\n");
  } else if (benchmark.shapes_size() == 0) {
    absl::StrAppend(out, absl::StrFormat("speedup    %.3fx (p50 original / p50 optimized)\n", benchmark.speedup()));
  }
}

void AppendCudaGraphTiming(const v1::CudaGraphTiming& graph, std::string* out) {
  if (!graph.tried()) return;
  absl::StrAppend(out, graph.qualified() ? absl::StrFormat("CUDA graph: optimized p50 %.3f ms, %.3fx over its plain "
                                                           "device-resident runs\n",
                                                           graph.optimized().p50_ms(), graph.gain())
                                         : absl::StrCat("CUDA graph: does not qualify: ", graph.reason(), "\n"));
}

// The session options tuning found fastest, against the defaults.
void AppendSessionTuning(const v1::SessionTuning& tuning, std::string* out) {
  const auto& best = tuning.best();
  absl::StrAppend(out, absl::StrFormat("session tuning (%d trials): best %s threads, %s, optimizations %s: "
                                       "p50 %.3f ms, %.3fx over the defaults\n",
                                       tuning.trials_size(),
                                       best.intra_op_threads() > 0 ? absl::StrCat(best.intra_op_threads()) : "default",
                                       best.execution_mode(), best.optimization_level(), best.p50_ms(), tuning.gain()));
}

// Device-resident timings with host copies, CUDA graphs, the settings to deploy with, a regression, tuning.
void AppendBenchmarkExtras(const v1::BenchmarkReport& benchmark, bool alone, std::string* out) {
  if (benchmark.device_resident()) {
    absl::StrAppend(out, "device-resident: inputs and outputs bound on the GPU; with host copies:\n");
    AppendLatencyTable(benchmark.original_with_copies(), benchmark.optimized_with_copies(), alone, out);
  }
  AppendCudaGraphTiming(benchmark.cuda_graph(), out);
  if (benchmark.deploy_settings_size() > 0) {
    std::map<std::string, std::string> sorted(benchmark.deploy_settings().begin(), benchmark.deploy_settings().end());
    absl::StrAppend(out, "deploy with: ", absl::StrJoin(sorted, ", ", absl::PairFormatter("=")), "\n");
  }
  if (benchmark.regression()) absl::StrAppend(out, "REGRESSION: the optimized model is slower beyond the noise\n");
  if (benchmark.has_tuning()) AppendSessionTuning(benchmark.tuning(), out);
}

void AppendBenchmark(const v1::BenchmarkReport& benchmark, std::string* out) {
  absl::StrAppend(out, "\nbenchmark: ");
  const bool alone = !benchmark.original_not_timed().empty();  // the result timed without the original
  if (benchmark.skipped() || (benchmark.original().runs() == 0 && !alone)) {
    absl::StrAppend(out, benchmark.skipped() ? "skipped\n" : "not run\n");
    return;
  }
  AppendBenchmarkSettings(benchmark, out);
  AppendShapeLatencies(benchmark, alone, out);
  AppendBenchmarkExtras(benchmark, alone, out);
}

// Whether the original came back, the runtimes the result runs on, and the warnings.
void AppendReportEnding(const v1::Report& report, std::string* out) {
  if (report.returned_original()) absl::StrAppend(out, "\nreturned: the ORIGINAL model (see warnings)\n");
  for (const auto& runtime : report.runtimes()) absl::StrAppend(out, "\nruns on: ", runtime);
  if (report.runtimes_size() > 0) absl::StrAppend(out, "\n");
  for (const auto& warning : report.warnings()) absl::StrAppend(out, "warning: ", warning, "\n");
  for (const auto& line : report.normalizations()) absl::StrAppend(out, "normalized on loading: ", line, "\n");
}

}  // namespace

// The LoRA adapter taken out of the model, and how the model ran with it.
void AppendAdapter(const v1::AdapterReport& adapter, std::string* out) {
  double largest = 0;
  for (const auto& output : adapter.parity().outputs()) largest = std::max(largest, output.max_abs_error());
  const std::string verdict =
      adapter.parity().skipped() ? "not checked (validation skipped)"
      : adapter.parity().passed()
          ? absl::StrFormat("matches the original (max abs err %.3e)", largest)
          : "DOES NOT match the original";
  absl::StrAppend(out, "\nadapter  ", adapter.file(), ": ", adapter.modules_size(), " modules, ", adapter.bytes(),
                  " bytes; active through ONNX Runtime's adapter API the model ", verdict,
                  absl::StrFormat("; with none active it runs the base model (outputs %.3e away)\n",
                                  adapter.base_max_abs_diff()));
}

// Prefill and decode timed per batch, and the greedy generation's verdict.
void AppendGeneration(const v1::GenerationReport& generation, std::string* out) {
  absl::StrAppend(out, "\ngeneration (key/value cache: ", generation.past_inputs_size(), " past inputs):\n");
  if (generation.phases_size() > 0) {
    absl::StrAppend(out, absl::StrFormat("%-8s %5s %5s %5s %12s %12s %8s %12s %12s\n", "phase", "batch", "new", "past",
                                         "orig ms/tok", "opt ms/tok", "speedup", "orig tok/s", "opt tok/s"));
  }
  for (const auto& phase : generation.phases()) {
    absl::StrAppend(out, absl::StrFormat("%-8s %5d %5d %5d ", phase.phase(), phase.batch(), phase.new_tokens(), phase.past()));
    if (!phase.error().empty()) {
      absl::StrAppend(out, "could not run: ", phase.error(), "\n");
      continue;
    }
    if (phase.original().runs() == 0) {  // the original not timed (a model larger than memory)
      absl::StrAppend(out, absl::StrFormat("%12s %12.3f %8s %12s %12.1f", "-", phase.optimized_ms_per_token(), "-", "-",
                                           phase.optimized_tokens_per_second()));
    } else {
      absl::StrAppend(out, absl::StrFormat("%12.3f %12.3f %7.3fx %12.1f %12.1f", phase.original_ms_per_token(),
                                           phase.optimized_ms_per_token(), phase.speedup(),
                                           phase.original_tokens_per_second(), phase.optimized_tokens_per_second()));
    }
    if (phase.optimized_bytes_per_step() > 0 && phase.original().runs() == 0) {
      absl::StrAppend(out, absl::StrFormat("  roofline %3.0f%% (%s a step)", 100 * phase.optimized_roofline_fraction(),
                                           FormatBytes(phase.optimized_bytes_per_step())));
    } else if (phase.optimized_bytes_per_step() > 0) {
      absl::StrAppend(out, absl::StrFormat("  roofline %3.0f%% -> %3.0f%% (%s a step)", 100 * phase.original_roofline_fraction(),
                                           100 * phase.optimized_roofline_fraction(), FormatBytes(phase.optimized_bytes_per_step())));
    }
    absl::StrAppend(out, "\n");
  }
  if (generation.optimized_keeps_last_logits()) {
    absl::StrAppend(out, "logits_to_keep: the optimized model was fed 1, as a generation loop feeds it (its prefill "
                         "projects the last position only, the original every position)\n");
  }
  if (generation.memory_bandwidth_bytes_per_second() > 0) {
    absl::StrAppend(out, absl::StrFormat("roofline: a decode step's bytes (weights, gathered rows, key/value cache) at the "
                                         "measured memory bandwidth of %.1f GB/s\n",
                                         generation.memory_bandwidth_bytes_per_second() / 1e9));
  }
  if (generation.steps_size() > 0) {
    absl::StrAppend(out, absl::StrFormat("greedy generation (batch %d, prompt %d, one row padded on the left): %d steps, "
                                         "%d identical from the start, top-1 agreement %.1f%%, min logits cosine %.6f, KL divergence "
                                         "mean %.5f max %.5f: %s\n",
                                         generation.greedy_batch(), generation.prompt_tokens(), generation.steps_size(),
                                         generation.identical_steps(), 100 * generation.top1_agreement(),
                                         generation.min_logits_cosine(), generation.mean_kl_divergence(),
                                         generation.max_kl_divergence(), generation.passed() ? "PASSED" : "FAILED"));
  }
  if (!generation.note().empty()) absl::StrAppend(out, "note: ", generation.note(), "\n");
}

// The job's peak resident memory stage by stage, against the model's bytes.
void AppendMemory(const v1::MemoryReport& memory, std::string* out) {
  absl::StrAppend(out, "\nmemory: peak ", FormatBytes(memory.peak_resident_bytes()),
                  absl::StrFormat(" resident, %.2fx the model's %s\n", memory.peak_over_model(), FormatBytes(memory.model_bytes())));
  for (const auto& stage : memory.stages()) {
    absl::StrAppend(out, absl::StrFormat("  %-10s peak %12s  after %12s  %8.2f s\n", stage.stage(),
                                         FormatBytes(stage.peak_resident_bytes()), FormatBytes(stage.resident_bytes_after()),
                                         stage.seconds()));
  }
  if (!memory.benchmark_sessions().empty()) absl::StrAppend(out, "  benchmark sessions: ", memory.benchmark_sessions(), "\n");
  if (!memory.original_from_disk().empty()) absl::StrAppend(out, "  original from the disk: ", memory.original_from_disk(), "\n");
}

std::string PaddedMasks(const v1::ParityReport& parity) {
  if (parity.padded_masks().empty()) return "";
  return absl::StrFormat(", %s padded up to %.0f%% per row", absl::StrJoin(parity.padded_masks(), ", "),
                         parity.mask_padding() * 100);
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

std::string JsonObject(const std::vector<std::pair<std::string, std::string>>& fields) {
  google::protobuf::Struct object;
  for (const auto& [key, value] : fields) (*object.mutable_fields())[key].set_string_value(value);
  return ToJson(object);
}

std::string JobAndReportJson(const v1::Job& job, const v1::Report* report) {
  std::string out = absl::StrCat("{\n\"job\": ", ToJson(job));
  if (report != nullptr) absl::StrAppend(&out, ",\n\"report\": ", ToJson(*report));
  absl::StrAppend(&out, "}\n");
  return out;
}

std::string FormatProgressLine(const v1::Job& job) {
  std::string line = absl::StrFormat("%-9s", v1::JobState_Name(job.state()));
  if (job.state() == v1::RUNNING) {
    absl::StrAppend(&line, " ", PhaseName(job.progress().phase()));
    if (job.progress().passes_total() > 0) {
      absl::StrAppend(&line, "  pass ", job.progress().passes_done() + 1, "/", job.progress().passes_total(), " ",
                      job.progress().current_pass());
    } else if (!job.progress().current_pass().empty()) {  // a step of validation or the benchmark
      absl::StrAppend(&line, "  ", job.progress().current_pass());
    }
  }
  return line;
}

std::string FormatJob(const v1::Job& job) {
  using google::protobuf::util::TimeUtil;
  std::string out = absl::StrCat("job      ", job.name(), "\nstate    ", FormatProgressLine(job), "\n");
  absl::StrAppend(&out, "model    ", job.model().display_name(), " (sha256 ", job.model().sha256().substr(0, 12), "…)\n");
  if (job.has_create_time()) absl::StrAppend(&out, "created  ", TimeUtil::ToString(job.create_time()), "\n");
  if (!job.worker().empty()) {
    absl::StrAppend(&out, "worker   ", job.worker(), job.attempts() > 1 ? absl::StrCat(" (attempt ", job.attempts(), ")") : "",
                    "\n");
  }
  if (job.has_start_time() && job.has_end_time()) {
    absl::StrAppend(&out, "took     ",
                    absl::StrFormat("%.2f s", TimeUtil::DurationToMilliseconds(job.end_time() - job.start_time()) / 1000.0),
                    "\n");
  }
  if (job.has_error()) {
    absl::StrAppend(&out, "error    ", v1::ErrorReason::Reason_Name(job.error().reason()), ": ", job.error().message(),
                    "\n");
  }
  if (job.has_result()) {
    const auto& result = job.result();
    absl::StrAppend(&out, "nodes    ", result.nodes_before(), " -> ", result.nodes_after(), "\n");
    absl::StrAppend(&out, "parity   ", result.parity_passed() ? "passed" : "not checked", "\n");
    if (result.speedup() > 0) absl::StrAppend(&out, "speedup  ", absl::StrFormat("%.3fx", result.speedup()), "\n");
    if (result.returned_original()) absl::StrAppend(&out, "returned the ORIGINAL model (see the report's warnings)\n");
    if (result.excluded_passes_size() > 0) {
      absl::StrAppend(&out, "left out ", absl::StrJoin(result.excluded_passes(), ", "), " (they broke parity)\n");
    }
    for (const auto& artifact : result.artifacts()) {
      absl::StrAppend(&out, "artifact ", absl::StrFormat("%-20s %12s", artifact.name(), FormatBytes(artifact.size())), "\n");
    }
  }
  return out;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", bytes / double(int64_t{1} << 30));
  if (bytes >= (1 << 20)) return absl::StrFormat("%.2f MiB", bytes / double(1 << 20));
  if (bytes >= (1 << 10)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrCat(bytes, " B");
}

std::string FormatReport(const v1::Report& report) {
  std::string out;
  AppendReportTitle(report, &out);
  AppendModelSizes(report, &out);
  AppendOpChanges(report, &out);
  AppendPassesTable(report, &out);
  AppendParity(report.parity(), &out);
  if (report.has_precision()) AppendPrecision(report.precision(), &out);
  AppendBenchmark(report.benchmark(), &out);
  if (report.has_generation()) AppendGeneration(report.generation(), &out);
  if (report.has_adapter()) AppendAdapter(report.adapter(), &out);
  if (report.has_memory()) AppendMemory(report.memory(), &out);
  AppendTransformer(report.transformer(), &out);
  AppendReportEnding(report, &out);
  return out;
}

}  // namespace onnxopt::client
