#include "optimizer/result_files.h"

#include "gtest/gtest.h"
#include "optimizer/lora_adapter.h"

namespace onnxopt {
namespace {

TEST(ResultFilesTest, EachFileTheOptimizerWritesHasItsRole) {
  EXPECT_EQ(ResultFileRole(kModelFileName), v1::ARTIFACT_MODEL);
  EXPECT_EQ(ResultFileRole(kModelDataFileName), v1::ARTIFACT_MODEL_DATA);
  EXPECT_EQ(ResultFileRole(kReportFileName), v1::ARTIFACT_REPORT);
  EXPECT_EQ(ResultFileRole(kSessionSettingsFileName), v1::ARTIFACT_SESSION_SETTINGS);
  EXPECT_EQ(ResultFileRole(kAdapterFileName), v1::ARTIFACT_ADAPTER);
  // Anything else is kept under its own name by the clients.
  EXPECT_EQ(ResultFileRole("notes.txt"), v1::ARTIFACT_ROLE_UNSPECIFIED);
  EXPECT_EQ(ResultFileRole("sub/model.onnx"), v1::ARTIFACT_ROLE_UNSPECIFIED);
}

}  // namespace
}  // namespace onnxopt
