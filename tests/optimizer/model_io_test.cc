#include "optimizer/model_io.h"

#include <fstream>

#include "google/protobuf/unknown_field_set.h"

#include "gtest/gtest.h"
#include "optimizer/ort_runtime.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"

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

// Every place ONNX lets a tensor live can point at external data; a loader that skips one lets ONNX
// Runtime resolve that location itself (for sparse initializers: relative to its working directory).
TEST_F(ModelIoTest, EveryExternalTensorIsFoundAndConfined) {
  auto external = [](const std::string& location, onnx::TensorProto tensor) {
    tensor.clear_raw_data();
    tensor.set_data_location(onnx::TensorProto::EXTERNAL);
    auto* entry = tensor.add_external_data();
    entry->set_key("location");
    entry->set_value(location);
    return tensor;
  };
  auto sparse = [&](const std::string& values, const std::string& indices) {
    onnx::SparseTensorProto tensor;
    tensor.add_dims(4);
    onnx::TensorProto v = FloatTensor("s", {1}, {1});
    *tensor.mutable_values() = values.empty() ? v : external(values, v);
    onnx::TensorProto i;
    i.set_data_type(onnx::TensorProto::INT64);
    i.add_dims(1);
    i.add_int64_data(2);
    *tensor.mutable_indices() = indices.empty() ? i : external(indices, i);
    return tensor;
  };
  onnx::GraphProto graph;
  *graph.add_sparse_initializer() = sparse("sparse_values.bin", "sparse_indices.bin");
  onnx::NodeProto constant = MakeNode("Constant", {}, {"c"});
  auto* value = constant.add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  *value->mutable_t() = external("constant.bin", FloatTensor("", {1}, {1}));
  *graph.add_node() = constant;
  onnx::NodeProto sparse_constant = MakeNode("Constant", {}, {"sc"});
  auto* sparse_value = sparse_constant.add_attribute();
  sparse_value->set_name("sparse_value");
  sparse_value->set_type(onnx::AttributeProto::SPARSE_TENSOR);
  *sparse_value->mutable_sparse_tensor() = sparse("constant_sparse.bin", "");
  *graph.add_node() = sparse_constant;
  onnx::NodeProto branch = MakeNode("If", {"cond"}, {"y"});
  auto* then_branch = branch.add_attribute();
  then_branch->set_name("then_branch");
  then_branch->set_type(onnx::AttributeProto::GRAPH);
  *then_branch->mutable_g()->add_sparse_initializer() = sparse("subgraph.bin", "");
  *graph.add_node() = branch;
  onnx::ModelProto model = MakeModel(graph);
  onnx::FunctionProto* function = model.add_functions();
  function->set_name("f");
  *function->add_node() = constant;
  function->mutable_node(0)->mutable_attribute(0)->mutable_t()->mutable_external_data(0)->set_value("function.bin");

  std::vector<std::string> expected = {"constant.bin",  "constant_sparse.bin", "function.bin",
                                       "sparse_indices.bin", "sparse_values.bin", "subgraph.bin"};
  EXPECT_EQ(ExternalDataLocations(model), expected);

  // The files are there: all of them are read into the model. A sparse location outside the folder
  // (as in "etc/passwd" resolved from "/") is refused like any other.
  for (const std::string& file : expected) std::ofstream(dir_ / "model" / file, std::ios::binary) << std::string(8, 'x');
  const fs::path path = dir_ / "model" / "model.onnx";
  std::ofstream(path, std::ios::binary) << model.SerializeAsString();
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(ExternalDataLocations(*loaded).empty());
  EXPECT_EQ(loaded->graph().sparse_initializer(0).values().raw_data().size(), 8u);
  model.mutable_graph()->mutable_sparse_initializer(0)->mutable_values()->mutable_external_data(0)->set_value(
      "../secret.bin");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << model.SerializeAsString();
  auto refused = LoadModel(path);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("EXTERNAL_DATA_PATH"), std::string::npos) << refused.status();
}

// Function attribute defaults (IR 9) are unknown bytes to onnx 1.12: tensors there could not be
// checked, so such a model is refused rather than handed to ONNX Runtime unchecked.
TEST_F(ModelIoTest, RefusesTensorsThisOnnxCannotSee) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Identity", {"x"}, {"y"});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_output() = FloatValue("y", {2});
  onnx::ModelProto model = MakeModel(graph);
  onnx::FunctionProto* function = model.add_functions();
  function->set_name("with_defaults");
  onnx::AttributeProto defaults;
  defaults.set_name("w");
  defaults.set_type(onnx::AttributeProto::TENSOR);
  *defaults.mutable_t() = FloatTensor("", {1}, {1});
  function->mutable_unknown_fields()->AddLengthDelimited(11, defaults.SerializeAsString());
  const fs::path path = dir_ / "model" / "model.onnx";
  std::ofstream(path, std::ios::binary) << model.SerializeAsString();
  auto loaded = LoadModel(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("MODEL_UNSUPPORTED"), std::string::npos) << loaded.status();
}

TEST_F(ModelIoTest, GarbageIsNotAModel) {
  auto model = ParseModel("this is not protobuf \x01\x02\x03");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("MODEL_PARSE_FAILED"), std::string::npos);
  EXPECT_EQ(ParseModel("").status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir_ / "junk.onnx", std::ios::binary) << std::string(1 << 20, '\x07');
  EXPECT_NE(ParseModelFile(dir_ / "junk.onnx").status().message().find("MODEL_PARSE_FAILED"), std::string::npos);
  EXPECT_EQ(ParseModelFile(dir_ / "absent.onnx").status().code(), absl::StatusCode::kNotFound);
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

