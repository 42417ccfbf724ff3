// A model in memory handed to ONNX Runtime without serializing it whole: small ones as bytes, ones
// with tensors by reference from a scratch folder that links their data files instead of copying them
// (and is gone with the last copy of the source).
#include "optimizer/runtime_source.h"

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"

namespace onnxopt {
namespace {
namespace fs = std::filesystem;

TEST(RuntimeSourceTest, SmallModelsGoAsBytes) {
  auto model = LoadModel(testing::FixturePath("mlp_external/model.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto source = RuntimeSource(*model);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(source->path.empty());
  EXPECT_EQ(source->bytes, model->SerializeAsString());
}

TEST(RuntimeSourceTest, TensorsByReferenceAreLinkedIntoAScratchFolderThatGoesWithTheSource) {
  const fs::path dir = testing::TempDir("runtime_source");
  fs::copy(testing::FixturePath("mlp_external"), dir / "model");
  auto inline_model = LoadModel(dir / "model" / "model.onnx");
  auto referenced = LoadModelByReference(dir / "model" / "model.onnx", 1024);
  ASSERT_TRUE(inline_model.ok() && referenced.ok());
  ASSERT_TRUE(HasTensorsByReference(*referenced));
  // A tensor a pass made travels in the scratch model's own data file.
  *referenced->mutable_graph()->add_initializer() = testing::FloatTensor("made", {512}, std::vector<float>(512, 3));
  *inline_model->mutable_graph()->add_initializer() = testing::FloatTensor("made", {512}, std::vector<float>(512, 3));
  fs::path folder;
  {
    auto source = RuntimeSource(*referenced);
    ASSERT_TRUE(source.ok()) << source.status();
    ASSERT_FALSE(source->path.empty());
    EXPECT_TRUE(source->bytes.empty());
    folder = source->path.parent_path();
    EXPECT_EQ(folder.parent_path(), dir / "model") << "beside the data, where a link can be made";
    int links = 0;
    for (const auto& entry : fs::directory_iterator(folder)) {
      const std::string name = entry.path().filename().string();
      if (name.find(".ref") == std::string::npos) continue;
      ++links;
      EXPECT_EQ(fs::hard_link_count(entry.path()), 2u) << name << " is a link to the model's data, not a copy";
    }
    EXPECT_GT(links, 0);
    EXPECT_LT(fs::file_size(source->path), 4096u) << "the graph alone";
    testing::ExpectBitIdenticalOutputs({inline_model->SerializeAsString(), {}}, *source, *inline_model);
    const ModelSource copy = *source;  // a copy keeps the folder alive
    source = absl::InternalError("dropped");
    EXPECT_TRUE(fs::exists(copy.path));
  }
  EXPECT_FALSE(fs::exists(folder)) << "removed with the last copy";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace onnxopt
