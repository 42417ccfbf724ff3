// Bound runs (IoBinding) on the CPU: the same code path the CUDA benchmark takes with device memory.
// Their outputs are the plain run's, fixed output buffers are written in place run after run, and the
// benchmark times bound runs like plain ones. CUDA graphs are not tried off CUDA.
#include "optimizer/validation/bound_run.h"

#include "gtest/gtest.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/parity.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

// y = Relu(x W) + 1, x [8, 32]; and an int64 input passed through, to bind more than floats.
onnx::ModelProto SmallModel() {
  onnx::GraphProto graph;
  *graph.add_node() = testing::MakeNode("MatMul", {"x", "w"}, {"xw"});
  *graph.add_node() = testing::MakeNode("Relu", {"xw"}, {"r"});
  *graph.add_node() = testing::MakeNode("Add", {"r", "one"}, {"y"});
  *graph.add_node() = testing::MakeNode("Identity", {"ids"}, {"ids_out"});
  *graph.add_initializer() = testing::FloatTensor("w", {32, 16}, testing::RandomFloats(32 * 16, 3));
  *graph.add_initializer() = testing::FloatTensor("one", {1}, {1.0f});
  *graph.add_input() = testing::FloatValue("x", {8, 32});
  *graph.add_input() = testing::MakeValue("ids", onnx::TensorProto::INT64, {8});
  *graph.add_output() = testing::FloatValue("y", {8, 16});
  *graph.add_output() = testing::MakeValue("ids_out", onnx::TensorProto::INT64, {8});
  return testing::MakeModel(graph, 13);
}

struct Fixture {
  onnx::ModelProto model = SmallModel();
  std::unique_ptr<Ort::Session> session;
  GeneratedInputs inputs;
  std::vector<std::string> outputs;
  std::vector<Ort::Value> plain;

  Fixture() {
    auto created = CreateSession({model.SerializeAsString(), {}}, SessionSettings());
    EXPECT_TRUE(created.ok()) << created.status();
    session = *std::move(created);
    auto generated = GenerateInputs(*session, model, v1::ValidationConfig(), {}, 0);
    EXPECT_TRUE(generated.ok()) << generated.status();
    inputs = *std::move(generated);
    outputs = OutputNames(*session);
    auto ran = RunOnInputs(*session, inputs, outputs);
    EXPECT_TRUE(ran.ok());
    plain = *std::move(ran);
  }

  void ExpectPlainOutputs(std::vector<Ort::Value> got) {
    ASSERT_EQ(got.size(), plain.size());
    for (size_t i = 0; i < got.size(); ++i) {
      v1::OutputParity compared;
      CompareOutput(plain[i], got[i], 0, 0, &compared);
      EXPECT_TRUE(compared.passed()) << outputs[i] << ": " << compared.DebugString();
    }
  }
};

TEST(BoundRunTest, DeviceResidentAndHostBoundRunsGiveThePlainOutputs) {
  Fixture fixture;
  for (Residence residence : {Residence::kDevice, Residence::kHost}) {
    auto run = BoundRun::Create(*fixture.session, fixture.inputs, fixture.outputs, v1::DEVICE_CPU, residence);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_TRUE((*run)->Run().ok());
    fixture.ExpectPlainOutputs((*run)->Outputs());
  }
}

TEST(BoundRunTest, FixedOutputsAreWrittenInPlaceRunAfterRun) {
  Fixture fixture;
  auto run = BoundRun::Create(*fixture.session, fixture.inputs, fixture.outputs, v1::DEVICE_CPU, Residence::kDevice);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ((*run)->FixOutputs().code(), absl::StatusCode::kFailedPrecondition) << "nothing to fix before a run";
  ASSERT_TRUE((*run)->Run().ok());
  ASSERT_TRUE((*run)->FixOutputs().ok());
  std::vector<Ort::Value> fixed = (*run)->Outputs();
  const float* buffer = fixed[0].GetTensorData<float>();
  // Scribble over the fixed buffer: the next run must overwrite it, at the same address.
  float* writable = fixed[0].GetTensorMutableData<float>();
  for (int i = 0; i < 8 * 16; ++i) writable[i] = -1000;
  ASSERT_TRUE((*run)->Run().ok());
  std::vector<Ort::Value> again = (*run)->Outputs();
  EXPECT_EQ(again[0].GetTensorData<float>(), buffer);
  fixture.ExpectPlainOutputs(std::move(again));
}

TEST(BoundRunTest, CopiedValuesKeepTypesShapesAndData) {
  Fixture fixture;
  auto copied = CopyValues(fixture.inputs.names, fixture.inputs.values, v1::DEVICE_CPU, DeviceMemory(v1::DEVICE_CPU));
  ASSERT_TRUE(copied.ok()) << copied.status();
  ASSERT_EQ(copied->size(), fixture.inputs.values.size());
  for (size_t i = 0; i < copied->size(); ++i) {
    EXPECT_NE((*copied)[i].GetTensorRawData(), fixture.inputs.values[i].GetTensorRawData()) << "a copy";
    v1::OutputParity compared;
    CompareOutput(fixture.inputs.values[i], (*copied)[i], 0, 0, &compared);
    EXPECT_TRUE(compared.passed()) << fixture.inputs.names[i];
  }
}

TEST(BoundRunTest, TheBenchmarkTimesBoundRunsAndCudaGraphsAreNotTriedOffCuda) {
  Fixture fixture;
  std::vector<GeneratedInputs> sets;
  sets.push_back(std::move(fixture.inputs));
  v1::BenchmarkConfig config;
  config.set_iterations(20);
  TimingMode mode;
  mode.bound = true;
  v1::BenchmarkReport report;
  ASSERT_TRUE(Benchmark(*fixture.session, *fixture.session, sets, config, RunContext(), &report, mode).ok());
  EXPECT_EQ(report.original().runs(), 20);
  EXPECT_GT(report.optimized().p50_ms(), 0);
  EXPECT_FALSE(report.device_resident()) << "bound on the CPU: there is no device to be resident on";

  auto graph = TimeCudaGraph({fixture.model.SerializeAsString(), {}}, *fixture.session, SessionSettings(), sets.front(),
                             1, RunContext());
  ASSERT_TRUE(graph.ok());
  EXPECT_FALSE(graph->tried());
  EXPECT_FALSE(graph->qualified());
  EXPECT_NE(graph->reason().find("CUDA"), std::string::npos);
}

}  // namespace
}  // namespace onnxopt
