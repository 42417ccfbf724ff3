// append_image_preprocessing and append_classification_postprocessing against the reference pipeline:
// Hugging Face's image processors as PIL and numpy run them (tests/fixtures/make_image_fixtures.py
// stores each image resized and cropped by PIL; rescale and normalize are done here in float32 as the
// processors do), fed to the original model in ONNX Runtime. The packaged model, given the uint8 image,
// must return the same probabilities within 1e-4 and the same top classes, for every family's defaults,
// images smaller and larger than the crop with odd sizes, both exporters (opset 17, moved to 18, and 20).
#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/passes/constants.h"
#include "optimizer/tensor_convert.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

struct Normalization {
  std::vector<float> mean, std;
};

// Hugging Face's processors' values.
const std::map<std::string, Normalization> kFamilies = {
    {"vit", {{0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}}},
    {"deit", {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}},
    {"dinov2", {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}},
    {"clip", {{0.48145466f, 0.4578275f, 0.40821073f}, {0.26862954f, 0.26130258f, 0.27577711f}}},
};
const char* kImages[] = {"image_301x217", "image_400x300", "image_97x150"};

onnx::TensorProto LoadTensor(const std::string& name) {
  onnx::TensorProto tensor;
  auto bytes = ReadFile(testing::FixturePath(absl::StrCat("images/", name, ".pb")));
  EXPECT_TRUE(bytes.ok() && tensor.ParseFromString(*bytes)) << name;
  return tensor;
}

// The processor's float math on a PIL-resized uint8 [h, w, 3]: NCHW float32 (x * 1/255 - mean) / std.
onnx::TensorProto Normalized(const onnx::TensorProto& pixels, const Normalization& n) {
  const int64_t h = pixels.dims(0), w = pixels.dims(1);
  std::vector<float> out(static_cast<size_t>(3 * h * w));
  const std::string& raw = pixels.raw_data();
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        const float value = static_cast<float>(static_cast<uint8_t>(raw[static_cast<size_t>((y * w + x) * 3 + c)]));
        const float rescaled = value * static_cast<float>(1.0 / 255);
        out[static_cast<size_t>((c * h + y) * w + x)] = (rescaled - n.mean[c]) / n.std[c];
      }
    }
  }
  return MakeFloatTensor("pixel_values", {1, 3, h, w}, out);
}

// Runs `model` on one input; its outputs by name.
std::map<std::string, std::vector<float>> RunModel(const onnx::ModelProto& model, const onnx::TensorProto& input,
                                                   std::vector<int64_t>* indices = nullptr) {
  std::map<std::string, std::vector<float>> outputs;
  SessionSettings settings;
  settings.optimization_level = ORT_DISABLE_ALL;
  auto session = CreateSession({model.SerializeAsString(), {}}, settings);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return outputs;
  auto value = TensorProtoToOrtValue(input);
  EXPECT_TRUE(value.ok()) << value.status();
  const std::string input_name = model.graph().input(0).name();
  std::vector<std::string> names;
  for (const auto& output : model.graph().output()) names.push_back(output.name());
  std::vector<const char*> name_pointers;
  for (const auto& name : names) name_pointers.push_back(name.c_str());
  const char* input_pointer = input_name.c_str();
  std::vector<Ort::Value> results =
      (*session)->Run(Ort::RunOptions{nullptr}, &input_pointer, &*value, 1, name_pointers.data(), name_pointers.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto info = results[i].GetTensorTypeAndShapeInfo();
    if (info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
      const int64_t* data = results[i].GetTensorData<int64_t>();
      if (indices != nullptr) indices->assign(data, data + info.GetElementCount());
      continue;
    }
    const float* data = results[i].GetTensorData<float>();
    outputs[names[i]] = std::vector<float>(data, data + info.GetElementCount());
  }
  return outputs;
}

std::vector<float> Softmax(const std::vector<float>& logits) {
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<float> out;
  double total = 0;
  for (float value : logits) total += std::exp(double(value) - top);
  for (float value : logits) out.push_back(static_cast<float>(std::exp(double(value) - top) / total));
  return out;
}

struct FamilyCase {
  const char* model;
  const char* family;
};
void PrintTo(const FamilyCase& c, std::ostream* os) { *os << c.model << "+" << c.family; }

class ImagePreprocessingTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(ImagePreprocessingTest, TakesUint8ImagesAndMatchesTheReferencePipeline) {
  const FamilyCase& c = GetParam();
  auto original = LoadModel(testing::FixturePath(absl::StrCat("hf/", c.model, ".onnx")));
  ASSERT_TRUE(original.ok());
  testing::PassRun run = testing::RunConfig(
      absl::StrCat(R"({"passes": [{"name": "append_image_preprocessing", "params": {"family": ")", c.family,
                   R"("}}, {"name": "append_classification_postprocessing", "params": {"top_k": 3}}]})"),
      *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  const onnx::ModelProto& packaged = run.model;
  ASSERT_EQ(packaged.graph().input(0).name(), "image");
  EXPECT_EQ(packaged.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::UINT8);
  ASSERT_EQ(packaged.graph().output_size(), 4) << "logits kept, probabilities and the top k added";
  for (const char* image : kImages) {
    const onnx::TensorProto pixels = LoadTensor(absl::StrCat(image, ".", c.family));
    const std::vector<float> logits = RunModel(*original, Normalized(pixels, kFamilies.at(c.family))).begin()->second;
    const std::vector<float> expected = Softmax(logits);
    onnx::TensorProto uint8_image = LoadTensor(image);
    const std::vector<int64_t> hwc(uint8_image.dims().begin(), uint8_image.dims().end());
    uint8_image.clear_dims();
    for (int64_t dim : {int64_t{1}, hwc[0], hwc[1], hwc[2]}) uint8_image.add_dims(dim);  // [1, h, w, 3]
    std::vector<int64_t> top;
    std::map<std::string, std::vector<float>> got = RunModel(packaged, uint8_image, &top);
    const std::vector<float>& probabilities = got["probabilities"];
    ASSERT_EQ(probabilities.size(), expected.size()) << image;
    double worst = 0;
    for (size_t i = 0; i < expected.size(); ++i)
      worst = std::max(worst, std::fabs(double(probabilities[i]) - expected[i]));
    EXPECT_LT(worst, 1e-4) << image << ": the probabilities differ by " << worst;
    // The pixels themselves (the model's input, made an output here): the models are small and random,
    // their probabilities near uniform, so this is where a preprocessing difference would show.
    onnx::ModelProto exposed = packaged;
    *exposed.mutable_graph()->add_output() = original->graph().input(0);
    const std::vector<float> pixels_got = RunModel(exposed, uint8_image)["pixel_values"];
    const onnx::TensorProto reference = Normalized(pixels, kFamilies.at(c.family));
    const std::vector<float> pixels_expected = *TensorFloats(reference);
    ASSERT_EQ(pixels_got.size(), pixels_expected.size());
    // PIL's fixed-point filters and ONNX Runtime's round a few values the other way: one gray level.
    const auto& stds = kFamilies.at(c.family).std;
    const double level = 1.0 / 255 / *std::min_element(stds.begin(), stds.end());
    int64_t off = 0;
    for (size_t i = 0; i < pixels_got.size(); ++i) {
      const double gap = std::fabs(double(pixels_got[i]) - pixels_expected[i]);
      ASSERT_LT(gap, level * 1.01) << image << " at " << i;
      off += gap > 1e-5;
    }
    EXPECT_LT(off, static_cast<int64_t>(pixels_got.size() / 200)) << image << ": values a gray level apart";
    std::vector<int64_t> order(expected.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return expected[a] > expected[b]; });
    ASSERT_EQ(top.size(), 3u);
    EXPECT_EQ(top, std::vector<int64_t>(order.begin(), order.begin() + 3)) << image;
    EXPECT_NEAR(got["top_k_probabilities"][0], expected[order[0]], 1e-4);
  }
}

// Every family's defaults on the ViT model (the preprocessing does not depend on the model), and the
// DeiT model with its own from the other exporter.
INSTANTIATE_TEST_SUITE_P(Fixtures, ImagePreprocessingTest,
                         ::testing::Values(FamilyCase{"vit_torchscript", "vit"}, FamilyCase{"vit_torchscript", "deit"},
                                           FamilyCase{"vit_dynamo", "dinov2"}, FamilyCase{"vit_dynamo", "clip"},
                                           FamilyCase{"deit_dynamo", "deit"}, FamilyCase{"deit_torchscript", "clip"}));

