#include "optimizer/model_lineage.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"

namespace onnxopt {
namespace {

std::map<std::string, std::string> Props(const onnx::ModelProto& model) {
  std::map<std::string, std::string> props;
  for (const auto& entry : model.metadata_props()) props[entry.key()] = entry.value();
  return props;
}

TEST(ModelLineageTest, PropsSayWhatMadeTheModelAndHowItWasJudged) {
  v1::Report report;
  report.mutable_parity()->set_passed(true);
  report.mutable_benchmark()->set_speedup(1.23456);
  report.mutable_benchmark()->set_onnxruntime_version("1.29.0");
  v1::OptimizationConfig config;
  config.set_preset(v1::Pipelines::transformer);
  MetadataProps props = LineageProps(report, config, "jobs/7", "ab12", "pytorch 2.11");
  onnx::ModelProto model;
  model.set_producer_name("pytorch");
  auto* theirs = model.add_metadata_props();
  theirs->set_key("author");
  theirs->set_value("someone");
  auto* stale = model.add_metadata_props();
  stale->set_key("onnxopt.job");
  stale->set_value("jobs/older");
  StampLineage(props, &model);
  EXPECT_EQ(model.producer_name(), "onnxopt");
  const auto stamped = Props(model);
  EXPECT_EQ(stamped.at("author"), "someone") << "others' entries stay";
  EXPECT_EQ(stamped.at("onnxopt.job"), "jobs/7") << "an earlier run's entries are replaced, not doubled";
  EXPECT_EQ(model.metadata_props_size(), static_cast<int>(props.size()) + 1);
  EXPECT_EQ(stamped.at("onnxopt.speedup"), "1.235");
  EXPECT_EQ(stamped.at("onnxopt.parity"), "passed");
  EXPECT_EQ(stamped.at("onnxopt.source_sha256"), "ab12");
  EXPECT_EQ(stamped.at("onnxopt.source_producer"), "pytorch 2.11");
  EXPECT_EQ(stamped.at("onnxopt.onnxruntime_version"), "1.29.0");
  EXPECT_EQ(stamped.at("onnxopt.config_sha256"), ConfigDigest(config));
  v1::OptimizationConfig other = config;
  other.set_preset(v1::Pipelines::basic);
  EXPECT_NE(ConfigDigest(other), ConfigDigest(config));
}

TEST(ModelLineageTest, StampingAFileKeepsItsExternalDataReference) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("onnxopt-lineage-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  onnx::TensorProto* weight = model.mutable_graph()->add_initializer();
  weight->set_name("w");
  weight->set_data_type(onnx::TensorProto::FLOAT);
  weight->add_dims(4);
  weight->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* location = weight->add_external_data();
  location->set_key("location");
  location->set_value("model.onnx.data");
  ASSERT_TRUE(WriteFileAtomically(dir / "model.onnx", model.SerializeAsString()).ok());
  const absl::Status stamped_status = StampLineageFile({{"onnxopt.job", "jobs/1"}}, dir / "model.onnx");
  ASSERT_TRUE(stamped_status.ok()) << stamped_status;
  absl::StatusOr<onnx::ModelProto> stamped = ParseModelFile(dir / "model.onnx");
  ASSERT_TRUE(stamped.ok());
  EXPECT_EQ(Props(*stamped).at("onnxopt.job"), "jobs/1");
  EXPECT_EQ(stamped->graph().initializer(0).external_data(0).value(), "model.onnx.data");
  std::filesystem::remove_all(dir);
}

// The header is rewritten around the graph, which is copied from the file as it lies (a single-file
// model of 1.8 GB is never parsed): everything but the stamped fields comes back the same, and a file
// that is not a model is refused, left as it was.
TEST(ModelLineageTest, StampingRewritesTheHeaderAndCopiesTheGraphAsItIs) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("onnxopt-lineage-header-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("pytorch");
  model.set_model_version(3);
  model.add_opset_import()->set_version(17);
  auto* stale = model.add_metadata_props();
  stale->set_key("onnxopt.job");
  stale->set_value("jobs/old");
  auto* theirs = model.add_metadata_props();
  theirs->set_key("author");
  theirs->set_value("someone");
  onnx::TensorProto* weight = model.mutable_graph()->add_initializer();
  weight->set_name("w");
  weight->set_data_type(onnx::TensorProto::FLOAT);
  weight->add_dims(1 << 18);
  weight->set_raw_data(std::string(size_t{4} << 18, '\x3f'));
  model.mutable_graph()->set_name("g");
  model.add_functions()->set_name("f");
  const std::filesystem::path path = dir / "model.onnx";
  ASSERT_TRUE(WriteFileAtomically(path, model.SerializeAsString()).ok());
  const absl::Status status = StampLineageFile({{"onnxopt.job", "jobs/1"}}, path);
  ASSERT_TRUE(status.ok()) << status;
  absl::StatusOr<onnx::ModelProto> stamped = ParseModelFile(path);
  ASSERT_TRUE(stamped.ok()) << stamped.status();
  EXPECT_EQ(stamped->producer_name(), "onnxopt");
  EXPECT_EQ(stamped->ir_version(), 8);
  EXPECT_EQ(stamped->model_version(), 3);
  EXPECT_EQ(stamped->opset_import(0).version(), 17);
  EXPECT_EQ(Props(*stamped), (std::map<std::string, std::string>{{"author", "someone"}, {"onnxopt.job", "jobs/1"}}));
  EXPECT_EQ(stamped->graph().SerializeAsString(), model.graph().SerializeAsString());
  ASSERT_EQ(stamped->functions_size(), 1);
  EXPECT_EQ(stamped->functions(0).name(), "f");

  const std::filesystem::path broken = dir / "broken.onnx";
  const std::string truncated = model.SerializeAsString().substr(0, 1000);
  ASSERT_TRUE(WriteFileAtomically(broken, truncated).ok());
  EXPECT_EQ(StampLineageFile({{"onnxopt.job", "jobs/1"}}, broken).code(), absl::StatusCode::kDataLoss);
  absl::StatusOr<std::string> left = ReadFile(broken);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, truncated);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace onnxopt
