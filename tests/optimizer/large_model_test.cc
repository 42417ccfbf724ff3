// A model past protobuf's 2 GiB (external data) through a whole job whose lower precision fails:
// float16 overflows inside one block, so automatic mixed precision runs: it calibrates the float32
// model's magnitudes and judges candidates in ONNX Runtime, every one of them with its float32 weights
// by reference (RuntimeSource), never one serialized whole. The result is saved with its data file,
// stamped with its lineage and validated; the report's memory section covers every stage.
#include <cmath>
#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kWidth = 16384;  // two [16384, 16384] float32 weights: 2 GiB, plus a small head

// Appends `rows` x `cols` uniform floats of variance 1/rows (a cheap generator: 2 GiB to write) to
// `out`, and returns the initializer that points at them.
onnx::TensorProto WriteWeight(std::ofstream& out, const std::string& name, int64_t rows, int64_t cols,
                              uint64_t seed) {
  const int64_t offset = static_cast<int64_t>(out.tellp());
  const float scale = std::sqrt(3.0f / static_cast<float>(rows)) / static_cast<float>(uint64_t{1} << 31);
  std::vector<float> chunk(static_cast<size_t>(cols));
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t r = 0; r < rows; ++r) {
    for (float& value : chunk) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      value = static_cast<float>(static_cast<int64_t>(state >> 32) - (int64_t{1} << 31)) * scale;
    }
    out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(chunk.size() * sizeof(float)));
  }
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(onnx::TensorProto::FLOAT);
  tensor.add_dims(rows);
  tensor.add_dims(cols);
  tensor.set_data_location(onnx::TensorProto::EXTERNAL);
  for (auto [key, value] : {std::pair<std::string, std::string>{"location", "weights.bin"},
                            {"offset", std::to_string(offset)}, {"length", std::to_string(rows * cols * 4)}}) {
    auto* entry = tensor.add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  }
  return tensor;
}

// x [1, W] -> MatMul W1 -> * 1e5 (past float16's 65504) -> MatMul W2 -> * 1e-5 -> MatMul head -> y [1, 64].
fs::path WriteLargeModel(const fs::path& dir) {
  onnx::GraphProto graph;
  std::ofstream data(dir / "weights.bin", std::ios::binary);
  *graph.add_initializer() = WriteWeight(data, "w1", kWidth, kWidth, 1);
  *graph.add_initializer() = WriteWeight(data, "w2", kWidth, kWidth, 2);
  *graph.add_initializer() = WriteWeight(data, "head", kWidth, 64, 3);
  data.close();
  *graph.add_initializer() = testing::FloatTensor("up", {}, {1e5f});
  *graph.add_initializer() = testing::FloatTensor("down", {}, {1e-5f});
  *graph.add_node() = testing::MakeNode("MatMul", {"x", "w1"}, {"h1"}, "block0");
  *graph.add_node() = testing::MakeNode("Mul", {"h1", "up"}, {"h2"}, "scale_up");
  *graph.add_node() = testing::MakeNode("MatMul", {"h2", "w2"}, {"h3"}, "block1");
  *graph.add_node() = testing::MakeNode("Mul", {"h3", "down"}, {"h4"}, "scale_down");
  *graph.add_node() = testing::MakeNode("MatMul", {"h4", "head"}, {"y"}, "head");
  *graph.add_input() = testing::FloatValue("x", {1, kWidth});
  *graph.add_output() = testing::FloatValue("y", {1, 64});
  const fs::path path = dir / "model.onnx";
  std::ofstream(path, std::ios::binary) << testing::MakeModel(graph).SerializeAsString();
  return path;
}

TEST(LargeModelTest, AutomaticMixedPrecisionRunsOnAModelPastTwoGibibytes) {
  const fs::path dir = testing::TempDir("large_model");
  fs::create_directories(dir / "in");
  OptimizeRequest request;
  request.model_path = WriteLargeModel(dir / "in");
  ASSERT_GT(fs::file_size(dir / "in" / "weights.bin"), uint64_t{2} << 30);
  request.output_dir = dir / "out";
  request.durable_output = false;
  request.config.set_preset(v1::Pipelines::basic);
  request.config.mutable_precision()->set_mode(v1::PrecisionConfig::fp16);
  request.config.mutable_benchmark()->set_skip(true);
  v1::Report report;
  auto result = Optimize(request, &report);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << report.DebugString();
  const v1::Report& got = result->report;
  EXPECT_EQ(got.DebugString().find("protobuf"), std::string::npos) << "nothing failed on protobuf's size limit";
  // float16 overflowed, the search kept the overflowing block in float32 and the result passes.
  EXPECT_TRUE(got.parity().passed()) << got.parity().DebugString();
  EXPECT_FALSE(got.returned_original());
  EXPECT_GT(got.precision().auto_mixed_attempts(), 0);
  std::set<std::string> kept;
  for (const auto& node : got.precision().kept_nodes()) kept.insert(node.node());
  EXPECT_TRUE(kept.count("scale_up") && kept.count("block1")) << got.precision().DebugString();
  EXPECT_FALSE(kept.count("block0")) << "block 0 never sees a value past float16's range";
  // Saved as a model and its data file, which load back; the lineage is in the model.
  ASSERT_GE(result->files.size(), 2u);
  auto saved = LoadModelByReference(result->files.front());
  ASSERT_TRUE(saved.ok()) << saved.status();
  bool stamped = false;
  for (const auto& entry : saved->metadata_props()) stamped |= entry.key() == "onnxopt.source_sha256";
  EXPECT_TRUE(stamped);
  // Memory: every stage measured, against a model of more than 2 GiB.
  EXPECT_GT(got.memory().model_bytes(), int64_t{2} << 30);
  ASSERT_EQ(got.memory().stages_size(), 7);
  for (const auto& stage : got.memory().stages()) {
    EXPECT_GT(stage.peak_resident_bytes(), 0) << stage.stage();
    EXPECT_GE(stage.peak_resident_bytes(), stage.resident_bytes_after()) << stage.stage();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace onnxopt
