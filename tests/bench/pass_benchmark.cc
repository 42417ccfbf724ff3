// onnxopt-pass-benchmark: for each seed pass on a PyTorch-exported model that has its pattern, the
// median latency of original vs optimized in ONNX Runtime, timed interleaved in one process, with
// ONNX Runtime's own graph optimizations on (what users run) and off (what the rewrite alone saves).
//
//   onnxopt-pass-benchmark [--iterations=N]        (run from anywhere; fixtures are found in the source tree)
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/validation/parity.h"
#include "optimizer/validation/benchmark.h"

namespace onnxopt {
namespace {

struct Case {
  const char* fixture;
  const char* pass;  // run after the basic cleanups it needs, as in the extended preset
  std::vector<std::pair<const char*, int64_t>> dims;
  // Instead: the basic preset against the extended one (upstream_slice above all), on the model as
  // exported (dynamic dims).
  bool basic_vs_extended = false;
  // Instead: the untouched export against this preset.
  const char* whole_preset = nullptr;
};

absl::StatusOr<double> Ratio(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                             GraphOptimizationLevel level, const v1::OptimizationConfig& config, double* p50_original,
                             double* p50_optimized) {
  SessionSettings settings;
  settings.optimization_level = level;
  settings.allow_spinning = false;  // timed in turns: see SessionSettings
  auto a = CreateSession({original.SerializeAsString(), {}}, settings);
  if (!a.ok()) return a.status();
  auto b = CreateSession({optimized.SerializeAsString(), {}}, settings);
  if (!b.ok()) return b.status();
  v1::BenchmarkReport report;
  absl::Status status = Benchmark(**a, **b, original, config, RunContext(), &report);
  if (!status.ok()) return status;
  *p50_original = report.original().p50_ms();
  *p50_optimized = report.optimized().p50_ms();
  return report.speedup();
}

int Main(int argc, char** argv) {
  int iterations = 300;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--iterations=") && absl::SimpleAtoi(arg.substr(13), &iterations)) continue;
    std::cerr << "usage: onnxopt-pass-benchmark [--iterations=N]\n";
    return 2;
  }
  const std::vector<Case> cases = {
      {"bert_tiny.onnx", "eliminate_identity", {{"batch", 4}, {"sequence", 64}}},
      {"bert_tiny.onnx", "fold_constants", {{"batch", 4}, {"sequence", 64}}},
      {"bert_tiny.onnx", "eliminate_common_subexpressions", {{"batch", 4}, {"sequence", 64}}},
      {"constants_heavy.onnx", "fold_constants", {{"batch", 8}, {"sequence", 128}}},
      {"index_select_arange.onnx", "gather_range_to_slice", {{"batch", 8}, {"sequence", 512}}},
      {"cnn_bn.onnx", "fuse_conv_batchnorm", {{"batch", 16}}},
      {"roberta_cls.onnx", "extended vs basic", {{"batch", 4}, {"sequence", 64}}, true},
      {"bert_tiny.onnx", "transformer preset", {{"batch", 1}, {"sequence", 16}}, false, "transformer"},
      {"bert_tiny.onnx", "transformer preset", {{"batch", 1}, {"sequence", 64}}, false, "transformer"},
      {"bert_tiny.onnx", "transformer preset", {{"batch", 4}, {"sequence", 64}}, false, "transformer"},
      {"gpt2_tiny.onnx", "transformer preset", {{"batch", 1}, {"sequence", 16}}, false, "transformer"},
      {"gpt2_tiny.onnx", "transformer preset", {{"batch", 4}, {"sequence", 64}}, false, "transformer"},
  };
  std::cout << absl::StrFormat("%-26s %-32s %8s | %-27s | %-27s\n", "model (dims)", "pass", "rewrites",
                               "ORT all optimizations", "ORT optimizations off");
  std::cout << absl::StrFormat("%-26s %-32s %8s | %8s %8s %9s | %8s %8s %9s\n", "", "", "", "orig ms", "opt ms",
                               "orig/opt", "orig ms", "opt ms", "orig/opt");
  for (const Case& c : cases) {
    auto original = LoadModel(std::string(ONNXOPT_SOURCE_DIR) + "/tests/fixtures/" + c.fixture);
    if (!original.ok()) {
      std::cerr << c.fixture << ": " << original.status() << "\n";
      return 1;
    }
    v1::OptimizationConfig config;
    for (const char* name : {"eliminate_identity", "fold_constants", "eliminate_dead_nodes", c.pass}) {
      if (c.basic_vs_extended || c.whole_preset != nullptr) break;
      config.add_passes()->set_name(name);
    }
    for (const auto& [name, value] : c.dims) (*config.mutable_validation()->mutable_dim_values())[name] = value;
    config.mutable_benchmark()->set_iterations(iterations);
    config.mutable_benchmark()->set_warmup_runs(20);
    config.mutable_benchmark()->set_time_budget_seconds(60);
    v1::OptimizationConfig baseline_config = config;
    if (c.whole_preset != nullptr) {
      v1::Pipelines::Preset preset = v1::Pipelines::auto_;
      v1::Pipelines::Preset_Parse(c.whole_preset, &preset);
      config.set_preset(preset);
      baseline_config.set_preset(v1::Pipelines::none);
    } else if (c.basic_vs_extended) {
      config.set_preset(v1::Pipelines::extended);
      config.set_max_iterations(30);
      baseline_config.set_preset(v1::Pipelines::basic);
    } else {
      // Baseline: the cleanups the pass needs, without the pass; candidate: with it.
      baseline_config.mutable_passes()->RemoveLast();
    }
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    if (!pipeline.ok()) return 1;
    auto baseline_pipeline = BuildPipeline(baseline_config, DefaultPassRegistry());
    onnx::ModelProto baseline = *original;
    onnx::ModelProto optimized = *original;
    std::vector<v1::PassReport> reports, ignored;
    if (!RunPipeline(*baseline_pipeline, &baseline, {}, &ignored).ok() ||
        !RunPipeline(*pipeline, &optimized, {}, &reports).ok()) {
      return 1;
    }
    const std::string pass = c.pass;
    const bool pass_is_cleanup = !c.basic_vs_extended && c.whole_preset == nullptr && reports.size() == 4 && baseline_config.passes_size() == 3 &&
                                 (pass == "eliminate_identity" || pass == "fold_constants");
    // For a pass that is itself one of the cleanups, compare against the untouched export.
    const onnx::ModelProto& before = pass_is_cleanup ? *original : baseline;
    int64_t rewrites = 0;
    for (const auto& report : reports) {
      if (report.name() == pass || (c.basic_vs_extended && report.name() == "upstream_slice") ||
          c.whole_preset != nullptr) {
        rewrites += report.rewrites();
      }
    }
    double all_a = 0, all_b = 0, off_a = 0, off_b = 0;
    auto all = Ratio(before, optimized, ORT_ENABLE_ALL, config, &all_a, &all_b);
    auto off = Ratio(before, optimized, ORT_DISABLE_ALL, config, &off_a, &off_b);
    if (!all.ok() || !off.ok()) {
      std::cerr << c.fixture << ": " << (all.ok() ? off.status() : all.status()) << "\n";
      return 1;
    }
    std::string label = c.fixture;
    for (const auto& [name, value] : c.dims) label += " " + std::to_string(value);
    std::cout << absl::StrFormat("%-26s %-32s %8d | %8.3f %8.3f %8.3fx | %8.3f %8.3f %8.3fx\n", label, c.pass,
                                 rewrites, all_a, all_b, *all, off_a, off_b, *off);
  }
  std::cout << "orig/opt > 1: the optimized model is faster. Medians of " << iterations
            << " interleaved runs each, ONNX Runtime " << OrtVersion() << ", " << CpuDescription() << ".\n";
  return 0;
}

}  // namespace
}  // namespace onnxopt

int main(int argc, char** argv) { return onnxopt::Main(argc, argv); }
