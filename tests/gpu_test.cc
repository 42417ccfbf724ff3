// GPU tests (ctest label "gpu": `ctest -L gpu`): a CUDA job through onnxopt's own Optimize on the
// project's BERT fixture and on Hugging Face exports, parity and the benchmark on CUDAExecutionProvider.
// Where CUDA cannot run (no GPU, no provider, no CUDA libraries) every test is skipped with the reason
// the provider probe gives, so CPU machines stay green.
#include <filesystem>
#include <string>

#include <unistd.h>

#include "gtest/gtest.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

std::string CudaUnavailableReason() {
  absl::StatusOr<std::string> provider = ProviderFor(v1::DEVICE_CUDA);
  return provider.ok() ? "" : std::string(provider.status().message());
}

class GpuTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string reason = CudaUnavailableReason();
    if (!reason.empty()) GTEST_SKIP() << "CUDA cannot run here: " << reason;
  }
};

TEST_P(GpuTest, ACudaJobValidatesAndTimesOnTheGpu) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath(GetParam());
  request.output_dir = std::filesystem::temp_directory_path() / ("onnxopt_gpu_" + std::to_string(::getpid()));
  request.config.set_preset("transformer");
  request.config.mutable_benchmark()->set_device(v1::DEVICE_CUDA);
  request.config.mutable_benchmark()->set_time_budget_seconds(5);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::Report& report = result->report;
  EXPECT_EQ(report.benchmark().execution_provider(), "CUDAExecutionProvider");
  EXPECT_TRUE(report.benchmark().fallback().empty()) << report.benchmark().fallback();
  EXPECT_TRUE(report.parity().passed()) << report.parity().DebugString();
  EXPECT_GT(report.benchmark().speedup(), 0);
  std::filesystem::remove_all(request.output_dir);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuTest,
                         ::testing::Values("bert_tiny.onnx", "gpt2_tiny.onnx", "hf/bert_torchscript.onnx",
                                           "hf/gpt2_torchscript.onnx", "hf/llama_dynamo.onnx"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace onnxopt
