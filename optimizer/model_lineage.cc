#include "optimizer/model_lineage.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/sha256.h"

namespace onnxopt {

std::string ConfigDigest(const v1::OptimizationConfig& config) { return Sha256OfBytes(DeterministicBytes(config)); }

MetadataProps LineageProps(const v1::Report& report, const v1::OptimizationConfig& config, const std::string& job,
                           const std::string& source_sha256, const std::string& source_producer) {
  MetadataProps props = {{"onnxopt.version", kOptimizerVersion},
                         {"onnxopt.job", job},
                         {"onnxopt.config_sha256", ConfigDigest(config)}};
  if (!report.benchmark().onnxruntime_version().empty()) {
    props.push_back({"onnxopt.onnxruntime_version", report.benchmark().onnxruntime_version()});
  }
  if (!source_sha256.empty()) props.push_back({"onnxopt.source_sha256", source_sha256});
  if (!source_producer.empty()) props.push_back({"onnxopt.source_producer", source_producer});
  props.push_back({"onnxopt.parity", report.parity().skipped() ? "skipped" : report.parity().passed() ? "passed" : "failed"});
  // The speedup is the pipeline's output's: it does not describe a returned original.
  if (report.returned_original()) {
    props.push_back({"onnxopt.returned_original", "true"});
  } else if (!report.benchmark().skipped() && report.benchmark().speedup() > 0) {
    props.push_back({"onnxopt.speedup", absl::StrFormat("%.3f", report.benchmark().speedup())});
  }
  return props;
}

void StampLineage(const MetadataProps& props, onnx::ModelProto* model) {
  model->set_producer_name("onnxopt");
  model->set_producer_version(kOptimizerVersion);
  auto* entries = model->mutable_metadata_props();
  entries->erase(std::remove_if(entries->begin(), entries->end(),
                                [](const onnx::StringStringEntryProto& entry) {
                                  return absl::StartsWith(entry.key(), "onnxopt.");
                                }),
                 entries->end());
  for (const auto& [key, value] : props) {
    onnx::StringStringEntryProto* entry = model->add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  }
}

absl::Status StampLineageFile(const MetadataProps& props, const std::filesystem::path& model_file) {
  // Only the header changes: the graph is copied as it lies in the file, never parsed.
  return RewriteModelHeader(model_file, [&](onnx::ModelProto* header) { StampLineage(props, header); });
}

}  // namespace onnxopt
