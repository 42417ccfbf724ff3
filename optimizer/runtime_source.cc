#include "optimizer/runtime_source.h"

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "optimizer/model_io.h"
#include "optimizer/result_files.h"

namespace onnxopt {
namespace fs = std::filesystem;
namespace {

// A fresh folder beside the model's data (where a hard link to it can be made), else in the system's
// temporary folder (where the data is copied); removed when the last holder lets go.
absl::StatusOr<std::shared_ptr<const fs::path>> MakeScratchFolder(const onnx::ModelProto& model) {
  std::vector<fs::path> candidates;
  for (const std::string& location : ExternalDataLocations(model)) {
    if (fs::path(location).is_absolute()) {
      candidates.push_back(fs::path(location).parent_path());
      break;
    }
  }
  std::error_code error;
  candidates.push_back(fs::temp_directory_path(error));
  for (const fs::path& parent : candidates) {
    if (parent.empty()) continue;
    std::string pattern = (parent / ".onnxopt-scratch-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) continue;
    return std::shared_ptr<const fs::path>(new fs::path(pattern), [](const fs::path* folder) {
      std::error_code ignored;
      fs::remove_all(*folder, ignored);
      delete folder;
    });
  }
  return absl::InternalError("cannot create a scratch folder for a model ONNX Runtime reads from files");
}

}  // namespace

absl::StatusOr<ModelSource> RuntimeSource(const onnx::ModelProto& model, int64_t inline_limit_bytes) {
  if (!HasTensorsByReference(model) && static_cast<int64_t>(model.ByteSizeLong()) <= inline_limit_bytes) {
    return ModelSource{model.SerializeAsString(), {}};
  }
  absl::StatusOr<std::shared_ptr<const fs::path>> folder = MakeScratchFolder(model);
  if (!folder.ok()) return folder.status();
  SaveOptions options;
  options.durable = false;  // read once by this process, then removed
  options.link_by_reference = true;
  const fs::path path = **folder / kModelFileName;
  absl::StatusOr<std::vector<fs::path>> saved = SaveModel(model, path, options);
  if (!saved.ok()) return saved.status();
  ModelSource source{"", path};
  source.files = *std::move(folder);
  return source;
}

}  // namespace onnxopt
