// onnxopt-padding-benchmark: does running the token-wise blocks of a fused encoder on the valid
// tokens only (the remove_padding pass: gathered after each Attention, scattered back before the next)
// pay for its gather/scatter on this machine? A BERT-like encoder in the transformer preset's form
// (tests/bench/bert_like.h) against the pass's output, ONNX Runtime's optimizations on, timed side by
// side in one process by onnxopt's benchmark.
//
//   onnxopt-padding-benchmark [--layers=12] [--hidden=768] [--batch=8] [--sequence=128] [--threads=2]
//                             [--budget=30] [--device=cpu|cuda]
//
// Printed for half the tokens padding (row lengths spread evenly, half of batch x sequence valid) and
// for none: p50 of each form, the speedup of the packed form, and parity on the valid positions
// (logits, and the last hidden states where the mask is 1).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/pass_registry.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/input_generator.h"
#include "tests/bench/bert_like.h"

namespace onnxopt {
namespace {

struct Options {
  int64_t layers = 12, hidden = 768, batch = 8, sequence = 128;
  int threads = 2;
  double budget = 30;
  v1::Device device = v1::DEVICE_CPU;
};

// Rows of valid lengths spread evenly so that `valid_share` of all positions are valid.
GeneratedInputs Inputs(const Options& options, int64_t vocab, double valid_share, std::vector<int64_t>* lengths) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int64_t> id(1, vocab - 1);
  const int64_t total = static_cast<int64_t>(std::lround(valid_share * options.batch * options.sequence));
  lengths->assign(static_cast<size_t>(options.batch), 0);
  int64_t left = total;
  for (int64_t r = 0; r < options.batch; ++r) {
    // Spread around the mean (from 1/4 to 7/4 of it), the last row taking what is left.
    const double mean = static_cast<double>(total) / options.batch;
    const double scale = options.batch > 1 ? 0.25 + 1.5 * r / (options.batch - 1) : 1.0;
    int64_t length = r + 1 == options.batch ? left : static_cast<int64_t>(mean * scale);
    length = std::clamp<int64_t>(length, 1, options.sequence);
    (*lengths)[static_cast<size_t>(r)] = length;
    left -= length;
  }
  GeneratedInputs inputs;
  Ort::AllocatorWithDefaultOptions allocator;
  const int64_t shape[] = {options.batch, options.sequence};
  for (const char* name : {"input_ids", "attention_mask", "token_type_ids"}) {
    Ort::Value value = Ort::Value::CreateTensor<int64_t>(allocator, shape, 2);
    int64_t* data = value.GetTensorMutableData<int64_t>();
    for (int64_t r = 0; r < options.batch; ++r) {
      for (int64_t s = 0; s < options.sequence; ++s) {
        int64_t& v = data[r * options.sequence + s];
        const bool valid = s < (*lengths)[static_cast<size_t>(r)];
        v = std::string(name) == "input_ids" ? (valid ? id(random) : 0) : std::string(name) == "attention_mask" ? valid : 0;
      }
    }
    inputs.names.push_back(name);
    inputs.shapes[name] = absl::StrFormat("%dx%d", options.batch, options.sequence);
    inputs.values.push_back(std::move(value));
  }
  return inputs;
}

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto number = [&](const char* flag, int64_t* out) {
      return absl::StartsWith(arg, flag) && absl::SimpleAtoi(arg.substr(std::string(flag).size()), out);
    };
    int64_t threads = 0;
    if (number("--layers=", &options.layers) || number("--hidden=", &options.hidden) ||
        number("--batch=", &options.batch) || number("--sequence=", &options.sequence)) {
      continue;
    }
    if (number("--threads=", &threads)) {
      options.threads = static_cast<int>(threads);
      continue;
    }
    if (absl::StartsWith(arg, "--budget=") && absl::SimpleAtod(arg.substr(9), &options.budget)) continue;
    if (arg == "--device=cuda" || arg == "--device=cpu") {
      options.device = arg == "--device=cuda" ? v1::DEVICE_CUDA : v1::DEVICE_CPU;
      continue;
    }
    std::cerr << "usage: onnxopt-padding-benchmark [--layers=12] [--hidden=768] [--batch=8] [--sequence=128] "
                 "[--threads=2] [--budget=30] [--device=cpu|cuda]\n";
    return 2;
  }
  if (options.hidden % 64 != 0 || options.sequence > 512) {
    std::cerr << "--hidden must be a multiple of 64 (64-wide heads) and --sequence at most 512\n";
    return 2;
  }
  bench::BertLikeOptions shape;
  shape.layers = options.layers;
  shape.hidden = options.hidden;
  shape.vocab = 30522;
  shape.hidden_output = true;
  const onnx::ModelProto padded = bench::BertClassifier(shape);
  // The packed form is what the remove_padding pass makes of it.
  onnx::ModelProto packed = padded;
  v1::OptimizationConfig pass_list;
  pass_list.add_passes()->set_name("remove_padding");
  absl::StatusOr<Pipeline> pipeline = BuildPipeline(pass_list, DefaultPassRegistry());
  std::vector<v1::PassReport> runs;
  absl::Status rewritten = pipeline.ok() ? RunPipeline(*pipeline, &packed, {}, &runs) : pipeline.status();
  if (!rewritten.ok() || runs.empty() || runs.back().rewrites() != options.layers) {
    std::cerr << "remove_padding did not pack every layer: " << rewritten << "\n";
    return 1;
  }

  SessionSettings settings;
  settings.device = options.device;
  settings.intra_op_threads = options.threads;
  settings.optimization_level = ORT_ENABLE_ALL;
  settings.allow_spinning = false;  // timed in turns: see SessionSettings
  auto padded_session = CreateSession({padded.SerializeAsString(), {}}, settings);
  auto packed_session = CreateSession({packed.SerializeAsString(), {}}, settings);
  if (!padded_session.ok() || !packed_session.ok()) {
    std::cerr << (padded_session.ok() ? packed_session.status() : padded_session.status()) << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("padding removal around the token-wise blocks: %s, %d threads; BERT-like, %d layers, "
                               "hidden %d, batch %d x sequence %d\n",
                               options.device == v1::DEVICE_CUDA ? "CUDA" : CpuDescription(), options.threads,
                               options.layers, options.hidden, options.batch, options.sequence);
  std::cout << absl::StrFormat("%-10s %12s %12s %9s %9s %14s %14s\n", "padding", "padded p50", "packed p50", "speedup",
                               "p10-p90", "logits err", "hidden err");
  for (const double valid : {0.5, 1.0}) {
    std::vector<int64_t> lengths;
    std::vector<GeneratedInputs> inputs;
    inputs.push_back(Inputs(options, shape.vocab, valid, &lengths));
    // Parity on the valid positions.
    auto expected = RunOnInputs(**padded_session, inputs[0], {"logits", "last_hidden_state"});
    auto actual = RunOnInputs(**packed_session, inputs[0], {"logits", "last_hidden_state"});
    if (!expected.ok() || !actual.ok()) {
      std::cerr << (expected.ok() ? actual.status() : expected.status()) << "\n";
      return 1;
    }
    double logits_error = 0, hidden_error = 0;
    const float* a = (*expected)[0].GetTensorData<float>();
    const float* b = (*actual)[0].GetTensorData<float>();
    for (int64_t i = 0; i < options.batch * 2; ++i) logits_error = std::max(logits_error, double(std::fabs(a[i] - b[i])));
    a = (*expected)[1].GetTensorData<float>();
    b = (*actual)[1].GetTensorData<float>();
    for (int64_t r = 0; r < options.batch; ++r) {
      for (int64_t s = 0; s < lengths[static_cast<size_t>(r)]; ++s) {
        for (int64_t c = 0; c < options.hidden; ++c) {
          const int64_t at = (r * options.sequence + s) * options.hidden + c;
          hidden_error = std::max(hidden_error, double(std::fabs(a[at] - b[at])));
        }
      }
    }
    v1::BenchmarkConfig config;
    config.set_time_budget_seconds(options.budget);
    config.set_warmup_runs(3);
    v1::BenchmarkReport report;
    absl::Status timed = Benchmark(**padded_session, **packed_session, inputs, config, RunContext(), &report);
    if (!timed.ok()) {
      std::cerr << timed << "\n";
      return 1;
    }
    std::cout << absl::StrFormat("%-10s %10.2fms %10.2fms %8.3fx %4.2f-%4.2f %14.3e %14.3e\n",
                                 absl::StrFormat("%.0f%%", 100 * (1 - valid)), report.original().p50_ms(),
                                 report.optimized().p50_ms(), report.speedup(), report.speedup_p10(),
                                 report.speedup_p90(), logits_error, hidden_error);
  }
  return 0;
}

}  // namespace
}  // namespace onnxopt

int main(int argc, char** argv) { return onnxopt::Main(argc, argv); }
