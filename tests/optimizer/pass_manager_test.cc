#include "optimizer/pass_manager.h"

#include <atomic>
#include <set>

#include "google/protobuf/util/json_util.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

v1::OptimizationConfig ConfigFromJson(const std::string& json) {
  v1::OptimizationConfig config;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &config).ok()) << json;
  return config;
}

// A pass that rewrites a fixed number of times, to drive the fixed-point logic.
class CountingPass final : public Pass {
 public:
  explicit CountingPass(int* budget) : budget_(budget) {}
  absl::string_view name() const override { return "counting"; }
  absl::string_view description() const override { return "rewrites while its budget lasts"; }
  std::vector<ParamSpec> params() const override {
    return {{"step", ParamType::kInt, "1", "rewrites per run"}, {"scale", ParamType::kDouble, "0.5", "unused"}};
  }
  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    if (*budget_ > 0) {
      --*budget_;
      context.CountRewrite(context.params().GetInt("step"));
    } else {
      context.Skip("budget spent");
    }
    return absl::OkStatus();
  }

 private:
  int* budget_;
};

// A registry whose "basic" preset (a config names presets from its enum) repeats the counting pass as a
// fixed-point group.
std::unique_ptr<PassRegistry> LoopRegistry(int* budget) {
  auto registry = std::make_unique<PassRegistry>();
  EXPECT_TRUE(registry->Register(std::make_unique<CountingPass>(budget)).ok());
  EXPECT_TRUE(registry->AddPreset({"basic", "", {{{"counting"}, true}}}).ok());
  return registry;
}

TEST(BuildPipelineTest, BasicIsOneFixedPointGroup) {
  v1::OptimizationConfig config;
  config.set_preset(v1::Pipelines::basic);
  auto pipeline = BuildPipeline(config, DefaultPassRegistry());
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  ASSERT_EQ(pipeline->steps.size(), 1u);
  EXPECT_EQ(pipeline->steps[0].max_iterations, kDefaultMaxIterations);
  EXPECT_EQ(pipeline->ToString(),
            "fixed_point(eliminate_identity,eliminate_dropout,eliminate_noop_ops,fold_constants,"
            "eliminate_common_subexpressions,eliminate_duplicate_initializers,eliminate_dead_nodes,"
            "eliminate_unused_initializers)<=8");
}

// The default `auto` preset: the transformer pipeline for a transformer, extended for a CNN, and
// never a pass that changes the model's inputs.
TEST(BuildPipelineTest, AutoPicksThePipelineForWhatTheModelIs) {
  struct Case {
    const char* fixture;
    const char* preset;
    const char* chosen;
  };
  for (const Case& c : std::vector<Case>{{"bert_tiny.onnx", "transformer", "auto: transformer (bert)"},
                                         {"hf/llama_dynamo.onnx", "transformer", "auto: transformer (llama)"},
                                         {"cnn_tiny.onnx", "extended", "auto: extended (no transformer found)"}}) {
    auto model = LoadModel(testing::FixturePath(c.fixture));
    ASSERT_TRUE(model.ok()) << c.fixture;
    auto chosen = BuildPipeline(v1::OptimizationConfig(), DefaultPassRegistry(), &*model);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_EQ(chosen->preset, c.chosen);
    v1::OptimizationConfig named;
    v1::Pipelines::Preset preset;
    ASSERT_TRUE(v1::Pipelines::Preset_Parse(c.preset, &preset)) << c.preset;
    named.set_preset(preset);
    auto full = BuildPipeline(named, DefaultPassRegistry());
    ASSERT_TRUE(full.ok());
    EXPECT_EQ(full->PassCount() - chosen->PassCount(), 1) << c.fixture << ": only eliminate_initializer_inputs goes";
    EXPECT_FALSE(absl::StrContains(chosen->ToString(), "eliminate_initializer_inputs")) << c.fixture;
  }
  // A family the config names counts, model or not.
  v1::OptimizationConfig config;
  config.mutable_transformer()->set_family("gpt2");
  auto pipeline = BuildPipeline(config, DefaultPassRegistry());
  ASSERT_TRUE(pipeline.ok());
  EXPECT_EQ(pipeline->preset, "auto: transformer (gpt2)");
}

