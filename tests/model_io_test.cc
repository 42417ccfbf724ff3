#include "optimizer/model_io.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {
namespace fs = std::filesystem;

using testing::FixturePath;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

class ModelIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("onnxopt_model_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "model");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A model with one tensor stored externally at `location`.
  fs::path WriteExternalModel(const std::string& location, int64_t offset = 0, int64_t length = 8) {
    onnx::GraphProto graph;
    *graph.add_node() = MakeNode("Add", {"x", "w"}, {"y"});
    onnx::TensorProto weight = FloatTensor("w", {2}, {1, 2});
    weight.clear_raw_data();
    weight.set_data_location(onnx::TensorProto::EXTERNAL);
    for (auto [key, value] : {std::pair<std::string, std::string>{"location", location},
                              {"offset", std::to_string(offset)}, {"length", std::to_string(length)}}) {
      auto* entry = weight.add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    }
    *graph.add_initializer() = weight;
    *graph.add_input() = FloatValue("x", {2});
    *graph.add_output() = FloatValue("y", {2});
    const fs::path path = dir_ / "model" / "model.onnx";
    std::ofstream(path, std::ios::binary) << MakeModel(graph).SerializeAsString();
    return path;
  }

  fs::path dir_;
};

TEST_F(ModelIoTest, LoadsExternalDataNextToTheModel) {
  auto model = LoadModel(FixturePath("mlp_external/model.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  for (const auto& tensor : model->graph().initializer()) {
    EXPECT_NE(tensor.data_location(), onnx::TensorProto::EXTERNAL) << tensor.name();
  }
  auto raw = ReadFile(FixturePath("mlp_external/model.onnx"));
  ASSERT_TRUE(raw.ok());
  auto parsed = ParseModel(*raw);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(ExternalDataLocations(*parsed), std::vector<std::string>{"weights.bin"});
}

TEST_F(ModelIoTest, RefusesLocationsOutsideTheModelFolder) {
  std::ofstream(dir_ / "secret.bin", std::ios::binary) << std::string(8, 'x');
  fs::create_symlink(dir_ / "secret.bin", dir_ / "model" / "link.bin");
  for (const std::string& location : {std::string("../secret.bin"), (dir_ / "secret.bin").string(),
                                      std::string("link.bin"), std::string("sub/../../secret.bin")}) {
    auto model = LoadModel(WriteExternalModel(location));
    ASSERT_FALSE(model.ok()) << location;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << location;
    EXPECT_NE(model.status().message().find("EXTERNAL_DATA_PATH"), std::string::npos) << model.status();
  }
}

TEST_F(ModelIoTest, ReportsMissingFilesAndBadRanges) {
  auto missing = LoadModel(WriteExternalModel("absent.bin"));
  EXPECT_NE(missing.status().message().find("EXTERNAL_DATA_MISSING"), std::string::npos) << missing.status();
  std::ofstream(dir_ / "model" / "short.bin", std::ios::binary) << std::string(4, 'x');
  auto short_file = LoadModel(WriteExternalModel("short.bin"));
  EXPECT_NE(short_file.status().message().find("EXTERNAL_DATA_RANGE"), std::string::npos) << short_file.status();
}

TEST_F(ModelIoTest, GarbageIsNotAModel) {
  auto model = ParseModel("this is not protobuf \x01\x02\x03");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("MODEL_PARSE_FAILED"), std::string::npos);
  EXPECT_EQ(ParseModel("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelIoTest, SavesBigModelsWithExternalDataThatLoadsBack) {
  auto original = LoadModel(FixturePath("mlp_external/model.onnx"));
  ASSERT_TRUE(original.ok());
  SaveOptions options;
  options.external_threshold_bytes = 1000;  // force the external layout
  auto files = SaveModel(*original, dir_ / "out.onnx", options);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[1].filename(), "out.onnx.data");
  EXPECT_LT(fs::file_size((*files)[0]), 4096u);
  auto reloaded = LoadModel(dir_ / "out.onnx");
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->graph().SerializeAsString(), original->graph().SerializeAsString());
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << "leftover " << entry.path();
  }
}

}  // namespace
}  // namespace onnxopt
