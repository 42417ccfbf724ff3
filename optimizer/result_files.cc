#include "optimizer/result_files.h"

#include "optimizer/lora_adapter.h"

namespace onnxopt {

v1::ArtifactRole ResultFileRole(absl::string_view file_name) {
  if (file_name == kModelFileName) return v1::ARTIFACT_MODEL;
  if (file_name == kModelDataFileName) return v1::ARTIFACT_MODEL_DATA;
  if (file_name == kReportFileName) return v1::ARTIFACT_REPORT;
  if (file_name == kSessionSettingsFileName) return v1::ARTIFACT_SESSION_SETTINGS;
  if (file_name == kAdapterFileName) return v1::ARTIFACT_ADAPTER;
  return v1::ARTIFACT_ROLE_UNSPECIFIED;
}

}  // namespace onnxopt
