// fuse_conv_batchnorm: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <map>

#include "gtest/gtest.h"
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
using testing::RunPass;
using testing::WithIntsAttribute;

TEST(FuseConvBatchNormTest, FoldsInferenceBatchNorm) {
  for (bool conv_bias : {true, false}) {
    onnx::GraphProto graph;
    std::vector<std::string> conv_inputs = {"x", "w"};
    if (conv_bias) conv_inputs.push_back("b");
    *graph.add_node() = WithIntsAttribute(MakeNode("Conv", conv_inputs, {"c"}), "pads", {1, 1, 1, 1});
    *graph.add_node() = MakeNode("BatchNormalization", {"c", "scale", "bias", "mean", "var"}, {"y"});
    *graph.add_initializer() = FloatTensor("w", {4, 3, 3, 3}, RandomFloats(108, 2));
    *graph.add_initializer() = FloatTensor("b", {4}, RandomFloats(4, 3));
    *graph.add_initializer() = FloatTensor("scale", {4}, RandomFloats(4, 4));
    *graph.add_initializer() = FloatTensor("bias", {4}, RandomFloats(4, 5));
    *graph.add_initializer() = FloatTensor("mean", {4}, RandomFloats(4, 6));
    *graph.add_initializer() = FloatTensor("var", {4}, {0.5f, 1.0f, 2.0f, 0.1f});
    *graph.add_input() = FloatValue("x", {1, 3, 8, 8});
    *graph.add_output() = FloatValue("y", {1, 4, 8, 8});
    const onnx::ModelProto original = MakeModel(graph, 13);
    PassRun run = RunPass("fuse_conv_batchnorm", original);
    EXPECT_EQ(run.report.rewrites(), 1) << conv_bias;
    EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 1}})) << conv_bias;
    ExpectSameOutputs(original, run.model, 1e-4, 1e-4);
  }
}

}  // namespace
}  // namespace onnxopt
