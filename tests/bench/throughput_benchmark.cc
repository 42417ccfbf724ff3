// onnxopt-throughput-benchmark: optimizer cost on large generated graphs (25k to 200k nodes): parse
// and save in MB/s, the basic preset in nodes/s, and the time per node at each size, which stays
// flat when the cost grows linearly with the graph.
//
// Each block of 8 nodes gives every basic pass work: an Identity, a Constant to fold, a dead Neg,
// and a pair of identical Muls for CSE.
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"

namespace onnxopt {
namespace {

using Clock = std::chrono::steady_clock;

onnx::NodeProto Node(const std::string& op, std::vector<std::string> inputs, std::string output) {
  onnx::NodeProto node;
  node.set_op_type(op);
  node.set_name(output);
  for (auto& input : inputs) node.add_input(input);
  node.add_output(std::move(output));
  return node;
}

onnx::ModelProto Generate(int blocks) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  auto* opset = model.add_opset_import();
  opset->set_version(14);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("generated");
  auto* input = graph->add_input();
  input->set_name("h0");
  input->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  input->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(4);
  onnx::TensorProto* k = graph->add_initializer();
  k->set_name("k");
  k->set_data_type(onnx::TensorProto::FLOAT);
  k->add_float_data(0.5f);
  for (int i = 1; i <= blocks; ++i) {
    const std::string p = absl::StrCat(i), h = absl::StrCat("h", i - 1);
    onnx::NodeProto constant = Node("Constant", {}, "c" + p);
    auto* value = constant.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    value->mutable_t()->add_float_data(static_cast<float>(i % 7));
    *graph->add_node() = constant;
    *graph->add_node() = Node("Identity", {h}, "a" + p);
    *graph->add_node() = Node("Add", {"a" + p, "c" + p}, "b" + p);
    *graph->add_node() = Node("Relu", {"b" + p}, "d" + p);
    *graph->add_node() = Node("Neg", {"d" + p}, "dead" + p);
    *graph->add_node() = Node("Mul", {"d" + p, "k"}, "s" + p);
    *graph->add_node() = Node("Mul", {"d" + p, "k"}, "t" + p);
    *graph->add_node() = Node("Add", {"s" + p, "t" + p}, absl::StrCat("h", i));
  }
  auto* output = graph->add_output();
  output->set_name(absl::StrCat("h", blocks));
  output->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return model;
}

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

int Main() {
  SetOrtLoggingLevel(ORT_LOGGING_LEVEL_FATAL);
  auto pipeline = BuildPipeline(v1::OptimizationConfig(), DefaultPassRegistry());
  if (!pipeline.ok()) return 1;
  std::cout << absl::StrFormat("%9s %9s %10s %10s %10s %12s %12s %10s\n", "nodes", "MB", "parse MB/s", "save MB/s",
                               "optimize s", "nodes/s", "us per node", "nodes out");
  for (int blocks : {3125, 6250, 12500, 25000}) {
    const std::string bytes = Generate(blocks).SerializeAsString();
    const double megabytes = bytes.size() / 1e6;
    auto start = Clock::now();
    auto model = ParseModel(bytes);
    const double parse = Seconds(start);
    if (!model.ok()) return 1;
    const int64_t nodes = model->graph().node_size();
    start = Clock::now();
    std::vector<v1::PassReport> reports;
    absl::Status status = RunPipeline(*pipeline, &*model, {}, &reports);
    const double optimize = Seconds(start);
    if (!status.ok()) {
      std::cerr << status << "\n";
      return 1;
    }
    start = Clock::now();
    const std::string saved = model->SerializeAsString();
    const double save = Seconds(start);
    std::cout << absl::StrFormat("%9d %9.2f %10.1f %10.1f %10.3f %12.0f %12.2f %10d\n", nodes, megabytes,
                                 megabytes / parse, saved.size() / 1e6 / save, optimize, nodes / optimize,
                                 optimize / nodes * 1e6, model->graph().node_size());
  }
  std::cout << "basic preset (" << pipeline->ToString() << ")\n";
  if (std::getenv("ONNXOPT_BENCH_PASSES") != nullptr) {
    auto model = ParseModel(Generate(12500).SerializeAsString());
    std::vector<v1::PassReport> reports;
    (void)RunPipeline(*pipeline, &*model, {}, &reports);
    for (const auto& report : reports) {
      std::cout << absl::StrFormat("  %-34s iteration %d %8.3f s %8d -> %d\n", report.name(), report.iteration(),
                                   report.duration_seconds(), report.nodes_before(), report.nodes_after());
    }
  }
  return 0;
}

}  // namespace
}  // namespace onnxopt

int main() { return onnxopt::Main(); }
