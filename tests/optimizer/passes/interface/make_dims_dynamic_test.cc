// make_dims_dynamic on a model traced at a static length of 32 (position ids, Range and Reshape
// targets baked in): after the pass it runs at 16, 64 and 200, and at every position both runs share it
// gives what the static model gives (the model is position-wise, so positions compare one to one).
// And where the length cannot be told apart from a model width, or a baked mask carries it, it refuses.
#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/length_check.h"
#include "google/protobuf/util/json_util.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

constexpr int64_t kStatic = 32, kHidden = 48, kVocab = 100, kPositions = 256;

// ids[1, 32] -> word + position embeddings (positions baked as the constant [[0..31]]), times
// Range(0, 32) as a per-position scale, reshaped to heads and back through constant targets.
onnx::ModelProto StaticModel() {
  onnx::GraphProto graph;
  *graph.add_input() = testing::MakeValue("input_ids", onnx::TensorProto::INT64, {1, kStatic});
  *graph.add_output() = testing::FloatValue("y", {1, kStatic, kHidden});
  *graph.add_initializer() = testing::FloatTensor("word", {kVocab, kHidden}, testing::RandomFloats(kVocab * kHidden, 1));
  *graph.add_initializer() =
      testing::FloatTensor("position", {kPositions, kHidden}, testing::RandomFloats(kPositions * kHidden, 2));
  std::vector<int64_t> arange(kStatic);
  for (int64_t i = 0; i < kStatic; ++i) arange[static_cast<size_t>(i)] = i;
  onnx::TensorProto positions = MakeInt64Tensor("position_ids", arange);
  positions.clear_dims();
  positions.add_dims(1);
  positions.add_dims(kStatic);
  *graph.add_initializer() = positions;
  *graph.add_initializer() = MakeIntScalar("zero", onnx::TensorProto::INT64, 0);
  *graph.add_initializer() = MakeIntScalar("limit", onnx::TensorProto::INT64, kStatic);
  *graph.add_initializer() = MakeIntScalar("one", onnx::TensorProto::INT64, 1);
  *graph.add_initializer() = MakeInt64Tensor("column", {1, kStatic, 1});
  *graph.add_initializer() = MakeInt64Tensor("heads", {1, kStatic, 4, kHidden / 4});
  *graph.add_initializer() = MakeInt64Tensor("merged", {1, kStatic, kHidden});
  *graph.add_node() = testing::MakeNode("Gather", {"word", "input_ids"}, {"words"});
  *graph.add_node() = testing::MakeNode("Gather", {"position", "position_ids"}, {"positions"});
  *graph.add_node() = testing::MakeNode("Add", {"words", "positions"}, {"summed"});
  // The position table sliced to the length too (a registered buffer cut to the sequence).
  *graph.add_initializer() = MakeInt64Tensor("slice_starts", {0});
  *graph.add_initializer() = MakeInt64Tensor("slice_ends", {kStatic});
  *graph.add_initializer() = MakeInt64Tensor("slice_axes", {0});
  *graph.add_node() = testing::MakeNode("Slice", {"position", "slice_starts", "slice_ends", "slice_axes"}, {"sliced"});
  *graph.add_node() = testing::MakeNode("Add", {"summed", "sliced"}, {"embedded"});
  *graph.add_node() = testing::MakeNode("Range", {"zero", "limit", "one"}, {"steps"});
  *graph.add_node() = testing::MakeNode("Reshape", {"steps", "column"}, {"steps_column"});
  *graph.add_node() = testing::WithIntAttribute(testing::MakeNode("Cast", {"steps_column"}, {"scale"}), "to",
                                                onnx::TensorProto::FLOAT);
  *graph.add_initializer() = MakeInt64Tensor("full", {1, kStatic, kHidden});
  *graph.add_node() = testing::MakeNode("Expand", {"scale", "full"}, {"scale_full"});
  *graph.add_node() = testing::MakeNode("ConstantOfShape", {"full"}, {"zeros"});
  *graph.add_node() = testing::MakeNode("Add", {"scale_full", "zeros"}, {"scale_checked"});
  *graph.add_node() = testing::MakeNode("Mul", {"embedded", "scale_checked"}, {"scaled"});
  *graph.add_node() = testing::MakeNode("Reshape", {"scaled", "heads"}, {"split"});
  *graph.add_node() = testing::MakeNode("Relu", {"split"}, {"activated"});
  *graph.add_node() = testing::MakeNode("Reshape", {"activated", "merged"}, {"y"});
  return testing::MakeModel(graph, 14);
}

std::vector<int64_t> Ids(int64_t length) {
  std::vector<int64_t> ids(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) ids[static_cast<size_t>(i)] = (i * 37 + 11) % kVocab;
  return ids;
}

