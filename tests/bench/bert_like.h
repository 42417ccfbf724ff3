// A BERT-like sequence classifier in the form onnxopt's transformer preset gives (EmbedLayerNormalization,
// Attention, SkipLayerNormalization, BiasGelu, a tanh pooler on the first token and a 2-class head),
// generated with random weights N(0, 0.02) (head N(0, 0.2), so that classes are not tied), for the
// benchmarks.
#ifndef ONNXOPT_TESTS_BENCH_BERT_LIKE_H_
#define ONNXOPT_TESTS_BENCH_BERT_LIKE_H_

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "onnx/onnx_pb.h"

namespace onnxopt::bench {

struct BertLikeOptions {
  int64_t layers = 12, hidden = 768, vocab = 30522;
  bool hidden_output = false;  // also output the last hidden states, [batch, sequence, hidden]
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

inline onnx::ModelProto BertClassifier(const BertLikeOptions& options) {
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
                             {x, b.Weight(p + "qkv_weight", {h, 3 * h}, 0.02f),
                              b.Weight(p + "qkv_bias", {3 * h}, 0.02f), "mask_index"},
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
  if (options.hidden_output) b.Node("Identity", {x}, {"last_hidden_state"});
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
  if (options.hidden_output) {
    auto* hidden = graph->add_output();
    hidden->set_name("last_hidden_state");
    hidden->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    auto* shape = hidden->mutable_type()->mutable_tensor_type()->mutable_shape();
    shape->add_dim()->set_dim_param("batch");
    shape->add_dim()->set_dim_param("sequence");
    shape->add_dim()->set_dim_value(h);
  }
  return model;
}

}  // namespace onnxopt::bench

#endif  // ONNXOPT_TESTS_BENCH_BERT_LIKE_H_
