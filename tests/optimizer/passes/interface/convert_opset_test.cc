// convert_opset: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::PassRun;
using testing::RunConfig;

TEST(ConvertOpsetTest, ConvertsAndRefusesWhatOnnxCannot) {
  auto model = LoadModel(testing::FixturePath("cnn_tiny.onnx"));  // opset 13
  ASSERT_TRUE(model.ok());
  PassRun run = RunConfig(R"({"passes": [{"name": "convert_opset", "params": {"target_opset": 15}}]})", *model);
  ASSERT_TRUE(run.status.ok()) << run.status;
  int64_t opset = 0;
  for (const auto& import : run.model.opset_import()) {
    if (import.domain().empty()) opset = import.version();
  }
  EXPECT_EQ(opset, 15);
  ExpectSameOutputs(*model, run.model, 1e-6, 1e-6);
  EXPECT_EQ(RunConfig(R"({"passes": [{"name": "convert_opset", "params": {"target_opset": 21}}]})", *model).status.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunConfig(R"({"passes": [{"name": "convert_opset"}]})", *model).status.code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace onnxopt
