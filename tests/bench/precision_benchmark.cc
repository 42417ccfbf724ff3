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

namespace onnxopt {
namespace {

namespace fs = std::filesystem;

struct Options {
  int64_t layers = 12, hidden = 768, vocab = 30522, sequence = 128;
  int threads = 2, samples = 100;
  double budget = 30;
  std::vector<std::string> modes = {"int8_dynamic", "int8_static", "fp16", "int4_weight_only"};
};

class Builder {
 public:
  explicit Builder(onnx::GraphProto* graph) : graph_(graph) {}
  std::string Weight(const std::string& name, std::vector<int64_t> dims, float stddev, float mean = 0) {
    onnx::TensorProto* tensor = graph_->add_initializer();
    tensor->set_name(name);
    tensor->set_data_type(onnx::TensorProto::FLOAT);
    int64_t count = 1;
    for (int64_t dim : dims) {
      tensor->add_dims(dim);
      count *= dim;
    }
    std::normal_distribution<float> normal(mean, stddev);
    std::string raw(static_cast<size_t>(count) * sizeof(float), '\0');
    auto* data = reinterpret_cast<float*>(raw.data());
    for (int64_t i = 0; i < count; ++i) data[i] = stddev == 0 ? mean : normal(random_);
    tensor->set_raw_data(std::move(raw));
    return name;
  }
  onnx::NodeProto* Node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
                        const std::string& domain = "") {
    onnx::NodeProto* node = graph_->add_node();
    node->set_op_type(op);
    node->set_name(outputs.front());
    if (!domain.empty()) node->set_domain(domain);
    for (auto& input : inputs) node->add_input(input);
    for (auto& output : outputs) node->add_output(output);
    return node;
  }
  static void Int(onnx::NodeProto* node, const std::string& name, int64_t value) {
    auto* attribute = node->add_attribute();
    attribute->set_name(name);
    attribute->set_type(onnx::AttributeProto::INT);
    attribute->set_i(value);
  }
  static void Float(onnx::NodeProto* node, const std::string& name, float value) {
    auto* attribute = node->add_attribute();
    attribute->set_name(name);
    attribute->set_type(onnx::AttributeProto::FLOAT);
    attribute->set_f(value);
  }
  void Input(const std::string& name) {
    auto* value = graph_->add_input();
    value->set_name(name);
    auto* tensor = value->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(onnx::TensorProto::INT64);
    tensor->mutable_shape()->add_dim()->set_dim_param("batch");
    tensor->mutable_shape()->add_dim()->set_dim_param("sequence");
  }

 private:
  onnx::GraphProto* graph_;
  std::mt19937 random_{1234};
};

onnx::ModelProto BertClassifier(const Options& options) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto* contrib = model.add_opset_import();
  contrib->set_domain("com.microsoft");
  contrib->set_version(1);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("bert_like_classifier");
  Builder b(graph);
  const int64_t h = options.hidden;
  for (const char* name : {"input_ids", "attention_mask", "token_type_ids"}) b.Input(name);
  for (const char* name : {"input_ids", "attention_mask", "token_type_ids"}) {
    Builder::Int(b.Node("Cast", {name}, {std::string(name) + "_int32"}), "to", onnx::TensorProto::INT32);
  }
  auto* embed = b.Node("EmbedLayerNormalization",
                       {"input_ids_int32", "token_type_ids_int32", b.Weight("word_embeddings", {options.vocab, h}, 0.02f),
                        b.Weight("position_embeddings", {512, h}, 0.02f), b.Weight("token_type_embeddings", {2, h}, 0.02f),
                        b.Weight("embeddings_gamma", {h}, 0, 1), b.Weight("embeddings_beta", {h}, 0),
                        "attention_mask_int32"},
                       {"hidden_0", "mask_index"}, "com.microsoft");
  Builder::Float(embed, "epsilon", 1e-12f);
  std::string x = "hidden_0";
  for (int64_t layer = 0; layer < options.layers; ++layer) {
    const std::string p = absl::StrFormat("layer%d_", layer);
    auto* attention = b.Node("Attention",
                             {x, b.Weight(p + "qkv_weight", {h, 3 * h}, 0.02f), b.Weight(p + "qkv_bias", {3 * h}, 0.02f),
                              "mask_index"},
                             {p + "attention"}, "com.microsoft");
    Builder::Int(attention, "num_heads", h / 64);
    b.Node("MatMul", {p + "attention", b.Weight(p + "attention_out_weight", {h, h}, 0.02f)}, {p + "attention_projected"});
    auto* norm1 = b.Node("SkipLayerNormalization",
                         {p + "attention_projected", x, b.Weight(p + "norm1_gamma", {h}, 0, 1),
                          b.Weight(p + "norm1_beta", {h}, 0), b.Weight(p + "attention_out_bias", {h}, 0.02f)},
                         {p + "norm1"}, "com.microsoft");
    Builder::Float(norm1, "epsilon", 1e-12f);
    b.Node("MatMul", {p + "norm1", b.Weight(p + "ffn_in_weight", {h, 4 * h}, 0.02f)}, {p + "ffn_in"});
    b.Node("BiasGelu", {p + "ffn_in", b.Weight(p + "ffn_in_bias", {4 * h}, 0.02f)}, {p + "ffn_gelu"}, "com.microsoft");
    b.Node("MatMul", {p + "ffn_gelu", b.Weight(p + "ffn_out_weight", {4 * h, h}, 0.02f)}, {p + "ffn_out"});
    auto* norm2 = b.Node("SkipLayerNormalization",
                         {p + "ffn_out", p + "norm1", b.Weight(p + "norm2_gamma", {h}, 0, 1),
                          b.Weight(p + "norm2_beta", {h}, 0), b.Weight(p + "ffn_out_bias", {h}, 0.02f)},
                         {p + "output"}, "com.microsoft");
    Builder::Float(norm2, "epsilon", 1e-12f);
    x = p + "output";
  }
  onnx::TensorProto* zero = graph->add_initializer();
  zero->set_name("first_token");
  zero->set_data_type(onnx::TensorProto::INT64);
  zero->add_int64_data(0);
  Builder::Int(b.Node("Gather", {x, "first_token"}, {"cls"}), "axis", 1);
  b.Node("Gemm", {"cls", b.Weight("pooler_weight", {h, h}, 0.02f), b.Weight("pooler_bias", {h}, 0.02f)}, {"pooled"});
  b.Node("Tanh", {"pooled"}, {"pooled_tanh"});
  b.Node("Gemm", {"pooled_tanh", b.Weight("classifier_weight", {h, 2}, 0.2f), b.Weight("classifier_bias", {2}, 0)},
         {"logits"});
  auto* output = graph->add_output();
  output->set_name("logits");
  output->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  output->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_param("batch");
  output->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(2);
  return model;
}

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
  request.config.set_preset("none");
  request.config.mutable_precision()->set_mode(mode);
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
  auto saved = SaveModel(BertClassifier(options), bert);
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
    request.config.set_preset("transformer");
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
