// What ONNX Runtime runs, onnxopt takes: a corpus of the quirks other tools write (nodes out of order,
// the "ai.onnx" spelling, ONNX Runtime's LayerNormalization below opset 17, untyped value_info, contrib
// operators without their import). Each model is first shown to be refused by the onnx checker and
// loaded by ONNX Runtime; then a job takes it, says what it normalized, and its result matches the
// original in ONNX Runtime.
#include "optimizer/load_normalization.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;
using testing::FloatValue;
using testing::MakeNode;

// x [2, 4, 8] -> MatMul -> Add -> LayerNormalization -> Relu -> y, as a valid model of `opset`.
onnx::ModelProto ProjectionBlock(int64_t opset = 17) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 4, 8});
  *graph.add_output() = FloatValue("y", {2, 4, 8});
  *graph.add_initializer() = testing::FloatTensor("w", {8, 8}, testing::RandomFloats(64, 1));
  *graph.add_initializer() = testing::FloatTensor("b", {8}, testing::RandomFloats(8, 2));
  *graph.add_initializer() = testing::FloatTensor("gamma", {8}, std::vector<float>(8, 1.5f));
  *graph.add_initializer() = testing::FloatTensor("beta", {8}, std::vector<float>(8, 0.25f));
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Add", {"m", "b"}, {"a"});
  *graph.add_node() = testing::WithIntAttribute(MakeNode("LayerNormalization", {"a", "gamma", "beta"}, {"n"}), "axis", -1);
  *graph.add_node() = MakeNode("Relu", {"n"}, {"y"});
  return testing::MakeModel(graph, opset);
}

struct Quirk {
  std::string name;
  onnx::ModelProto model;
  std::string normalized;  // what the report's normalizations must say ("" where none applies)
  // The onnx checker alone refuses it; false where onnxopt registers the schema ONNX Runtime has.
  bool checker_refuses = true;
};

std::vector<Quirk> Corpus() {
  std::vector<Quirk> corpus;
  {
    onnx::ModelProto model = ProjectionBlock();
    auto* nodes = model.mutable_graph()->mutable_node();
    std::reverse(nodes->begin(), nodes->end());
    corpus.push_back({"nodes_reversed", model, "topological order"});
  }
  {
    // An If whose branches read the outer graph, written before the node that produces what they read
    // (ONNX Runtime sorts the main graph, not a subgraph: a subgraph out of order is refused there).
    onnx::ModelProto model = ProjectionBlock();
    onnx::GraphProto& graph = *model.mutable_graph();
    *graph.add_input() = testing::MakeValue("flag", onnx::TensorProto::BOOL, {});
    graph.mutable_node(3)->set_output(0, "r");
    auto branch = [](const std::string& name, const std::string& op) {
      onnx::GraphProto body;
      body.set_name(name);
      *body.add_node() = MakeNode(op, {"r"}, {name + "_t"});
      *body.add_node() = MakeNode("Identity", {name + "_t"}, {name + "_out"});
      *body.add_output() = FloatValue(name + "_out", {2, 4, 8});
      return body;
    };
    onnx::NodeProto choose = testing::WithGraphAttribute(MakeNode("If", {"flag"}, {"y"}), "then_branch", branch("then", "Neg"));
    choose = testing::WithGraphAttribute(choose, "else_branch", branch("else", "Abs"));
    graph.mutable_node()->AddAllocated(new onnx::NodeProto(choose));
    std::rotate(graph.mutable_node()->rbegin(), graph.mutable_node()->rbegin() + 1, graph.mutable_node()->rend());
    corpus.push_back({"subgraphs_out_of_order", model, "topological order in 1 graph"});
  }
  {
    onnx::ModelProto model = ProjectionBlock();
    for (onnx::NodeProto& node : *model.mutable_graph()->mutable_node()) node.set_domain("ai.onnx");
    model.mutable_opset_import(0)->set_domain("ai.onnx");
    corpus.push_back({"ai_onnx_domain", model, "'ai.onnx' (4 nodes and the opset import)"});
  }
  // ONNX Runtime's transformers optimizer writes LayerNormalization in the default domain at any opset.
  // The checker takes it once ONNX Runtime's schema is registered beside ONNX's (contrib_schemas.h).
  corpus.push_back({"layer_norm_below_opset_17", ProjectionBlock(13), "", /*checker_refuses=*/false});
  {
    onnx::ModelProto model = ProjectionBlock();
    model.mutable_graph()->add_value_info()->set_name("m");
    model.mutable_graph()->add_value_info()->set_name("a");
    // onnx 1.12's checker looks only at typed value_info; later checkers and tools refuse these.
    corpus.push_back({"untyped_value_info", model, "2 value_info entries without a type", /*checker_refuses=*/false});
  }
  {
    onnx::ModelProto model = ProjectionBlock();
    onnx::NodeProto& relu = *model.mutable_graph()->mutable_node(3);
    relu.set_op_type("FastGelu");
    relu.set_domain("com.microsoft");
    corpus.push_back({"contrib_without_import", model, "com.microsoft were used without an opset import"});
  }
  {
    // All of them at once, as a hand-edited model optimized by ONNX Runtime's tool might be.
    onnx::ModelProto model = ProjectionBlock(13);
    auto* nodes = model.mutable_graph()->mutable_node();
    nodes->Mutable(3)->set_op_type("FastGelu");
    nodes->Mutable(3)->set_domain("com.microsoft");
    nodes->Mutable(0)->set_domain("ai.onnx");
    std::reverse(nodes->begin(), nodes->end());
    model.mutable_graph()->add_value_info()->set_name("n");
    corpus.push_back({"every_quirk", model, "topological order"});
  }
  return corpus;
}

