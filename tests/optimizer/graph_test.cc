#include "optimizer/graph.h"

#include <algorithm>
#include <fstream>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FixturePath;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

std::string FileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// parse -> IR -> serialize is byte-identical for every fixture when no pass edits the graph.
TEST(GraphTest, UntouchedModelsRoundTripByteIdentical) {
  for (const char* name : {"bert_tiny.onnx", "bert_tiny_train.onnx", "cnn_tiny.onnx", "mlp_external/model.onnx"}) {
    const std::string bytes = FileBytes(FixturePath(name));
    auto model = ParseModel(bytes);
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
    {
      Graph graph(model->mutable_graph());
      EXPECT_GT(graph.NodeCount(), 0);
      ASSERT_TRUE(graph.Commit().ok());
    }
    EXPECT_EQ(model->SerializeAsString(), bytes) << name;
  }
}

TEST(GraphTest, IndexesProducersAndConsumers) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_node() = MakeNode("Neg", {"a"}, {"b"});
  *proto.add_node() = MakeNode("Add", {"a", "b"}, {"y"});
  *proto.add_input() = FloatValue("x", {2});
  *proto.add_output() = FloatValue("y", {2});
  Graph graph(&proto);
  ASSERT_NE(graph.Producer("a"), nullptr);
  EXPECT_EQ(graph.Producer("a")->op_type(), "Relu");
  EXPECT_EQ(graph.Consumers("a").size(), 2u);
  EXPECT_TRUE(graph.IsGraphInput("x"));
  EXPECT_TRUE(graph.IsGraphOutput("y"));
  EXPECT_EQ(graph.Producer("x"), nullptr);
  ASSERT_TRUE(graph.Commit().ok());
}

// Readers lists each reading input; SoleReader names the one node reading a value, however often.
TEST(GraphTest, ReadersAndTheSoleReaderOfAValue) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_node() = MakeNode("Mul", {"a", "a"}, {"b"});  // reads `a` twice
  *proto.add_node() = MakeNode("Neg", {"b"}, {"c"});
  *proto.add_node() = MakeNode("Add", {"b", "c"}, {"y"});
  *proto.add_input() = FloatValue("x", {2});
  *proto.add_output() = FloatValue("y", {2});
  Graph graph(&proto);
  Node* mul = graph.Producer("b");
  EXPECT_EQ(graph.Readers("a"), (std::vector<Node*>{mul, mul}));
  EXPECT_EQ(graph.SoleReader("a"), mul);
  EXPECT_EQ(graph.Readers("b").size(), 2u);
  EXPECT_EQ(graph.SoleReader("b"), nullptr);  // Neg and Add
  EXPECT_TRUE(graph.Readers("y").empty());
  EXPECT_EQ(graph.SoleReader("y"), nullptr);
  graph.RemoveNode(graph.Producer("y"));
  EXPECT_EQ(graph.SoleReader("b"), graph.Producer("c"));
}

TEST(GraphTest, EditedGraphIsWrittenInTopologicalOrderAndDropsStaleValueInfo) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_node() = MakeNode("Identity", {"a"}, {"b"});
  *proto.add_node() = MakeNode("Neg", {"b"}, {"y"});
  *proto.add_input() = FloatValue("x", {2});
  *proto.add_output() = FloatValue("y", {2});
  *proto.add_value_info() = FloatValue("a", {2});
  *proto.add_value_info() = FloatValue("b", {2});
  {
    Graph graph(&proto);
    Node* identity = graph.Producer("b");
    graph.RemoveNode(identity);
    graph.ReplaceAllUsesWith("b", "a");
    // A node added "before" the first one, that reads a later value, must still come after it.
    onnx::NodeProto extra = MakeNode("Abs", {"y"}, {"z"});
    graph.AddNode(extra, graph.Producer("a"), /*after=*/false);
    ASSERT_TRUE(graph.Commit().ok());
  }
  ASSERT_EQ(proto.node_size(), 3);
  EXPECT_EQ(proto.node(0).op_type(), "Relu");
  EXPECT_EQ(proto.node(1).op_type(), "Neg");
  EXPECT_EQ(proto.node(1).input(0), "a");
  EXPECT_EQ(proto.node(2).op_type(), "Abs");
  ASSERT_EQ(proto.value_info_size(), 1);
  EXPECT_EQ(proto.value_info(0).name(), "a");
}

TEST(GraphTest, RenameValueReachesGraphOutputsAndValueInfo) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_input() = FloatValue("x", {2});
  *proto.add_output() = FloatValue("a", {2});
  *proto.add_value_info() = FloatValue("a", {2});
  {
    Graph graph(&proto);
    ASSERT_TRUE(graph.RenameValue("a", "out").ok());
    EXPECT_TRUE(graph.IsGraphOutput("out"));
    EXPECT_FALSE(graph.RenameValue("x", "other").ok()) << "graph inputs cannot be renamed";
    ASSERT_TRUE(graph.Commit().ok());
  }
  EXPECT_EQ(proto.node(0).output(0), "out");
  EXPECT_EQ(proto.output(0).name(), "out");
  EXPECT_EQ(proto.value_info(0).name(), "out");
}