// The model file is serialized straight into the file: a write that runs out of space must still
// say DISK_FULL and leave neither the file nor its temporary behind, flushed to the disk (the server)
// or not (the CLI). Needs a small tmpfs (root).
TEST_F(ModelIoTest, SavingOntoAFullDiskIsDiskFullAndLeavesNothing) {
  const fs::path small = dir_ / "small";
  std::string why;
  const auto disk = testing::MountSmallDisk(small, "64k", &why);
  if (disk == nullptr) GTEST_SKIP() << why;
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "w"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {65536}, std::vector<float>(65536, 1.0f));  // 256 KB inline
  *graph.add_input() = FloatValue("x", {65536});
  *graph.add_output() = FloatValue("y", {65536});
  for (const bool durable : {true, false}) {
    SaveOptions options;
    options.external_threshold_bytes = int64_t{1} << 30;  // one file, written by the serializer
    options.durable = durable;
    auto files = SaveModel(MakeModel(graph), small / "model.onnx", options);
    ASSERT_FALSE(files.ok()) << "durable " << durable;
    EXPECT_EQ(files.status().code(), absl::StatusCode::kResourceExhausted) << files.status();
    EXPECT_NE(files.status().message().find("DISK_FULL"), std::string::npos) << files.status();
    for (const auto& entry : fs::directory_iterator(small)) ADD_FAILURE() << "left behind: " << entry.path();
  }
}

TEST_F(ModelIoTest, ByReferenceKeepsBigTensorsInTheirFileAndReadsTheSameBytes) {
  auto inline_model = LoadModel(FixturePath("mlp_external/model.onnx"));
  auto referenced = LoadModelByReference(FixturePath("mlp_external/model.onnx"), 1024);
  ASSERT_TRUE(inline_model.ok() && referenced.ok()) << referenced.status();
  int by_reference = 0;
  for (int i = 0; i < referenced->graph().initializer_size(); ++i) {
    const onnx::TensorProto& kept = referenced->graph().initializer(i);
    const onnx::TensorProto& pulled = inline_model->graph().initializer(i);
    EXPECT_EQ(TensorDataBytes(kept), static_cast<int64_t>(pulled.raw_data().size())) << kept.name();
    if (!IsByReference(kept)) continue;
    ++by_reference;
    EXPECT_TRUE(kept.raw_data().empty());
    std::string scratch;
    const std::string* bytes = RawBytes(kept, &scratch);
    ASSERT_NE(bytes, nullptr);
    EXPECT_EQ(*bytes, pulled.raw_data()) << kept.name();
  }
  EXPECT_GT(by_reference, 0);
  onnx::ModelProto loaded = *referenced;
  ASSERT_TRUE(LoadAllTensorBytes(&loaded).ok());
  EXPECT_EQ(loaded.graph().SerializeAsString(), inline_model->graph().SerializeAsString());
}

TEST_F(ModelIoTest, ByReferenceRefusesWhatLoadModelRefuses) {
  for (const std::string location : {"/etc/passwd", "../escape.bin", "absent.bin"}) {
    auto model = LoadModelByReference(WriteExternalModel(location), 0);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << location;
  }
  std::ofstream(dir_ / "model" / "short.bin", std::ios::binary) << std::string(4, '\0');
  auto short_file = LoadModelByReference(WriteExternalModel("short.bin"), 0);
  EXPECT_NE(short_file.status().message().find("EXTERNAL_DATA_RANGE"), std::string::npos) << short_file.status();
}

TEST_F(ModelIoTest, SavingByReferenceCopiesFileToFileAndLoadsBackTheSame) {
  auto inline_model = LoadModel(FixturePath("mlp_external/model.onnx"));
  auto referenced = LoadModelByReference(FixturePath("mlp_external/model.onnx"), 1024);
  ASSERT_TRUE(inline_model.ok() && referenced.ok());
  // A tensor a pass made stays in memory and goes to the data file too.
  *referenced->mutable_graph()->add_initializer() = FloatTensor("made_by_a_pass", {512}, std::vector<float>(512, 3));
  onnx::TensorProto made = FloatTensor("made_by_a_pass", {512}, std::vector<float>(512, 3));
  made.set_data_location(onnx::TensorProto::DEFAULT);  // as LoadModel marks what it pulled in
  *inline_model->mutable_graph()->add_initializer() = made;
  auto files = SaveModel(*referenced, dir_ / "out.onnx");  // small, yet saved with its data file
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_LT(fs::file_size((*files)[0]), 4096u);
  auto reloaded = LoadModel(dir_ / "out.onnx");
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->graph().SerializeAsString(), inline_model->graph().SerializeAsString());
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << "leftover " << entry.path();
  }
}

// Models with tensors by reference can go to ONNX Runtime as bytes (constant folding's subgraphs)
// with their tensors pulled in, and compute what the inline model computes.
TEST_F(ModelIoTest, OnnxRuntimeRunsAModelByReferenceFromBytes) {
  auto inline_model = LoadModel(FixturePath("mlp_external/model.onnx"));
  auto referenced = LoadModelByReference(FixturePath("mlp_external/model.onnx"), 1024);
  ASSERT_TRUE(inline_model.ok() && referenced.ok());
  // ONNX Runtime refuses absolute external locations, so the bytes it gets have the tensors in them.
  auto bytes = SerializeForRuntime(*referenced);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(HasTensorsByReference(*referenced));
  EXPECT_FALSE(HasTensorsByReference(*inline_model));
  testing::ExpectBitIdenticalOutputs({inline_model->SerializeAsString(), {}}, {*bytes, {}}, *inline_model);
}

}  // namespace
}  // namespace onnxopt
