// onnxopt-transformer-benchmark: every exported transformer family (tests/fixtures/transformers) at
// batch 1 and sequence 16 and 128 (ViT: its 17 tokens, batch 1 and 8): the median latency of the
// original export and of the transformer preset's output, both run by ONNX Runtime with all its own
// optimizations on, timed interleaved in one process until the medians settle, and their ratio.
//
//   onnxopt-transformer-benchmark [--opsets=11,14,17] [--budget=SECONDS]
//   onnxopt-transformer-benchmark --repeat=N [--fixture=bert_opset14] [--sequence=128] [--threads=N]
//       runs one job (onnxopt's own Optimize, the path a server job takes) N times and prints each
//       reported median and their spread: how far the report can be trusted run to run.
//   onnxopt-transformer-benchmark --hf [--hf-dir=FOLDER] [--budget=SECONDS] [--threads=2] [--only=llama,t5]
//       the Hugging Face exports in tests/fixtures/hf (or FOLDER, e.g. ../shared/fixtures/hf) at batch 1
//       and 8, sequence 128 (ViT and DeiT: their 197 tokens; CLIP's text model: 64 of its 77
//       positions): Attention fused, and onnxopt's output against the original and against the two
//       peers beside it, ONNX Runtime's transformers optimizer (.ortopt.onnx) and onnxscript's
//       optimize_for_ort (.osopt.onnx), each pair interleaved in one process; --only keeps the models
//       whose names contain one of the given words. A model that fails gets a row saying why.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;

fs::path Fixture(const std::string& name) {
  return fs::path(ONNXOPT_SOURCE_DIR) / "tests" / "fixtures" / "transformers" / (name + ".onnx");
}

int Repeat(int times, const std::string& fixture, int64_t sequence, double budget, int threads) {
  std::vector<double> original, optimized, speedups;
  std::cout << absl::StrFormat("%s, batch 1, sequence %d: the same job %d times\n", fixture, sequence, times);
  std::cout << absl::StrFormat("%4s %12s %12s %9s %8s %8s\n", "run", "orig p50 ms", "opt p50 ms", "speedup", "runs", "stable");
  for (int run = 1; run <= times; ++run) {
    const fs::path out = fs::temp_directory_path() / absl::StrFormat("onnxopt_repeat_%d_%d", ::getpid(), run);
    OptimizeRequest request;
    request.model_path = Fixture(fixture);
    request.output_dir = out;
    request.config.set_preset(v1::Pipelines::transformer);
    (*request.config.mutable_validation()->mutable_dim_values())["sequence"] = sequence;
    request.config.mutable_benchmark()->set_time_budget_seconds(budget);
    request.config.mutable_benchmark()->set_intra_op_threads(threads);
    auto result = Optimize(request);
    fs::remove_all(out);
    if (!result.ok()) {
      std::cerr << result.status() << "\n";
      return 1;
    }
    const v1::BenchmarkReport& benchmark = result->report.benchmark();
    original.push_back(benchmark.original().p50_ms());
    optimized.push_back(benchmark.optimized().p50_ms());
    speedups.push_back(benchmark.speedup());
    std::cout << absl::StrFormat("%4d %12.4f %12.4f %8.3fx %8d %8s\n", run, original.back(), optimized.back(),
                                 speedups.back(), benchmark.original().runs(), benchmark.stable() ? "yes" : "no");
  }
  auto spread = [](const std::vector<double>& values) {
    const auto [low, high] = std::minmax_element(values.begin(), values.end());
    const double mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
    return (*high - *low) / mean;
  };
  std::cout << absl::StrFormat("spread of the reported medians, (max - min) / mean: original %.1f%%, optimized %.1f%%, "
                               "speedup %.1f%%\n",
                               spread(original) * 100, spread(optimized) * 100, spread(speedups) * 100);
  return 0;
}

// The transformer preset's output for `original`.
absl::StatusOr<onnx::ModelProto> TransformerPreset(onnx::ModelProto model) {
  v1::OptimizationConfig config;
  config.set_preset(v1::Pipelines::transformer);
  auto pipeline = BuildPipeline(config, DefaultPassRegistry());
  if (!pipeline.ok()) return pipeline.status();
  std::vector<v1::PassReport> reports;
  absl::Status status = RunPipeline(*pipeline, &model, {}, &reports);
  if (!status.ok()) return status;
  return model;
}

// Median latency ratio other/ours for one input shape, both under ONNX Runtime's full optimization.
absl::StatusOr<v1::BenchmarkReport> SideBySide(const onnx::ModelProto& other, const onnx::ModelProto& ours,
                                               const onnx::ModelProto& original, const v1::OptimizationConfig& config,
                                               int threads) {
  SessionSettings settings;         // ORT_ENABLE_ALL: ONNX Runtime's own best
  settings.allow_spinning = false;  // as the job's benchmark: see SessionSettings
  settings.intra_op_threads = threads;
  auto a = CreateSession({other.SerializeAsString(), {}}, settings);
  if (!a.ok()) return a.status();
  auto b = CreateSession({ours.SerializeAsString(), {}}, settings);
  if (!b.ok()) return b.status();
  v1::BenchmarkReport report;
  absl::Status status = Benchmark(**a, **b, original, config, RunContext(), &report);
  if (!status.ok()) return status;
  return report;
}