// A value read only inside an If branch is a consumer of the If node in the outer graph, and
// rewiring it reaches into the branch.
TEST(GraphTest, SubgraphReadsAreImplicitInputsAndRenamesReachThem) {
  onnx::GraphProto then_branch;
  then_branch.set_name("then");
  *then_branch.add_node() = MakeNode("Neg", {"a"}, {"t"});
  *then_branch.add_output() = FloatValue("t", {2});
  onnx::GraphProto else_branch;
  else_branch.set_name("else");
  *else_branch.add_node() = MakeNode("Abs", {"a"}, {"e"});
  *else_branch.add_output() = FloatValue("e", {2});

  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"r"});
  *proto.add_node() = MakeNode("Identity", {"r"}, {"a"});
  *proto.add_node() = testing::WithGraphAttribute(
      testing::WithGraphAttribute(MakeNode("If", {"cond"}, {"y"}), "then_branch", then_branch), "else_branch",
      else_branch);
  {
    Graph graph(&proto);
    ASSERT_EQ(graph.Consumers("a").size(), 1u);
    EXPECT_EQ(graph.Consumers("a")[0]->op_type(), "If");
    EXPECT_TRUE(graph.Consumers("a")[0]->implicit_inputs().count("a"));
    EXPECT_EQ(graph.NodeCountRecursive(), 5);
    graph.RemoveNode(graph.Producer("a"));
    graph.ReplaceAllUsesWith("a", "r");
    ASSERT_TRUE(graph.Commit().ok());
  }
  ASSERT_EQ(proto.node_size(), 2);
  EXPECT_EQ(proto.node(1).attribute(0).g().node(0).input(0), "r");
  EXPECT_EQ(proto.node(1).attribute(1).g().node(0).input(0), "r");
  EXPECT_EQ(CountNodes(proto), 4);
}

TEST(GraphTest, CycleIsReportedNotWritten) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_node() = MakeNode("Neg", {"a"}, {"b"});
  Graph graph(&proto);
  graph.SetInput(graph.Producer("a"), 0, "b");  // a = Relu(b), b = Neg(a)
  absl::Status status = graph.Commit();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
}

TEST(GraphTest, UniqueNamesDoNotCollideWithValuesOrNodes) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"v_onnxopt_0"}, "n_onnxopt_0");
  Graph graph(&proto);
  const std::string name = graph.UniqueName("v");
  EXPECT_NE(name, "v_onnxopt_0");
  EXPECT_NE(graph.UniqueName("v"), name);
  EXPECT_NE(graph.UniqueName("n"), "n_onnxopt_0") << "node names count too";
  ASSERT_TRUE(graph.Commit().ok());
}

// A body's values must not shadow the outer graph's (the ONNX checker rejects it): names generated in
// a subgraph and in the main graph come from one namespace, whichever graph asks first.
TEST(GraphTest, UniqueNamesAreUniqueAcrossTheMainGraphAndItsBodies) {
  onnx::GraphProto body;
  *body.add_node() = MakeNode("Neg", {"x"}, {"v_onnxopt_1"});
  *body.add_output() = FloatValue("v_onnxopt_1", {2});
  onnx::GraphProto proto;
  *proto.add_node() = testing::WithGraphAttribute(MakeNode("If", {"c"}, {"y"}), "then_branch", body);
  Graph graph(&proto);
  Graph& inner = *graph.Producer("y")->subgraphs().front();
  const std::string inner_name = inner.UniqueName("v");
  EXPECT_EQ(inner_name, "v_onnxopt_0");
  EXPECT_EQ(graph.UniqueName("v"), "v_onnxopt_2") << "the body's generated and existing names are taken";
  EXPECT_EQ(inner.UniqueName("v"), "v_onnxopt_3");
  ASSERT_TRUE(graph.Checkpoint().ok());
  EXPECT_EQ(graph.UniqueName("v"), "v_onnxopt_4");
  // A body that comes with a node added later is taken as well.
  onnx::GraphProto added_body;
  *added_body.add_node() = MakeNode("Abs", {"x"}, {"v_onnxopt_5"});
  *added_body.add_output() = FloatValue("v_onnxopt_5", {2});
  graph.AddNode(testing::WithGraphAttribute(MakeNode("If", {"c"}, {"z"}), "then_branch", added_body));
  EXPECT_EQ(graph.UniqueName("v"), "v_onnxopt_6");
  ASSERT_TRUE(graph.Commit().ok());
}

