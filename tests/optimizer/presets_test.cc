// The presets as pipelines: basic reaches a fixed point across its passes, extended keeps the
// conformance fixtures exact, and the seed passes fire on models PyTorch exported with their patterns.

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_manager.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FixturePath;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

// Removing Identity leaves its only consumer's input unused: the fixed point of the basic preset
// chains the passes.
TEST(BasicPresetTest, ReachesAFixedPointAcrossPasses) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Mul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Identity", {"m"}, {"unused"});
  *graph.add_node() = MakeNode("Relu", {"x"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {2}, {1, 2});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_output() = FloatValue("y", {2});
  const onnx::ModelProto original = MakeModel(graph);
  onnx::ModelProto model = original;
  auto pipeline = BuildPipeline(v1::OptimizationConfig(), DefaultPassRegistry());
  ASSERT_TRUE(pipeline.ok());
  std::vector<v1::PassReport> reports;
  ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
  EXPECT_EQ(model.graph().node_size(), 1);
  EXPECT_EQ(model.graph().initializer_size(), 0);
  ExpectSameOutputs(original, model);
}

TEST(ExtendedPresetTest, KeepsTheConformanceFixturesExact) {
  for (const char* name : {"bert_tiny.onnx", "cnn_tiny.onnx"}) {
    auto original = LoadModel(testing::FixturePath(name));
    ASSERT_TRUE(original.ok());
    v1::OptimizationConfig config;
    config.set_preset(v1::Pipelines::extended);
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    ASSERT_TRUE(pipeline.ok());
    onnx::ModelProto model = *original;
    std::vector<v1::PassReport> reports;
    ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
    EXPECT_LE(model.graph().node_size(), original->graph().node_size()) << name;
    ExpectSameOutputs(*original, model, 1e-5, 1e-4);
  }
}

// Each seed pass fires on a model PyTorch exported with the pattern (tests/fixtures/make_fixtures.py)
// and the result matches the original in ONNX Runtime.
TEST(PyTorchExportsTest, SeedPassesFireOnRealExports) {
  struct Case {
    const char* fixture;
    const char* pass;
    int64_t min_rewrites;
  };
  for (const Case& c : std::vector<Case>{{"bert_tiny.onnx", "eliminate_identity", 8},
                                         {"bert_tiny.onnx", "fold_constants", 73},
                                         {"bert_tiny.onnx", "eliminate_common_subexpressions", 8},
                                         {"constants_heavy.onnx", "fold_constants", 14},
                                         {"index_select_arange.onnx", "gather_range_to_slice", 1},
                                         {"cnn_bn.onnx", "fuse_conv_batchnorm", 3}}) {
    auto original = LoadModel(testing::FixturePath(c.fixture));
    ASSERT_TRUE(original.ok()) << c.fixture;
    // The pass after the basic cleanups, as in the extended preset.
    v1::OptimizationConfig config;
    for (const char* name : {"eliminate_identity", "fold_constants", "eliminate_dead_nodes", c.pass}) {
      config.add_passes()->set_name(name);
    }
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    ASSERT_TRUE(pipeline.ok());
    onnx::ModelProto model = *original;
    std::vector<v1::PassReport> reports;
    ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
    int64_t rewrites = 0;
    for (const auto& report : reports) {
      if (report.name() == c.pass) rewrites = std::max(rewrites, report.rewrites());
    }
    EXPECT_GE(rewrites, c.min_rewrites) << c.fixture << " " << c.pass;
    ExpectSameOutputs(*original, model, 1e-5, 1e-4);
  }
}

}  // namespace
}  // namespace onnxopt