std::vector<float> Outputs(const onnx::ModelProto& model, std::vector<int64_t> ids) {
  auto session = CreateSession({model.SerializeAsString(), {}}, {});
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const int64_t shape[] = {1, static_cast<int64_t>(ids.size())};
  Ort::Value input = Ort::Value::CreateTensor<int64_t>(memory, ids.data(), ids.size(), shape, 2);
  const char* input_names[] = {"input_ids"};
  const char* output_names[] = {"y"};
  auto outputs = (*session)->Run(Ort::RunOptions{nullptr}, input_names, &input, 1, output_names, 1);
  const float* data = outputs[0].GetTensorData<float>();
  return std::vector<float>(data, data + outputs[0].GetTensorTypeAndShapeInfo().GetElementCount());
}

TEST(MakeDimsDynamicTest, AStaticExportRunsAtOtherLengthsWithTheSameValues) {
  const onnx::ModelProto original = StaticModel();
  testing::PassRun run = testing::RunConfig(
      R"({"passes": [{"name": "make_dims_dynamic", "params": {"dims": "input_ids:1=sequence"}}]})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.model.graph().input(0).type().tensor_type().shape().dim(1).dim_param(), "sequence");
  EXPECT_EQ(run.model.graph().output(0).type().tensor_type().shape().dim(1).dim_param(), "sequence")
      << "the output's declared shape follows";
  EXPECT_EQ(run.report.rewrites(), 9) << "the input, Range, Slice, Expand, ConstantOfShape, 3 Reshapes, position ids";
  const std::vector<float> reference = Outputs(original, Ids(kStatic));
  ASSERT_EQ(reference.size(), static_cast<size_t>(kStatic * kHidden));
  EXPECT_EQ(Outputs(run.model, Ids(kStatic)), reference) << "unchanged at the exported length";
  for (int64_t length : {16, 64, 200}) {
    const std::vector<float> out = Outputs(run.model, Ids(length));
    ASSERT_EQ(out.size(), static_cast<size_t>(length * kHidden)) << length;
    const int64_t shared = std::min(length, kStatic);
    for (int64_t i = 0; i < shared * kHidden; ++i) {
      ASSERT_NEAR(out[static_cast<size_t>(i)], reference[static_cast<size_t>(i)], 1e-5) << length << " at " << i;
    }
    // Past the exported length: the same arithmetic at positions the static model never had.
    if (length > kStatic) {
      const auto last_row = out.begin() + (length - 1) * kHidden;
      EXPECT_GT(*std::max_element(last_row, last_row + kHidden), 0.0f) << "the last position is computed";
    }
  }
}

TEST(MakeDimsDynamicTest, RefusesATableItCannotDerive) {
  // A learned table of exactly the traced length added to the embeddings: its shape is the length, and it
  // is neither an arange nor a triangle (only re-exporting can free it).
  onnx::ModelProto tabled = StaticModel();
  *tabled.mutable_graph()->add_initializer() =
      testing::FloatTensor("absolute", {kStatic, kHidden}, testing::RandomFloats(kStatic * kHidden, 3));
  for (auto& node : *tabled.mutable_graph()->mutable_node()) {
    if (node.output(0) == "summed") node.set_input(1, "absolute");
  }
  const std::string config = R"({"passes": [{"name": "make_dims_dynamic", "params": {"dims": "input_ids:1=sequence"}}]})";
  testing::PassRun refused = testing::RunConfig(config, tabled);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status.message().find("constant 'absolute' [32, 48]"), std::string::npos) << refused.status;
  EXPECT_NE(refused.status.message().find("cannot be derived"), std::string::npos) << refused.status;

  // A constant of the traced length that never meets the sequence is no evidence: left as it is.
  onnx::ModelProto unrelated = StaticModel();
  onnx::TensorProto mask = MakeInt64Tensor("mask", std::vector<int64_t>(kStatic * kStatic, 1));
  mask.clear_dims();
  mask.add_dims(kStatic);
  mask.add_dims(kStatic);
  *unrelated.mutable_graph()->add_initializer() = mask;
  *unrelated.mutable_graph()->add_node() = testing::MakeNode("Identity", {"mask"}, {"mask_out"});
  *unrelated.mutable_graph()->add_output() = testing::MakeValue("mask_out", onnx::TensorProto::INT64, {kStatic, kStatic});
  testing::PassRun kept = testing::RunConfig(config, unrelated);
  ASSERT_TRUE(kept.status.ok()) << kept.status;
  EXPECT_EQ(kept.model.graph().output(1).type().tensor_type().shape().dim(0).dim_value(), kStatic);

  // A traced length of 1 is every broadcast dim of the graph.
  onnx::ModelProto single = StaticModel();
  single.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(1);
  testing::PassRun one = testing::RunConfig(config, single);
  EXPECT_EQ(one.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(one.status.message().find("a traced length of 0 or 1"), std::string::npos) << one.status;

  testing::PassRun malformed = testing::RunConfig(
      R"({"passes": [{"name": "make_dims_dynamic", "params": {"dims": "input_ids=sequence"}}]})", StaticModel());
  EXPECT_FALSE(malformed.status.ok());
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

// The models' first output for int64 inputs of [1, length] each: ids, a mask of ones (the last
// quarter zero: padding), token types of zeros.
std::vector<float> RunText(const onnx::ModelProto& model, int64_t length) {
  auto session = CreateSession({model.SerializeAsString(), {}}, {});
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  std::vector<std::string> names;
  for (const auto& input : model.graph().input()) names.push_back(input.name());
  std::vector<std::vector<int64_t>> data;
  for (const std::string& name : names) {
    std::vector<int64_t> values(static_cast<size_t>(length), 0);
    for (int64_t i = 0; i < length; ++i) {
      if (name == "input_ids") values[static_cast<size_t>(i)] = 2 + (i * 37 + 5) % 120;
      if (name == "attention_mask") values[static_cast<size_t>(i)] = i < length - length / 4 ? 1 : 0;
    }
    data.push_back(values);
  }
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const int64_t shape[] = {1, length};
  std::vector<Ort::Value> inputs;
  std::vector<const char*> input_names;
  for (size_t i = 0; i < names.size(); ++i) {
    inputs.push_back(Ort::Value::CreateTensor<int64_t>(memory, data[i].data(), data[i].size(), shape, 2));
    input_names.push_back(names[i].c_str());
  }
  const char* output_names[] = {"last_hidden_state"};
  auto outputs = (*session)->Run(Ort::RunOptions{nullptr}, input_names.data(), inputs.data(), inputs.size(),
                                 output_names, 1);
  const float* values = outputs[0].GetTensorData<float>();
  return std::vector<float>(values, values + outputs[0].GetTensorTypeAndShapeInfo().GetElementCount());
}

class StaticExportTest : public ::testing::TestWithParam<std::string> {};

// A PyTorch module traced at sequence 32, freed by make_dims_dynamic, against the same module exported
// with a dynamic sequence (tests/fixtures/make_fixtures.py static_length).
TEST_P(StaticExportTest, MatchesTheDynamicExportAtOtherLengths) {
  auto traced = LoadModel(testing::FixturePath("static_length/" + GetParam() + "_static32.onnx"));
  auto dynamic = LoadModel(testing::FixturePath("static_length/" + GetParam() + "_dynamic.onnx"));
  ASSERT_TRUE(traced.ok() && dynamic.ok());
  std::string dims;
  for (const auto& input : traced->graph().input()) dims += (dims.empty() ? "" : ",") + input.name() + ":1=sequence";
  testing::PassRun run = testing::RunConfig(
      R"({"passes": [{"name": "make_dims_dynamic", "params": {"dims": ")" + dims + R"("}}]})", *traced);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_GT(run.report.rewrites(), static_cast<int64_t>(traced->graph().input_size()))
      << "constants that baked the length in were rewritten";
  for (int64_t length : {32, 16, 64, 200}) {
    const std::vector<float> freed = RunText(run.model, length), reference = RunText(*dynamic, length);
    ASSERT_EQ(freed.size(), reference.size()) << length;
    ASSERT_EQ(freed.size() % static_cast<size_t>(length), 0u) << length;
    double worst = 0;
    for (size_t i = 0; i < freed.size(); ++i) worst = std::max(worst, std::fabs(double(freed[i]) - reference[i]));
    EXPECT_LT(worst, 1e-4) << GetParam() << " at sequence " << length;
  }
}

// The same through a job: validation runs the result at half and twice the exported length too,
// comparing the first 16 positions with the original at 32 (its mask zeroed past 16).
TEST_P(StaticExportTest, AJobValidatesTheFreedModelAtOtherLengths) {
  const std::filesystem::path model = testing::FixturePath("static_length/" + GetParam() + "_static32.onnx");
  auto traced = LoadModel(model);
  ASSERT_TRUE(traced.ok());
  std::string dims;
  for (const auto& input : traced->graph().input()) dims += (dims.empty() ? "" : ",") + input.name() + ":1=sequence";
  OptimizeRequest request;
  request.model_path = model;
  request.output_dir = testing::TempDir("freed_lengths_" + GetParam());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"passes": [{"name": "make_dims_dynamic", "params": {"dims": ")" + dims +
                      R"("}}, {"name": "fold_constants"}, {"name": "eliminate_dead_nodes"}],
                      "benchmark": {"skip": true}})",
                  &request.config)
                  .ok());
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::ParityReport& parity = result->report.parity();
  EXPECT_TRUE(parity.passed());
  ASSERT_EQ(parity.lengths_size(), 2);
  const v1::LengthCheck& shorter = parity.lengths(0);
  EXPECT_EQ(shorter.dim(), "sequence");
  EXPECT_EQ(shorter.exported(), 32);
  EXPECT_EQ(shorter.length(), 16);
  EXPECT_TRUE(shorter.ran() && shorter.passed()) << shorter.DebugString();
  // BERT's pooler reads the first position only, so it compares too.
  const std::vector<std::string> expected = absl::StartsWith(GetParam(), "bert")
                                               ? std::vector<std::string>{"last_hidden_state", "pooler_output"}
                                               : std::vector<std::string>{"last_hidden_state"};
  EXPECT_EQ(std::vector<std::string>(shorter.compared_outputs().begin(), shorter.compared_outputs().end()), expected)
      << shorter.DebugString();
  EXPECT_LT(shorter.max_abs_error(), 1e-4);
  const v1::LengthCheck& longer = parity.lengths(1);
  EXPECT_EQ(longer.length(), 64);
  EXPECT_TRUE(longer.ran() && longer.passed()) << longer.DebugString();
}