fs::path Save(const onnx::ModelProto& model, const std::string& name) {
  const fs::path path = testing::TempDir(absl::StrCat("quirk_", name)) / "model.onnx";
  EXPECT_TRUE(SaveModel(model, path).ok());
  return path;
}

absl::StatusOr<OptimizeResult> OptimizeFile(const fs::path& path) {
  OptimizeRequest request;
  request.model_path = path;
  request.output_dir = path.parent_path() / "out";
  request.config.mutable_benchmark()->set_skip(true);
  return Optimize(request);
}

TEST(LoadNormalizationTest, EveryQuirkOnnxRuntimeLoadsIsTakenAndMatchesTheOriginal) {
  for (const Quirk& quirk : Corpus()) {
    SCOPED_TRACE(quirk.name);
    std::vector<std::string> warnings;
    EXPECT_EQ(CheckModel(quirk.model, &warnings).ok(), !quirk.checker_refuses) << "the onnx checker as written";
    SessionSettings settings;
    settings.optimization_level = ORT_DISABLE_ALL;
    auto loaded = CreateSession({quirk.model.SerializeAsString(), {}}, settings);
    ASSERT_TRUE(loaded.ok()) << "ONNX Runtime loads it: " << loaded.status();

    absl::StatusOr<OptimizeResult> result = OptimizeFile(Save(quirk.model, quirk.name));
    ASSERT_TRUE(result.ok()) << result.status();
    const v1::Report& report = result->report;
    const std::string normalized = absl::StrJoin(report.normalizations(), "\n");
    if (!quirk.normalized.empty()) EXPECT_TRUE(absl::StrContains(normalized, quirk.normalized)) << normalized;
    for (const std::string& warning : report.warnings()) {
      EXPECT_FALSE(absl::StrContains(warning, "checker")) << "normalized, not waved through: " << warning;
    }
    EXPECT_TRUE(report.parity().passed()) << report.parity().DebugString();
    EXPECT_GT(report.parity().outputs_size(), 0);
  }
}

TEST(LoadNormalizationTest, AWellFormedModelIsLeftAsItIs) {
  onnx::ModelProto model = ProjectionBlock();
  const std::string before = model.SerializeAsString();
  EXPECT_TRUE(NormalizeAsOnnxRuntimeReads(&model).empty());
  EXPECT_EQ(model.SerializeAsString(), before);
}

TEST(LoadNormalizationTest, SortingKeepsTheWrittenOrderWhereTheDataFlowAllows) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"b"}, {"c"}, "late");
  *graph.add_node() = MakeNode("Neg", {"x"}, {"a"}, "first");
  *graph.add_node() = MakeNode("Abs", {"x"}, {"z"}, "independent");
  *graph.add_node() = MakeNode("Exp", {"a"}, {"b"}, "second");
  EXPECT_EQ(SortNodesTopologically(&graph), 1);
  std::vector<std::string> order;
  for (const auto& node : graph.node()) order.push_back(node.name());
  EXPECT_EQ(order, (std::vector<std::string>{"first", "independent", "second", "late"}));
  EXPECT_EQ(SortNodesTopologically(&graph), 0) << "sorted already";
}