TEST(ImagePreprocessingParams, ExplicitStepsAndClearErrors) {
  auto original = LoadModel(testing::FixturePath("hf/vit_torchscript.onnx"));
  ASSERT_TRUE(original.ok());
  // The dinov2 pipeline spelled out, for one HWC image.
  testing::PassRun run = testing::RunConfig(
      R"({"passes": [{"name": "append_image_preprocessing", "params": {"layout": "HWC", "resize": "shortest_edge",
          "shortest_edge": 256, "resample": "cubic", "center_crop": "true", "mean": "0.485, 0.456, 0.406",
          "std": "0.229,0.224,0.225", "image_input": "photo"}}]})",
      *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.model.graph().input(0).name(), "photo");
  EXPECT_EQ(run.model.graph().input(0).type().tensor_type().shape().dim_size(), 3);
  const onnx::TensorProto pixels = LoadTensor("image_301x217.dinov2");
  const std::vector<float> expected = RunModel(*original, Normalized(pixels, kFamilies.at("dinov2"))).begin()->second;
  const std::vector<float> got = RunModel(run.model, LoadTensor("image_301x217")).begin()->second;
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-3) << i;

  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"family": "resnet"})", "family 'resnet' is unknown"},
      {R"({"resize": "exact", "resize_height": 100, "resize_width": 100, "center_crop": "true", "mean": "0.5,0.5,0.5"})",
       "smaller than the 224 x 224 crop"},
      {R"({"family": "vit", "mean": "0.5,0.5"})", "is not three comma-separated numbers"},
      {R"({"family": "vit", "layout": "CHW"})", "layout 'CHW' is not one of NHWC, HWC"},
      {R"({"family": "vit", "input": "pixels"})", "no input 'pixels'"},
  };
  auto classifier = LoadModel(testing::FixturePath("roberta_cls.onnx"));
  ASSERT_TRUE(classifier.ok());
  for (const auto& [params, reason] : std::vector<std::pair<std::string, std::string>>{
           {R"({"output": "nothing"})", "no output 'nothing'"}, {R"({"top_k": 0})", "top_k < 1"}}) {
    testing::PassRun bad = testing::RunConfig(
        absl::StrCat(R"({"passes": [{"name": "append_classification_postprocessing", "params": )", params, "}]}"),
        *classifier);
    EXPECT_NE(bad.status.message().find(reason), std::string::npos) << bad.status;
  }
  testing::PassRun twice = testing::RunConfig(
      R"({"passes": [{"name": "append_classification_postprocessing"}, {"name": "append_classification_postprocessing",
          "params": {"output": "probabilities"}}]})",
      *classifier);
  EXPECT_NE(twice.status.message().find("already has 'probabilities'"), std::string::npos) << twice.status;
  for (const auto& [params, reason] : refused) {
    testing::PassRun bad = testing::RunConfig(
        absl::StrCat(R"({"passes": [{"name": "append_image_preprocessing", "params": )", params, "}]}"), *original);
    ASSERT_FALSE(bad.status.ok()) << params;
    EXPECT_NE(bad.status.message().find(reason), std::string::npos) << bad.status;
  }
}

// Without a family or steps, the family the report detects gives the steps (and the note says which);
// a model no image family is detected in is refused with the reason.
TEST(ImagePreprocessingParams, WithoutAFamilyTheDetectedOneGivesTheSteps) {
  for (const auto& [model, family] : std::vector<std::pair<std::string, std::string>>{
           {"deit_dynamo", "deit"}, {"vit_torchscript", "vit"}}) {
    auto original = LoadModel(testing::FixturePath(absl::StrCat("hf/", model, ".onnx")));
    ASSERT_TRUE(original.ok());
    testing::PassRun run = testing::RunConfig(
        R"({"passes": [{"name": "append_image_preprocessing", "params": {"layout": "HWC"}}]})", *original);
    ASSERT_TRUE(run.status.ok()) << model << ": " << run.status;
    ASSERT_EQ(run.report.notes_size(), 2) << model;
    EXPECT_NE(run.report.notes(0).find(absl::StrCat("detected family '", family, "'")), std::string::npos)
        << run.report.notes(0);
    const std::vector<float> expected = Softmax(
        RunModel(*original, Normalized(LoadTensor(absl::StrCat("image_400x300.", family)), kFamilies.at(family)))
            .begin()
            ->second);
    const std::vector<float> got = Softmax(RunModel(run.model, LoadTensor("image_400x300")).begin()->second);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4) << model;
  }
  auto cnn = LoadModel(testing::FixturePath("cnn_tiny.onnx"));
  ASSERT_TRUE(cnn.ok());
  testing::PassRun refused =
      testing::RunConfig(R"({"passes": [{"name": "append_image_preprocessing"}]})", *cnn);
  EXPECT_NE(refused.status.message().find("no image family (vit, deit, dinov2, clip) is detected"), std::string::npos)
      << refused.status;
}

// In a job: the pipeline's model is validated and timed against the original on its own inputs, then
// packaged (passes_after) and saved so.
TEST(ImagePreprocessingJob, PassesAfterPackageTheValidatedModel) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("hf/deit_torchscript.onnx");
  request.output_dir = testing::TempDir("packaged_deit");
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"preset": "transformer", "benchmark": {"skip": true}, "passesAfter": [
                      {"name": "append_image_preprocessing", "params": {"family": "deit"}},
                      {"name": "append_classification_postprocessing", "params": {"top_k": 5}}]})",
                  &request.config)
                  .ok());
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->report.parity().passed());
  ASSERT_GE(result->report.passes_size(), 2);
  EXPECT_EQ(result->report.passes(result->report.passes_size() - 1).name(), "append_classification_postprocessing");
  auto saved = LoadModel(result->files.front());
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->graph().input(0).name(), "image");
  EXPECT_EQ(saved->graph().output_size(), 4);
  EXPECT_EQ(result->report.optimized().op_histogram().at("com.microsoft::Attention"), 2) << "still fused";
  const onnx::TensorProto pixels = LoadTensor("image_400x300.deit");
  auto original = LoadModel(request.model_path);
  const std::vector<float> expected =
      Softmax(RunModel(*original, Normalized(pixels, kFamilies.at("deit"))).begin()->second);
  onnx::TensorProto image = LoadTensor("image_400x300");
  image.clear_dims();
  for (int64_t dim : {1, 300, 400, 3}) image.add_dims(dim);
  const std::vector<float> got = RunModel(*saved, image)["probabilities"];
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4);
}

}  // namespace
}  // namespace onnxopt