// The _h32 ones have head size 32, the traced length (and GPT-2's causal mask baked as a constant).
INSTANTIATE_TEST_SUITE_P(Families, StaticExportTest, ::testing::Values("bert", "gpt2", "bert_h32", "gpt2_h32"));

// y = 2x, position by position, exported at 8 with a mask input; a "freed" result that is wrong at
// other lengths (it adds the mean over the sequence) fails the check; the right one passes, and an
// output that mixes positions in the original too is reported as not compared instead.
TEST(LengthCheckTest, ComparesWhatThePrefixDeterminesAndCatchesAWrongResult) {
  auto make = [](bool freed, const std::string& extra) {
    onnx::GraphProto graph;
    *graph.add_input() = testing::FloatValue("x", {1, 8, 4});
    *graph.add_input() = testing::MakeValue("attention_mask", onnx::TensorProto::INT64, {1, 8});
    if (freed) {
      for (int i = 0; i < 2; ++i) {
        graph.mutable_input(i)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param(
            "sequence");
      }
    }
    *graph.add_initializer() = testing::FloatTensor("two", {}, {2});
    *graph.add_node() = testing::MakeNode("Mul", {"x", "two"}, {"doubled"});
    if (extra == "mean") {
      *graph.add_node() = testing::WithIntsAttribute(testing::MakeNode("ReduceMean", {"x"}, {"mean"}), "axes", {1});
      *graph.add_node() = testing::MakeNode("Add", {"doubled", "mean"}, {"y"});
    } else {
      *graph.add_node() = testing::MakeNode("Identity", {"doubled"}, {"y"});
    }
    *graph.add_initializer() = MakeInt64Tensor("axis1", {1});
    *graph.add_node() = testing::MakeNode("ReduceSum", {"x", "axis1"}, {"total"});  // axes an input from opset 13
    *graph.add_output() = testing::FloatValue("y", {1, 8, 4});
    *graph.add_output() = testing::FloatValue("total", {1, 1, 4});
    if (freed) {
      graph.mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param(
          "sequence");
    }
    return testing::MakeModel(graph, 13);
  };
  const onnx::ModelProto original = make(false, "");
  SessionSettings settings;
  auto original_session = CreateSession({original.SerializeAsString(), {}}, settings);
  ASSERT_TRUE(original_session.ok());
  for (const std::string variant : {"right", "mean"}) {
    const onnx::ModelProto result = make(true, variant);
    ASSERT_EQ(FreedDims(original, result).size(), 1u);
    auto session = CreateSession({result.SerializeAsString(), {}}, settings);
    ASSERT_TRUE(session.ok());
    v1::ParityReport report;
    ASSERT_TRUE(CheckFreedLengths(**original_session, original, **session, result, "fp32", {}, &report).ok());
    ASSERT_EQ(report.lengths_size(), 2);
    const v1::LengthCheck& shorter = report.lengths(0);
    EXPECT_EQ(shorter.length(), 4);
    EXPECT_EQ(shorter.passed(), variant == "right") << shorter.DebugString();
    ASSERT_EQ(shorter.compared_outputs_size(), 1);
    EXPECT_EQ(shorter.compared_outputs(0), "y");
    ASSERT_EQ(shorter.uncompared_outputs_size(), 1) << "the sum over the sequence depends on every position";
    EXPECT_EQ(shorter.uncompared_outputs(0), "total");
    EXPECT_TRUE(report.lengths(1).ran() && report.lengths(1).passed()) << report.lengths(1).DebugString();
  }
}

}  // namespace
}  // namespace onnxopt
