// The files a job's result is made of, under the names the optimizer writes them in its output folder,
// and the one rule that tells each file's role (report.proto's ArtifactRole). The server lists
// artifacts with these roles and the clients place files by role, so no other part spells a name.
#ifndef ONNXOPT_OPTIMIZER_RESULT_FILES_H_
#define ONNXOPT_OPTIMIZER_RESULT_FILES_H_

#include <string>

#include "absl/strings/string_view.h"
#include "onnxopt/v1/report.pb.h"

namespace onnxopt {

inline constexpr char kModelFileName[] = "model.onnx";
inline constexpr char kModelDataFileName[] = "model.onnx.data";  // SaveModel: the model's name + ".data"
inline constexpr char kReportFileName[] = "report.json";
inline constexpr char kSessionSettingsFileName[] = "ort_session.json";
// kAdapterFileName (lora_adapter.h): the LoRA adapter extract_adapters writes.

struct ResultFileEntry {
  const char* name;
  v1::ArtifactRole role;
};
// Every file a job's output folder may hold, in the order a job lists them.
extern const ResultFileEntry kResultFiles[5];

// The role of the result file named `file_name`; ARTIFACT_ROLE_UNSPECIFIED for a name of none.
v1::ArtifactRole ResultFileRole(absl::string_view file_name);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_RESULT_FILES_H_