int HfExports(const fs::path& folder, double budget, int threads, const std::vector<std::string>& only) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string file = entry.path().filename().string();
    if (!absl::EndsWith(file, ".onnx") || absl::StrContains(file, ".ortopt") || absl::StrContains(file, ".osopt")) {
      continue;
    }
    const std::string name = file.substr(0, file.size() - 5);
    if (only.empty() || std::any_of(only.begin(), only.end(), [&](const std::string& w) { return absl::StrContains(name, w); })) {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  std::cout << absl::StrFormat("%-28s %-8s %9s | %10s %9s | %-18s | %-18s\n", "model", "batch", "Attention", "opt ms",
                               "vs orig", "vs ORT optimizer", "vs onnxscript");
  int failures = 0;
  auto failed = [&](const std::string& name, const absl::Status& status) {
    std::cout << absl::StrFormat("%-28s error: %s\n", name, status.message().substr(0, 160));
    ++failures;
  };
  for (const std::string& name : names) {
    auto original = LoadModel(folder / (name + ".onnx"));
    if (!original.ok()) {
      failed(name, original.status());
      continue;
    }
    v1::OptimizationConfig config;
    config.set_preset(v1::Pipelines::transformer);
    absl::StatusOr<onnx::ModelProto> transformed = TransformerPreset(*original);
    if (!transformed.ok()) {
      failed(name, transformed.status());
      continue;
    }
    const onnx::ModelProto& optimized = *transformed;
    int attention = 0;
    for (const auto& node : optimized.graph().node()) {
      attention += node.op_type() == "Attention" || node.op_type() == "MultiHeadAttention" ||
                   node.op_type() == "GroupQueryAttention";
    }
    const int expected = 2;  // every export has two layers
    std::vector<std::pair<std::string, absl::StatusOr<onnx::ModelProto>>> peers;
    for (const char* peer : {".ortopt", ".osopt"}) peers.emplace_back(peer, LoadModel(folder / (name + peer + ".onnx")));
    const bool vision = absl::StartsWith(name, "vit") || absl::StartsWith(name, "deit");
    const int64_t sequence = absl::StartsWith(name, "clip") ? 64 : 128;  // CLIP's text model has 77 positions
    for (int64_t batch : {1, 8}) {
      config.mutable_validation()->clear_dim_values();
      (*config.mutable_validation()->mutable_dim_values())["batch"] = batch;
      if (!vision) (*config.mutable_validation()->mutable_dim_values())["sequence"] = sequence;
      config.mutable_benchmark()->set_time_budget_seconds(budget);
      config.mutable_benchmark()->set_warmup_runs(10);
      auto against_original = SideBySide(*original, optimized, *original, config, threads);
      if (!against_original.ok()) {
        failed(name, against_original.status());
        break;
      }
      std::string columns[2];
      for (size_t i = 0; i < peers.size(); ++i) {
        if (!peers[i].second.ok()) {
          columns[i] = "absent";
          continue;
        }
        auto report = SideBySide(*peers[i].second, optimized, *original, config, threads);
        columns[i] = report.ok() ? absl::StrFormat("%.3fx (%.3f ms)", report->speedup(), report->original().p50_ms())
                                 : "fails to run";
      }
      std::cout << absl::StrFormat("%-28s %-8s %6d/%-2d | %10.4f %8.3fx | %-18s | %-18s\n", name,
                                   absl::StrFormat("%d x %s", batch, vision ? "197" : absl::StrCat(sequence)), attention, expected,
                                   against_original->optimized().p50_ms(), against_original->speedup(), columns[0],
                                   columns[1]);
    }
  }
  std::cout << "vs X = X's median / onnxopt's median (> 1: onnxopt is faster), pairs timed interleaved until stable "
               "(2%) or "
            << budget << " s; ONNX Runtime " << OrtVersion() << " with all its optimizations on for every model, "
            << (threads > 0 ? absl::StrFormat("%d intra-op threads", threads) : std::string("default threads"))
            << ", thread spinning off, " << CpuDescription() << ".\n";
  return failures == 0 ? 0 : 1;
}

