// onnxopt-precision-benchmark: what each precision mode buys against the float32 optimized model,
// measured by onnxopt's own job path (Optimize with the float32 model as input, preset "none", the
// precision mode, parity on many generated samples, and the interleaved benchmark at batch 1).
//
//   onnxopt-precision-benchmark [--layers=12] [--hidden=768] [--vocab=30522] [--sequence=128]
//                               [--threads=2] [--samples=100] [--budget=30]
//                               [--modes=int8_dynamic,int8_static,fp16,int4_weight_only]
//
// Models: a BERT-like sequence classifier generated here in the form the transformer preset gives
// (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu, a tanh pooler and a 2-class
// head; random weights N(0, 0.02), head N(0, 0.2) so that classes are not tied), at BERT-base's sizes
// by default; and the GPT-2 fixture (tests/fixtures/transformers/gpt2_opset17.onnx) after the
// transformer preset, for int4 weight-only. Printed per mode: speedup (p50 float32 / p50 mode, side
// by side in one process), model size ratio, quantized weight bytes ratio, the worst cosine similarity
// over samples and outputs, and the top-1 agreement of the classifier over the samples (int8_static
// calibrates on 16 generated samples apart from the ones parity is judged on).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "tests/bench/bert_like.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;

struct Options {
  int64_t layers = 12, hidden = 768, vocab = 30522, sequence = 128;
  int threads = 2, samples = 100;
  double budget = 30;
  std::vector<std::string> modes = {"int8_dynamic", "int8_static", "fp16", "int4_weight_only"};
};

struct Figures {
  double speedup = 0, size_ratio = 0, weight_ratio = 0, min_cosine = 1, top1 = -1;
  std::string precision, note;
  bool passed = false;
};

absl::StatusOr<Figures> RunMode(const fs::path& model, const std::string& mode, const Options& options) {
  const fs::path out = fs::temp_directory_path() / absl::StrFormat("onnxopt_precision_bench_%d_%s", ::getpid(), mode);
  OptimizeRequest request;
  request.model_path = model;
  request.output_dir = out;
  request.config.set_preset(v1::Pipelines::none);
  v1::PrecisionConfig::Mode parsed;
  if (!v1::PrecisionConfig::Mode_Parse(mode, &parsed)) return absl::InvalidArgumentError("unknown mode " + mode);
  request.config.mutable_precision()->set_mode(parsed);
  (*request.config.mutable_validation()->mutable_dim_values())["sequence"] = options.sequence;
  (*request.config.mutable_validation()->mutable_dim_values())["batch"] = 1;
  request.config.mutable_validation()->set_samples(options.samples);
  request.config.mutable_benchmark()->set_intra_op_threads(options.threads);
  request.config.mutable_benchmark()->set_time_budget_seconds(options.budget);
  auto result = Optimize(request);
  fs::remove_all(out);
  if (!result.ok()) return result.status();
  const v1::Report& report = result->report;
  Figures figures;
  figures.speedup = report.benchmark().speedup();
  figures.precision = report.precision().precision();
  figures.note = report.precision().note();
  figures.passed = report.parity().passed();
  const auto& precision = report.precision();
  if (precision.size_before_bytes() > 0) {
    figures.size_ratio = static_cast<double>(precision.size_after_bytes()) / precision.size_before_bytes();
  }
  if (precision.weight_bytes_before() > 0) {
    figures.weight_ratio = static_cast<double>(precision.weight_bytes_after()) / precision.weight_bytes_before();
  }
  // Batch 1: each sample's classifier output agrees on its arg-max or not; the figure is the share
  // of samples (and rows) that agree.
  double classified = 0, agreed = 0;
  for (const auto& output : report.parity().outputs()) {
    figures.min_cosine = std::min(figures.min_cosine, output.cosine_similarity());
    if (output.top1_agreement() >= 0) {
      classified += 1;
      agreed += output.top1_agreement();
    }
  }
  if (classified > 0) figures.top1 = agreed / classified;
  return figures;
}