TEST(BuildPipelineTest, RejectsBadConfigsWithReasons) {
  struct Case {
    const char* json;
    const char* message_part;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"passes": [{"name": "fold_everything"}]})", "unknown pass 'fold_everything'"},
           {R"({"passes": [{"name": "eliminate_identity", "params": {"x": 1}}]})", "has no parameter 'x'"},
           {R"({"preset": "basic", "passes": [{"name": "eliminate_identity"}]})", "not both"},
           {R"({"max_iterations": 1000})", "max_iterations"},
       }) {
    auto pipeline = BuildPipeline(ConfigFromJson(c.json), DefaultPassRegistry());
    ASSERT_FALSE(pipeline.ok()) << c.json;
    EXPECT_EQ(pipeline.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(pipeline.status().message().find(c.message_part), std::string::npos) << pipeline.status();
  }
}

TEST(BuildPipelineTest, TypeChecksParameters) {
  int budget = 0;
  PassRegistry registry;
  ASSERT_TRUE(registry.Register(std::make_unique<CountingPass>(&budget)).ok());
  auto good = BuildPipeline(ConfigFromJson(R"({"passes": [{"name": "counting", "params": {"step": 3, "scale": "0.25"}}]})"),
                            registry);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->steps[0].passes[0].params.GetInt("step"), 3);
  EXPECT_DOUBLE_EQ(good->steps[0].passes[0].params.GetDouble("scale"), 0.25);
  for (const char* json : {R"({"passes": [{"name": "counting", "params": {"step": 1.5}}]})",
                           R"({"passes": [{"name": "counting", "params": {"step": true}}]})",
                           R"({"passes": [{"name": "counting", "params": {"scale": "abc"}}]})"}) {
    auto bad = BuildPipeline(ConfigFromJson(json), registry);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << json;
  }
}

onnx::ModelProto TinyModel() {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"y"});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_output() = FloatValue("y", {2});
  return MakeModel(graph);
}

// A second pass of one name once replaced the first without a word; a preset could name a pass
// nobody registered and fail only when a job used it.
TEST(PassRegistryTest, RefusesADuplicateNameAndPresetsOfUnknownPasses) {
  int budget = 0;
  PassRegistry registry;
  ASSERT_TRUE(registry.Register(std::make_unique<CountingPass>(&budget)).ok());
  EXPECT_EQ(registry.Register(std::make_unique<CountingPass>(&budget)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddPreset({"loop", "", {{{"counting", "missing"}, true}}}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.AddPreset({"loop", "", {{{"counting"}, true}}}).ok());
  EXPECT_EQ(registry.AddPreset({"loop", "", {}}).code(), absl::StatusCode::kAlreadyExists);
}

TEST(PassRegistryTest, TheDefaultRegistryNamesEachPassOnceAndDefaultsToAuto) {
  const PassRegistry& registry = DefaultPassRegistry();
  std::set<std::string> names;
  for (const Pass* pass : registry.passes()) {
    EXPECT_TRUE(names.insert(std::string(pass->name())).second) << pass->name();
    EXPECT_FALSE(pass->description().empty()) << pass->name();
  }
  for (const Preset* preset : registry.presets()) {
    for (const std::string& pass : preset->AllPasses()) EXPECT_EQ(names.count(pass), 1u) << preset->name << ": " << pass;
  }
  const onnx::ModelProto model = TinyModel();
  auto pipeline = BuildPipeline(v1::OptimizationConfig(), registry, &model);
  ASSERT_TRUE(pipeline.ok());
  EXPECT_TRUE(absl::StartsWith(pipeline->preset, kAutoPreset)) << pipeline->preset;
}

TEST(RunPipelineTest, FixedPointStopsWhenASweepChangesNothingAndRespectsItsCap) {
  int budget = 3;
  const std::unique_ptr<PassRegistry> registry = LoopRegistry(&budget);
  onnx::ModelProto model = TinyModel();
  auto pipeline = BuildPipeline(ConfigFromJson(R"({"preset": "basic"})"), *registry);
  ASSERT_TRUE(pipeline.ok());
  std::vector<v1::PassReport> reports;
  ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
  ASSERT_EQ(reports.size(), 4u);  // 3 rewriting sweeps, then one that finds nothing
  EXPECT_EQ(reports[3].iteration(), 4);
  EXPECT_EQ(reports[3].skipped(0).reason(), "budget spent");

  budget = 100;
  reports.clear();
  auto capped = BuildPipeline(ConfigFromJson(R"({"preset": "basic", "max_iterations": 5})"), *registry);
  ASSERT_TRUE(capped.ok());
  ASSERT_TRUE(RunPipeline(*capped, &model, {}, &reports).ok());
  EXPECT_EQ(reports.size(), 5u);
  EXPECT_EQ(budget, 95);
}

// Progress counts pass runs: a repeated sweep adds to the total instead of starting at 1 again.
TEST(RunPipelineTest, ProgressNeverRestartsWithASweep) {
  int budget = 2;
  const std::unique_ptr<PassRegistry> registry = LoopRegistry(&budget);
  onnx::ModelProto model = TinyModel();
  auto pipeline = BuildPipeline(ConfigFromJson(R"({"preset": "basic"})"), *registry);
  ASSERT_TRUE(pipeline.ok());
  std::vector<std::pair<int, int>> seen;
  PassManagerOptions options;
  options.on_pass_start = [&](const std::string&, int done, int total) { seen.push_back({done, total}); };
  std::vector<v1::PassReport> reports;
  ASSERT_TRUE(RunPipeline(*pipeline, &model, options, &reports).ok());
  ASSERT_EQ(seen, (std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}}));  // 2 rewriting sweeps, 1 idle
}