// Passes hand RenameValue names that live in the protos it rewrites: here the bypassed reader's own
// input. Renaming that reader changed `from` midway, and the graph output it was being renamed to
// was dropped from the index (a later dead-node sweep then removed the whole graph).
TEST(GraphTest, RenameValueWithANameTakenFromAReaderKeepsTheGraphOutput) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"f"});
  *proto.add_node() = MakeNode("Neg", {"f"}, {"g"});
  *proto.add_node() = MakeNode("Neg", {"g"}, {"y"});
  *proto.add_input() = FloatValue("x", {2});
  *proto.add_output() = FloatValue("y", {2});
  Graph graph(&proto);
  // The two Negs cancel (as Unsqueeze -> Squeeze does in fuse_reshape_chains): y becomes f's name.
  Node* first = graph.Producer("g");
  Node* second = graph.Producer("y");
  graph.RemoveNode(second);
  ASSERT_TRUE(graph.RenameValue(first->input(0), second->output(0)).ok());
  graph.RemoveNode(first);
  EXPECT_TRUE(graph.IsGraphOutput("y"));
  EXPECT_FALSE(graph.IsGraphOutput("f"));
  ASSERT_NE(graph.Producer("y"), nullptr);
  EXPECT_EQ(graph.Producer("y")->op_type(), "Relu");
  ASSERT_TRUE(graph.Commit().ok());
  ASSERT_EQ(proto.node_size(), 1);
  EXPECT_EQ(proto.node(0).output(0), "y");
}

// One Graph kept across passes: a checkpoint leaves it as a commit and a fresh Graph would, so the
// next pass sees nodes in topological order and the model written at the end is the same.
TEST(GraphTest, ACheckpointIsACommitAndAFreshGraph) {
  onnx::GraphProto original;
  *original.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *original.add_node() = MakeNode("Identity", {"a"}, {"b"});
  *original.add_node() = MakeNode("Neg", {"b"}, {"y"});
  *original.add_input() = FloatValue("x", {2});
  *original.add_output() = FloatValue("y", {2});
  *original.add_value_info() = FloatValue("b", {2});
  *original.add_initializer() = testing::FloatTensor("unused", {1}, {1});
  auto first_edit = [](Graph& graph) {
    Node* identity = graph.Producer("b");
    graph.RemoveNode(identity);
    graph.ReplaceAllUsesWith("b", "a");
    graph.RemoveInitializer("unused");
    // Added last but read by Neg: only a topological order puts it first.
    graph.AddNode(MakeNode("Abs", {"x"}, {"c"}), nullptr);
    graph.SetInput(graph.Producer("a"), 0, "c");
  };
  auto second_edit = [](Graph& graph) {
    // Sees the nodes in topological order, as a fresh Graph would.
    std::vector<std::string> ops;
    for (const Node* node : graph.Nodes()) ops.emplace_back(node->op_type());
    EXPECT_EQ(ops, (std::vector<std::string>{"Abs", "Relu", "Neg"}));
    // Anchored before Relu but reading y: the emission order breaks, only a full sort repairs it.
    graph.AddNode(MakeNode("Sigmoid", {"y"}, {"z"}), graph.Producer("a"), /*after=*/false);
  };
  auto third_edit = [](Graph& graph) {
    // Edits that keep the emission order topological (a checkpoint then only sorts by it).
    Node* exp = graph.AddNode(MakeNode("Exp", {"c"}, {"e"}), graph.Producer("c"), /*after=*/true);
    graph.SetInput(graph.Producer("a"), 0, exp->output(0));
    graph.AddNode(MakeNode("Tanh", {"e"}, {"t"}), graph.Producer("y"), /*after=*/true);
  };

  onnx::GraphProto rebuilt = original;
  {
    Graph graph(&rebuilt);
    first_edit(graph);
    ASSERT_TRUE(graph.Commit().ok());
  }
  {
    Graph graph(&rebuilt);
    second_edit(graph);
    ASSERT_TRUE(graph.Commit().ok());
  }
  {
    Graph graph(&rebuilt);
    third_edit(graph);
    ASSERT_TRUE(graph.Commit().ok());
  }
  onnx::GraphProto held = original;
  {
    Graph graph(&held);
    first_edit(graph);
    EXPECT_TRUE(graph.changed());
    ASSERT_TRUE(graph.Checkpoint().ok());
    EXPECT_FALSE(graph.changed());
    EXPECT_EQ(graph.Initializer("unused"), nullptr);
    EXPECT_EQ(graph.proto().initializer_size(), 0);
    EXPECT_EQ(graph.proto().value_info_size(), 0);  // b is gone
    EXPECT_EQ(graph.UniqueName("v"), "v_onnxopt_0");
    ASSERT_TRUE(graph.Checkpoint().ok());
    EXPECT_EQ(graph.UniqueName("v"), "v_onnxopt_1") << "a name given out stays taken across checkpoints";
    second_edit(graph);
    ASSERT_TRUE(graph.Checkpoint().ok());
    third_edit(graph);
    ASSERT_TRUE(graph.Checkpoint().ok());
    std::vector<std::string> ops;
    for (const Node* node : graph.Nodes()) ops.emplace_back(node->op_type());
    EXPECT_EQ(ops, (std::vector<std::string>{"Abs", "Exp", "Relu", "Neg", "Tanh", "Sigmoid"}));
    EXPECT_EQ(graph.Consumers("e").size(), 2u);
    EXPECT_EQ(graph.Consumers("e")[0]->op_type(), "Relu");  // readers in the new order
    ASSERT_TRUE(graph.Commit().ok());
  }
  EXPECT_EQ(held.SerializeAsString(), rebuilt.SerializeAsString()) << held.DebugString() << rebuilt.DebugString();
}

