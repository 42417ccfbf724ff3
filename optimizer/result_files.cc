#include "optimizer/result_files.h"

#include "optimizer/lora_adapter.h"

namespace onnxopt {

const ResultFileEntry kResultFiles[5] = {{kModelFileName, v1::ARTIFACT_MODEL},
                                    {kModelDataFileName, v1::ARTIFACT_MODEL_DATA},
                                    {kReportFileName, v1::ARTIFACT_REPORT},
                                    {kSessionSettingsFileName, v1::ARTIFACT_SESSION_SETTINGS},
                                    {kAdapterFileName, v1::ARTIFACT_ADAPTER}};

v1::ArtifactRole ResultFileRole(absl::string_view file_name) {
  for (const ResultFileEntry& file : kResultFiles) {
    if (file_name == file.name) return file.role;
  }
  return v1::ARTIFACT_ROLE_UNSPECIFIED;
}

}  // namespace onnxopt