TEST(RunPipelineTest, CancellationStopsBetweenPasses) {
  onnx::ModelProto model = TinyModel();
  auto pipeline = BuildPipeline(v1::OptimizationConfig(), DefaultPassRegistry());
  ASSERT_TRUE(pipeline.ok());
  std::atomic<bool> cancelled{false};
  PassManagerOptions options;
  options.run = RunContext(&cancelled);
  int started = 0;
  options.on_pass_start = [&](const std::string&, int, int) {
    if (++started == 2) cancelled = true;
  };
  std::vector<v1::PassReport> reports;
  absl::Status status = RunPipeline(*pipeline, &model, options, &reports);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(reports.size(), 2u);
}

// Reads the static shape of "y" from the shapes it is given.
class ShapeProbePass final : public ShapedPass {
 public:
  explicit ShapeProbePass(std::vector<int64_t>* seen) : seen_(seen) {}
  absl::string_view name() const override { return "probe"; }
  absl::string_view description() const override { return "records y's shape"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::Status RunWithShapes(Graph&, PassContext&, const ShapeInfo& shapes) const override {
    *seen_ = shapes.StaticShape("y").value_or(std::vector<int64_t>{});
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t>* seen_;
};

// Rewrites nothing but may change types, as far as the pass manager knows.
class OpaquePass final : public Pass {
 public:
  absl::string_view name() const override { return "opaque"; }
  absl::string_view description() const override { return "changes nothing"; }
  absl::Status RunOnGraph(Graph&, PassContext&) const override { return absl::OkStatus(); }
};

absl::StatusOr<Pipeline> PassList(const std::vector<std::string>& names, const PassRegistry& registry) {
  v1::OptimizationConfig config;
  for (const auto& name : names) config.add_passes()->set_name(name);
  return BuildPipeline(config, registry);
}

TEST(InfersShapesFirstTest, OnlyWhenNoPassBeforeTheFirstReaderCanChangeTypes) {
  std::vector<int64_t> seen;
  PassRegistry registry;
  ASSERT_TRUE(registry.Register(std::make_unique<ShapeProbePass>(&seen)).ok());
  ASSERT_TRUE(registry.Register(std::make_unique<OpaquePass>()).ok());
  for (const auto preset : {v1::Pipelines::basic, v1::Pipelines::transformer}) {
    v1::OptimizationConfig config;
    config.set_preset(preset);
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    ASSERT_TRUE(pipeline.ok());
    EXPECT_TRUE(InfersShapesFirst(*pipeline, {})) << preset;  // identity and dropout keep types
  }
  auto opaque_first = PassList({"opaque", "probe"}, registry);
  ASSERT_TRUE(opaque_first.ok());
  EXPECT_FALSE(InfersShapesFirst(*opaque_first, {}));
  PassManagerOptions without_opaque;
  without_opaque.excluded_passes = {"opaque"};
  EXPECT_TRUE(InfersShapesFirst(*opaque_first, without_opaque));
  auto no_reader = PassList({"opaque"}, registry);
  ASSERT_TRUE(no_reader.ok());
  EXPECT_FALSE(InfersShapesFirst(*no_reader, {}));
}

// Shapes handed to RunPipeline are what its first reader sees (they are not inferred again), and
// that pass's time includes their inference.
TEST(RunPipelineTest, HandedInitialShapesAreReadAndTheirTimeReported) {
  std::vector<int64_t> seen;
  PassRegistry registry;
  ASSERT_TRUE(registry.Register(std::make_unique<ShapeProbePass>(&seen)).ok());
  auto pipeline = PassList({"probe"}, registry);
  ASSERT_TRUE(pipeline.ok());
  onnx::ModelProto model = TinyModel();  // y: [2]

  std::vector<v1::PassReport> reports;
  ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
  EXPECT_EQ(seen, std::vector<int64_t>{2});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_LT(reports[0].duration_seconds(), 7.5);

  onnx::ModelProto wider = TinyModel();  // y: [3]
  *wider.mutable_graph()->mutable_input(0) = FloatValue("x", {3});
  *wider.mutable_graph()->mutable_output(0) = FloatValue("y", {3});
  InitialShapes handed = InferInitialShapes(wider);
  handed.seconds = 7.5;
  reports.clear();
  ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports, std::move(handed)).ok());
  EXPECT_EQ(seen, std::vector<int64_t>{3});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_GE(reports[0].duration_seconds(), 7.5);
}