TEST(LoadNormalizationTest, ACycleIsLeftForTheCheckerToName) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"b"}, {"a"}, "one");
  *graph.add_node() = MakeNode("Neg", {"a"}, {"b"}, "two");
  EXPECT_EQ(SortNodesTopologically(&graph), 0);
  EXPECT_EQ(graph.node(0).name(), "one");
}

TEST(LoadNormalizationTest, BothDefaultDomainSpellingsBecomeOneImport) {
  onnx::ModelProto model = ProjectionBlock();
  onnx::OperatorSetIdProto* alias = model.add_opset_import();
  alias->set_domain("ai.onnx");
  alias->set_version(17);
  model.mutable_graph()->mutable_node(1)->set_domain("ai.onnx");
  ASSERT_EQ(NormalizeAsOnnxRuntimeReads(&model).size(), 1u);
  ASSERT_EQ(model.opset_import_size(), 1);
  EXPECT_EQ(model.opset_import(0).domain(), "");
  EXPECT_EQ(model.graph().node(1).domain(), "");
}

// The checker's remaining refusals are ONNX Runtime's to judge: a model it loads is taken with the
// checker's words as a warning; one it does not load is refused with its own words.
TEST(LoadNormalizationTest, WhatTheCheckerStillRefusesIsJudgedByOnnxRuntime) {
  onnx::ModelProto loads = ProjectionBlock();
  loads.mutable_graph()->mutable_output(0)->clear_type();  // ONNX Runtime infers a graph output's type
  std::vector<std::string> warnings;
  ASSERT_FALSE(CheckModel(loads, &warnings).ok());
  absl::StatusOr<OptimizeResult> taken = OptimizeFile(Save(loads, "untyped_output"));
  ASSERT_TRUE(taken.ok()) << taken.status();
  bool warned = false;
  for (const std::string& warning : taken->report.warnings()) {
    warned |= absl::StrContains(warning, "ONNX checker refuses") && absl::StrContains(warning, "ONNX Runtime loads it");
  }
  EXPECT_TRUE(warned) << absl::StrJoin(taken->report.warnings(), "\n");
  EXPECT_TRUE(taken->report.parity().passed());

  onnx::ModelProto broken = ProjectionBlock();
  broken.mutable_graph()->mutable_node(1)->set_input(0, "nothing_makes_this");
  absl::StatusOr<OptimizeResult> refused = OptimizeFile(Save(broken, "dangling_input"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "ONNX Runtime cannot load the model")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "the ONNX checker")) << refused.status();
}

// The checker passes an operator of ONNX Runtime's domain it has no schema for; ONNX Runtime has no
// kernel for it either. The job fails as a bad model with ONNX Runtime's words, and the report says parity
// did not run rather than listing no outputs as a failure.
TEST(LoadNormalizationTest, AnOriginalOnnxRuntimeDoesNotLoadIsReportedAsThat) {
  onnx::ModelProto model = ProjectionBlock();
  model.mutable_graph()->mutable_node(3)->set_op_type("NoSuchOperator");
  model.mutable_graph()->mutable_node(3)->set_domain("com.microsoft");
  onnx::OperatorSetIdProto* contrib = model.add_opset_import();
  contrib->set_domain("com.microsoft");
  contrib->set_version(1);
  std::vector<std::string> warnings;
  ASSERT_TRUE(CheckModel(model, &warnings).ok()) << "the checker does not know the domain's operators";
  const fs::path path = Save(model, "no_such_operator");
  OptimizeRequest request;
  request.model_path = path;
  request.output_dir = path.parent_path() / "out";
  request.config.mutable_benchmark()->set_skip(true);
  v1::Report report;
  absl::StatusOr<OptimizeResult> result = Optimize(request, &report);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "MODEL_CHECK_FAILED")) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "the original model does not load in ONNX Runtime"));
  EXPECT_TRUE(absl::StrContains(result.status().message(), "NoSuchOperator")) << "ONNX Runtime's own words";
  EXPECT_TRUE(absl::StrContains(report.parity().not_run(), "does not load in ONNX Runtime")) << report.parity().DebugString();
  EXPECT_EQ(report.parity().outputs_size(), 0);
}

}  // namespace
}  // namespace onnxopt