int Main(int argc, char** argv) {
  std::vector<int> opsets = {11, 14, 17};
  double budget = 6;
  int repeat = 0;
  int threads = 0;
  std::string fixture = "bert_opset14";
  int64_t sequence = 128;
  bool hf = false;
  fs::path hf_dir = fs::path(ONNXOPT_SOURCE_DIR) / "tests" / "fixtures" / "hf";
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool ok = false;
    if (arg == "--hf") {
      hf = ok = true;
    } else if (absl::StartsWith(arg, "--hf-dir=")) {
      hf_dir = arg.substr(9);
      ok = fs::is_directory(hf_dir);
    } else if (absl::StartsWith(arg, "--opsets=")) {
      opsets.clear();
      ok = true;
      for (absl::string_view part : absl::StrSplit(arg.substr(9), ',')) {
        int opset = 0;
        ok &= absl::SimpleAtoi(part, &opset);
        opsets.push_back(opset);
      }
    } else if (absl::StartsWith(arg, "--budget=")) {
      ok = absl::SimpleAtod(arg.substr(9), &budget) && budget > 0;
    } else if (absl::StartsWith(arg, "--repeat=")) {
      ok = absl::SimpleAtoi(arg.substr(9), &repeat) && repeat > 0;
    } else if (absl::StartsWith(arg, "--fixture=")) {
      fixture = arg.substr(10);
      ok = fs::exists(Fixture(fixture));
    } else if (absl::StartsWith(arg, "--threads=")) {
      ok = absl::SimpleAtoi(arg.substr(10), &threads) && threads >= 0;
    } else if (absl::StartsWith(arg, "--only=")) {
      only = absl::StrSplit(arg.substr(7), ',', absl::SkipEmpty());
      ok = !only.empty();
    } else if (absl::StartsWith(arg, "--sequence=")) {
      ok = absl::SimpleAtoi(arg.substr(11), &sequence) && sequence > 0 && sequence <= 128;
    }
    if (!ok) {
      std::cerr << "usage: onnxopt-transformer-benchmark [--opsets=11,14,17] [--budget=SECONDS]\n"
                   "       onnxopt-transformer-benchmark --repeat=N [--fixture=bert_opset14] [--sequence=1..128]"
                   " [--threads=N]\n"
                   "       onnxopt-transformer-benchmark --hf [--hf-dir=FOLDER] [--budget=SECONDS] [--threads=N]"
                   " [--only=WORD,...]\n";
      return 2;
    }
  }
  if (repeat > 0) return Repeat(repeat, fixture, sequence, budget, threads);
  if (hf) return HfExports(hf_dir, budget, threads, only);

  struct Case {
    std::string family;
    std::vector<std::pair<std::string, int64_t>> dims;
  };
  const std::vector<Case> cases = {
      {"bert", {{"sequence", 16}}},    {"bert", {{"sequence", 128}}},    {"roberta", {{"sequence", 16}}},
      {"roberta", {{"sequence", 128}}}, {"gpt2", {{"sequence", 16}}},    {"gpt2", {{"sequence", 128}}},
      {"vit", {{"batch", 1}}},          {"vit", {{"batch", 8}}},
  };
  std::cout << absl::StrFormat("%-18s %-14s %6s | %10s %10s %9s %17s %7s\n", "fixture", "shape", "nodes", "orig ms",
                               "opt ms", "orig/opt", "pairs p10-p90", "stable");
  for (int opset : opsets) {
    for (const Case& c : cases) {
      const std::string name = absl::StrFormat("%s_opset%d", c.family, opset);
      auto original = LoadModel(Fixture(name));
      if (!original.ok()) {
        std::cerr << name << ": " << original.status() << "\n";
        return 1;
      }
      v1::OptimizationConfig config;
      absl::StatusOr<onnx::ModelProto> transformed = TransformerPreset(*original);
      if (!transformed.ok()) {
        std::cerr << name << ": " << transformed.status() << "\n";
        return 1;
      }
      const onnx::ModelProto& optimized = *transformed;
      for (const auto& [dim, value] : c.dims) (*config.mutable_validation()->mutable_dim_values())[dim] = value;
      config.mutable_benchmark()->set_time_budget_seconds(budget);
      config.mutable_benchmark()->set_warmup_runs(20);
      absl::StatusOr<v1::BenchmarkReport> timed = SideBySide(*original, optimized, *original, config, threads);
      if (!timed.ok()) {
        std::cerr << name << ": " << timed.status() << "\n";
        return 1;
      }
      const v1::BenchmarkReport& report = *timed;
      const std::string shape = c.family == "vit" ? absl::StrFormat("batch %d", c.dims[0].second)
                                                  : absl::StrFormat("1 x %d", c.dims[0].second);
      std::cout << absl::StrFormat("%-18s %-14s %6d | %10.4f %10.4f %8.3fx %8.3fx-%.3fx %7s\n", name, shape,
                                   CountNodes(optimized.graph()), report.original().p50_ms(), report.optimized().p50_ms(),
                                   report.speedup(), report.speedup_p10(), report.speedup_p90(),
                                   report.stable() ? "yes" : "no");
    }
  }
  std::cout << "orig/opt > 1: the optimized model is faster. Medians of interleaved runs until stable (2%) or "
            << budget << " s, ONNX Runtime " << OrtVersion() << " with all its optimizations on for both, "
            << CpuDescription() << ".\n";
  return 0;
}

}  // namespace
}  // namespace onnxopt

int main(int argc, char** argv) { return onnxopt::Main(argc, argv); }