// A rewired input is checked when it is set: no node was added and no output changed, yet B now
// reads a value written after it, and only a full sort at the checkpoint puts C first.
TEST(GraphTest, RewiringAReaderToALaterValueReordersAtTheCheckpoint) {
  for (const bool replace_all_uses : {false, true}) {
    onnx::GraphProto proto;
    *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
    *proto.add_node() = MakeNode("Neg", {"a"}, {"b"});
    *proto.add_node() = MakeNode("Abs", {"x"}, {"c"});
    *proto.add_input() = FloatValue("x", {2});
    *proto.add_output() = FloatValue("b", {2});
    *proto.add_output() = FloatValue("c", {2});
    Graph graph(&proto);
    if (replace_all_uses) {
      graph.ReplaceAllUsesWith("a", "c");
    } else {
      graph.SetInput(graph.Producer("b"), 0, "c");
    }
    ASSERT_TRUE(graph.Checkpoint().ok());
    std::vector<std::string> ops;
    for (const Node* node : graph.Nodes()) ops.emplace_back(node->op_type());
    EXPECT_EQ(ops, (std::vector<std::string>{"Relu", "Abs", "Neg"})) << "ReplaceAllUsesWith: " << replace_all_uses;
  }
}

TEST(GraphTest, OpDeltaCountsAddedAndRemovedOperatorsWithTheirDomains) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_node() = MakeNode("Relu", {"a"}, {"y"});
  *proto.add_input() = FloatValue("x", {2});
  *proto.add_output() = FloatValue("y", {2});
  Graph graph(&proto);
  graph.RemoveNode(graph.Producer("a"));
  graph.RemoveNode(graph.Producer("y"));
  onnx::NodeProto fused = MakeNode("FastGelu", {"x"}, {"y"});
  fused.set_domain("com.microsoft");
  graph.AddNode(fused);
  EXPECT_EQ(graph.TakeOpDelta(), (std::map<std::string, int64_t>{{"Relu", -2}, {"com.microsoft::FastGelu", 1}}));
  EXPECT_TRUE(graph.TakeOpDelta().empty());
  ASSERT_TRUE(graph.Commit().ok());
}

// What a checkpoint reports gone: removed outputs, renamed-away names and removed initializers, but
// not a name a pass defined again.
TEST(GraphTest, CheckpointsReportTheNamesThatWent) {
  onnx::GraphProto proto;
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_node() = MakeNode("Neg", {"a"}, {"b"});
  *proto.add_node() = MakeNode("Abs", {"b"}, {"c"});
  *proto.add_node() = MakeNode("Add", {"c", "w"}, {"y"});
  *proto.add_input() = FloatValue("x", {2});
  *proto.add_output() = FloatValue("y", {2});
  *proto.add_initializer() = testing::FloatTensor("w", {1}, {1});
  *proto.add_initializer() = testing::FloatTensor("unused", {1}, {1});
  Graph graph(&proto);
  graph.RemoveNode(graph.Producer("b"));       // b goes
  graph.SetInput(graph.Producer("c"), 0, "a");
  Node* abs = graph.Producer("c");
  graph.RemoveNode(abs);                       // c goes, and comes back from another node
  graph.AddNode(MakeNode("Sigmoid", {"a"}, {"c"}), abs, /*after=*/true);
  ASSERT_TRUE(graph.RenameValue("a", "a2").ok());  // a goes
  graph.RemoveInitializer("unused");
  ASSERT_TRUE(graph.Checkpoint().ok());
  std::vector<std::string> vanished = graph.TakeVanishedValues();
  std::sort(vanished.begin(), vanished.end());
  EXPECT_EQ(vanished, (std::vector<std::string>{"a", "b", "unused"}));
  EXPECT_TRUE(graph.TakeVanishedValues().empty());
  ASSERT_TRUE(graph.Commit().ok());
}

}  // namespace
}  // namespace onnxopt
