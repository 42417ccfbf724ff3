// Lineage in the delivered model: onnxopt as its producer and metadata_props that say where it came
// from and how it was judged, so a model found later in a registry or a Triton repository explains
// itself (ONNX Runtime exposes them as ModelMetadata::GetCustomMetadataMap):
//   onnxopt.version, onnxopt.onnxruntime_version   what made and validated it
//   onnxopt.source_sha256, onnxopt.source_producer the uploaded model file and who exported it
//   onnxopt.job, onnxopt.config_sha256              the job and the exact config (deterministic bytes)
//   onnxopt.parity, onnxopt.speedup                 the verdict and the measured p50 speedup
//   onnxopt.returned_original                       set when the original came back (slower or failed)
#ifndef ONNXOPT_OPTIMIZER_MODEL_LINEAGE_H_
#define ONNXOPT_OPTIMIZER_MODEL_LINEAGE_H_

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"

namespace onnxopt {

using MetadataProps = std::vector<std::pair<std::string, std::string>>;

// SHA-256 of the config's deterministic serialization: equal configs, equal digests.
std::string ConfigDigest(const v1::OptimizationConfig& config);

// What the job stamps, from its report and request. `source_producer` is the input model's
// "producer_name producer_version".
MetadataProps LineageProps(const v1::Report& report, const v1::OptimizationConfig& config, const std::string& job,
                           const std::string& source_sha256, const std::string& source_producer);

// Sets onnxopt as the producer and `props` in `model` (replacing earlier onnxopt.* entries, keeping
// everyone else's).
void StampLineage(const MetadataProps& props, onnx::ModelProto* model);

// The same on a saved model file: only the .onnx file is rewritten (atomically); its external data
// file is referenced by name and stays as it is, so this costs the graph's bytes, not the weights'.
absl::Status StampLineageFile(const MetadataProps& props, const std::filesystem::path& model_file);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_MODEL_LINEAGE_H_