// The basic preset infers the model's shapes before eliminate_identity and eliminate_dropout run and
// keeps them through their edits: the result is what inferring after those two gives.
TEST(RunPipelineTest, ShapesInferredBeforeIdentityAndDropoutGiveTheSameModel) {
  absl::StatusOr<onnx::ModelProto> loaded = LoadModel(testing::FixturePath("gpt2_tiny.onnx"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // An Identity and a Dropout between the first MatMul and its readers.
  onnx::GraphProto* graph = loaded->mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  std::string target;
  for (const auto& node : graph->node()) {
    onnx::NodeProto* copy = nodes.Add();
    *copy = node;
    for (auto& input : *copy->mutable_input()) {
      if (!target.empty() && input == target) input = "through_dropout";
    }
    if (target.empty() && node.op_type() == "MatMul") {
      target = node.output(0);
      *nodes.Add() = MakeNode("Identity", {target}, {"through_identity"});
      *nodes.Add() = MakeNode("Dropout", {"through_identity"}, {"through_dropout"});
    }
  }
  ASSERT_FALSE(target.empty());
  graph->mutable_node()->Swap(&nodes);

  v1::OptimizationConfig basic;
  basic.set_preset(v1::Pipelines::basic);
  auto pipeline = BuildPipeline(basic, DefaultPassRegistry());
  auto first_two = PassList({"eliminate_identity", "eliminate_dropout"}, DefaultPassRegistry());
  ASSERT_TRUE(pipeline.ok() && first_two.ok());
  ASSERT_TRUE(InfersShapesFirst(*pipeline, {}));
  std::vector<v1::PassReport> reports;
  onnx::ModelProto whole = *loaded;
  ASSERT_TRUE(RunPipeline(*pipeline, &whole, {}, &reports).ok());
  EXPECT_GT(reports[0].rewrites() + reports[1].rewrites(), 0);

  onnx::ModelProto split = *loaded;
  ASSERT_TRUE(RunPipeline(*first_two, &split, {}, &reports).ok());
  ASSERT_TRUE(RunPipeline(*pipeline, &split, {}, &reports).ok());  // infers the model as the two left it
  EXPECT_EQ(whole.SerializeAsString(), split.SerializeAsString());
}

TEST(OpHistogramTest, CountsSubgraphsAndQualifiesDomains) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  onnx::NodeProto contrib = MakeNode("FastGelu", {"a"}, {"y"});
  contrib.set_domain("com.microsoft");
  *graph.add_node() = contrib;
  auto histogram = OpHistogram(graph);
  EXPECT_EQ(histogram["Relu"], 1);
  EXPECT_EQ(histogram["com.microsoft::FastGelu"], 1);
}

}  // namespace
}  // namespace onnxopt
