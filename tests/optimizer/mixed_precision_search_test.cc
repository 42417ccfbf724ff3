// The automatic mixed precision search on the trained decoder's int4 conversion, judged by a probe that
// passes exactly when given projections stay float32: a window along the graph, unless fewer of the
// nodes with the largest measured error pass.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/precision.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

constexpr char kQ0[] = "/layers.0/self_attn/q_proj/MatMul";
constexpr char kDown3[] = "/layers.3/down_proj/MatMul";
constexpr char kUp1[] = "/layers.1/up_proj/MatMul";
constexpr char kDown1[] = "/layers.1/down_proj/MatMul";

class MixedPrecisionSearchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<onnx::ModelProto> model = LoadModel(testing::FixturePath("cache/trained_decoder.onnx"));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    precision_.set_mode(v1::PrecisionConfig::int4_weight_only);
    for (const auto& node : model_.graph().node()) {
      if (node.op_type() == "MatMul" && node.name().find("_proj") != std::string::npos) projections_.push_back(node.name());
    }
    ASSERT_EQ(projections_.size(), 28u);
  }

  // Passes when every node of `required` is still a float MatMul in the candidate.
  ParityProbe Requiring(std::set<std::string> required) {
    return [required](const onnx::ModelProto& candidate, v1::ParityReport*) -> absl::StatusOr<bool> {
      std::set<std::string> float_matmuls;
      for (const auto& node : candidate.graph().node()) {
        if (node.op_type() == "MatMul") float_matmuls.insert(node.name());
      }
      return std::includes(float_matmuls.begin(), float_matmuls.end(), required.begin(), required.end());
    };
  }

  // The projections with `first` at the given ranks of a worst-first list, the others after them.
  std::vector<MeasuredError> Ranked(const std::vector<std::pair<size_t, std::string>>& placed) {
    std::vector<std::string> rest;
    for (const auto& name : projections_) {
      if (std::none_of(placed.begin(), placed.end(), [&](const auto& p) { return p.second == name; })) {
        rest.push_back(name);
      }
    }
    std::vector<MeasuredError> ranked;
    size_t next = 0;
    for (size_t rank = 0; rank < projections_.size(); ++rank) {
      auto at = std::find_if(placed.begin(), placed.end(), [&](const auto& p) { return p.first == rank; });
      const std::string name = at != placed.end() ? at->second : rest[next++];
      ranked.push_back({name, absl::StrCat("output error 0.", 99 - rank)});
    }
    return ranked;
  }

  std::set<std::string> Kept(const MixedPrecisionResult& result) {
    std::set<std::string> kept;
    for (const auto& node : result.kept) kept.insert(node.node());
    return kept;
  }

  onnx::ModelProto model_;
  v1::PrecisionConfig precision_;
  std::vector<std::string> projections_;
};

TEST_F(MixedPrecisionSearchTest, KeepsTheWorstMeasuredWhenTheyAreTheFewestThatPass) {
  // The two that matter lie far apart in the graph, and were measured the worst.
  std::string failure;
  absl::StatusOr<std::optional<MixedPrecisionResult>> found =
      SearchMixedPrecision(model_, precision_, {}, Requiring({kQ0, kDown3}), nullptr, {}, &failure,
                           Ranked({{0, kDown3}, {1, kQ0}}));
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value()) << failure;
  EXPECT_EQ(Kept(**found), (std::set<std::string>{kQ0, kDown3}));
  for (const auto& kept : (*found)->kept) {
    EXPECT_NE(kept.reason().find("among the 2 largest measured"), std::string::npos) << kept.reason();
  }
  int float_matmuls = 0;
  for (const auto& node : (*found)->model.graph().node()) float_matmuls += node.op_type() == "MatMul" && node.name().find("_proj") != std::string::npos;
  EXPECT_EQ(float_matmuls, 2) << "the candidate returned is the one that keeps exactly them";
}

TEST_F(MixedPrecisionSearchTest, KeepsAWindowAlongTheGraphWhenItIsShorter) {
  // Two neighbours in the graph matter, but one was measured far down the list: the window along the
  // graph keeps 2, and no single worst node passes (keeping the worst would take 11).
  std::string failure;
  absl::StatusOr<std::optional<MixedPrecisionResult>> found =
      SearchMixedPrecision(model_, precision_, {}, Requiring({kUp1, kDown1}), nullptr, {}, &failure,
                           Ranked({{0, kUp1}, {10, kDown1}}));
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value()) << failure;
  EXPECT_EQ(Kept(**found), (std::set<std::string>{kUp1, kDown1}));
  for (const auto& kept : (*found)->kept) {
    EXPECT_NE(kept.reason().find("bisection along the graph"), std::string::npos) << kept.reason();
  }
  EXPECT_GT((*found)->attempts, 5) << "the bisection, then the measured order below its window's size";
}

TEST_F(MixedPrecisionSearchTest, WithoutMeasuredErrorsItBisectsAndSaysWhyNothingPasses) {
  std::string failure;
  absl::StatusOr<std::optional<MixedPrecisionResult>> found =
      SearchMixedPrecision(model_, precision_, {}, Requiring({kUp1, kDown1}), nullptr, {}, &failure);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value()) << failure;
  EXPECT_EQ(Kept(**found), (std::set<std::string>{kUp1, kDown1}));

  ParityProbe never = [](const onnx::ModelProto&, v1::ParityReport*) -> absl::StatusOr<bool> { return false; };
  found = SearchMixedPrecision(model_, precision_, {}, never, nullptr, {}, &failure, Ranked({}));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
  EXPECT_EQ(failure, "even keeping every node in float32 does not pass");
}

}  // namespace
}  // namespace onnxopt