void Print(const std::string& model, const std::string& mode, const absl::StatusOr<Figures>& figures) {
  if (!figures.ok()) {
    std::cout << absl::StrFormat("%-28s %-17s failed: %s\n", model, mode, figures.status().ToString());
    return;
  }
  std::cout << absl::StrFormat("%-28s %-17s %-6s %8.2fx %8.3f %9s %10.5f %8s  %s%s\n", model, mode, figures->precision,
                               figures->speedup, figures->size_ratio,
                               figures->weight_ratio > 0 ? absl::StrFormat("%.3f", figures->weight_ratio) : "-",
                               figures->min_cosine,
                               figures->top1 < 0 ? "-" : absl::StrFormat("%.1f%%", 100 * figures->top1),
                               figures->passed ? "parity passed" : "PARITY FAILED",
                               figures->note.empty() ? "" : absl::StrCat(" (", figures->note, ")"));
}

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto number = [&](const char* prefix, int64_t* into) {
      return absl::StartsWith(arg, prefix) && absl::SimpleAtoi(arg.substr(std::string(prefix).size()), into);
    };
    int64_t value = 0;
    if (number("--layers=", &options.layers) || number("--hidden=", &options.hidden) ||
        number("--vocab=", &options.vocab) || number("--sequence=", &options.sequence)) {
    } else if (number("--threads=", &value)) {
      options.threads = static_cast<int>(value);
    } else if (number("--samples=", &value)) {
      options.samples = static_cast<int>(value);
    } else if (absl::StartsWith(arg, "--budget=") && absl::SimpleAtod(arg.substr(9), &options.budget)) {
    } else if (absl::StartsWith(arg, "--modes=")) {
      options.modes = absl::StrSplit(arg.substr(8), ',');
    } else {
      std::cerr << "usage: onnxopt-precision-benchmark [--layers=12] [--hidden=768] [--vocab=30522] [--sequence=128]\n"
                   "       [--threads=2] [--samples=100] [--budget=30] [--modes=int8_dynamic,int8_static,fp16,int4_weight_only]\n";
      return 2;
    }
  }
  if (options.hidden % 64 != 0 || options.layers < 1) {
    std::cerr << "--hidden must be a multiple of 64 (heads of 64) and --layers >= 1\n";
    return 2;
  }
  const fs::path dir = fs::temp_directory_path() / absl::StrFormat("onnxopt_precision_models_%d", ::getpid());
  fs::create_directories(dir);
  const fs::path bert = dir / "bert_like_classifier.onnx";
  bench::BertLikeOptions shape;
  shape.layers = options.layers;
  shape.hidden = options.hidden;
  shape.vocab = options.vocab;
  auto saved = SaveModel(bench::BertClassifier(shape), bert);
  if (!saved.ok()) {
    std::cerr << saved.status() << "\n";
    return 1;
  }
  // The GPT-2 fixture through the transformer preset: the float32 optimized decoder.
  const fs::path gpt2 = dir / "gpt2_fp32_optimized.onnx";
  {
    OptimizeRequest request;
    request.model_path = fs::path(ONNXOPT_SOURCE_DIR) / "tests/fixtures/transformers/gpt2_opset17.onnx";
    request.output_dir = dir / "gpt2";
    request.config.set_preset(v1::Pipelines::transformer);
    request.config.mutable_validation()->set_skip(true);
    request.config.mutable_benchmark()->set_skip(true);
    auto result = Optimize(request);
    if (!result.ok()) {
      std::cerr << result.status() << "\n";
      return 1;
    }
    fs::rename(result->files.front(), gpt2);
  }
  std::cout << absl::StrFormat(
      "Precision modes against the float32 optimized model (%s, %d threads, batch 1, sequence %d, %d samples)\n"
      "BERT-like classifier: %d layers, hidden %d, vocab %d (%.0f MB in float32)\n\n",
      CpuDescription(), options.threads, options.sequence, options.samples, options.layers, options.hidden,
      options.vocab, static_cast<double>(fs::file_size(bert)) / 1e6);
  std::cout << absl::StrFormat("%-28s %-17s %-6s %9s %8s %9s %10s %8s  %s\n", "model", "mode", "result", "speedup",
                               "size", "weights", "min cos", "top-1", "verdict");
  for (const std::string& mode : options.modes) {
    if (mode == "int4_weight_only") continue;
    Print("bert-like classifier", mode, RunMode(bert, mode, options));
  }
  for (const std::string& mode : options.modes) {
    if (mode != "int4_weight_only" && mode != "fp16") continue;
    Print("gpt2 (fixture, transformer)", mode, RunMode(gpt2, mode, options));
  }
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace onnxopt

int main(int argc, char** argv) { return onnxopt::Main(argc, argv); }
