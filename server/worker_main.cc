// onnxopt-worker: runs one optimization for onnxopt-server in a process of its own, so that a model
// which crashes a parser or ONNX Runtime, or eats all memory, fails its own job and nothing else.
//
//   onnxopt-worker --model=DIR/model.onnx --output_dir=OUT --config=CONFIG.pb [--inputs=DIR/inputs.tsv]
//                  [--digests=DIR/digests.tsv]
//   onnxopt-worker --inspect=MODEL     parse the model, list the external data files it names
//
// Speaks the protocol in worker_protocol.h on stdout. Every text it reports is valid UTF-8 (model
// names and op types are arbitrary bytes; proto3 strings and the job store must not be). SIGTERM asks it to stop at the next pass or
// phase boundary (it then reports CANCELLED).
#include <csignal>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "server/worker_protocol.h"

ABSL_FLAG(std::string, model, "", "the model file; its external data sits next to it");
ABSL_FLAG(std::string, output_dir, "", "where the optimized model and report.pb go");
ABSL_FLAG(std::string, config, "", "serialized onnxopt.v1.OptimizationConfig");
ABSL_FLAG(std::string, inputs, "", "manifest of the inputs supplied with the job (worker_protocol.h); empty: none");
ABSL_FLAG(std::string, digests, "", "manifest of the SHA-256 each input file must have (worker_protocol.h); empty: none");
ABSL_FLAG(std::string, job_name, "local", "the job's name, stamped into the delivered model's metadata");
ABSL_FLAG(std::string, inspect, "", "only parse this model file and list the external data files it names");

namespace {

std::atomic<bool> cancelled{false};
void OnTerminate(int) { cancelled.store(true); }

void Emit(const std::string& line) {
  std::cout << line << std::flush;
}

namespace srv = onnxopt::server;

// Bounds on what --inspect reports: more than any real model names, little for the server to hold.
constexpr size_t kMaxLocationBytes = 4096;
constexpr size_t kMaxLocations = 10000;

int Inspect(const std::string& path) {
  absl::StatusOr<onnx::ModelProto> model = onnxopt::ParseModelFile(path);
  absl::Status status = model.ok() ? onnxopt::CheckTensorsVisible(*model) : model.status();
  std::vector<std::string> locations;
  if (status.ok()) locations = onnxopt::ExternalDataLocations(*model);
  for (const std::string& location : locations) {
    if (location.size() > kMaxLocationBytes) {
      status = onnxopt::Failure(absl::StatusCode::kInvalidArgument, onnxopt::v1::ErrorReason::EXTERNAL_DATA_PATH,
                                absl::StrCat("an external data location is longer than ", kMaxLocationBytes, " bytes"));
    }
  }
  if (status.ok() && locations.size() > kMaxLocations) {
    status = onnxopt::Failure(absl::StatusCode::kInvalidArgument, onnxopt::v1::ErrorReason::EXTERNAL_DATA_PATH,
                              absl::StrCat("the model names more than ", kMaxLocations, " external data files"));
  }
  if (status.ok()) {
    for (const std::string& location : locations) Emit(srv::FormatExternalData(location));
  }
  Emit(srv::FormatStatus(status));
  return 0;
}

absl::Status VerifyInputFiles(const std::string& manifest) {
  absl::StatusOr<std::string> text = onnxopt::ReadFile(manifest);
  if (!text.ok()) return absl::InternalError(absl::StrCat("worker: cannot read its digest manifest: ", text.status().message()));
  absl::StatusOr<std::vector<srv::FileDigest>> files = srv::ParseDigestManifest(*text);
  if (!files.ok()) return absl::InternalError(absl::StrCat("worker: ", files.status().message()));
  return srv::VerifyDigests(*files, std::filesystem::path(manifest).parent_path());
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::signal(SIGTERM, OnTerminate);
  std::signal(SIGINT, SIG_IGN);  // the server decides when its children stop
  if (const std::string model = absl::GetFlag(FLAGS_inspect); !model.empty()) return Inspect(model);

  onnxopt::OptimizeRequest request;
  request.model_path = absl::GetFlag(FLAGS_model);
  request.output_dir = absl::GetFlag(FLAGS_output_dir);
  request.run = onnxopt::RunContext(&cancelled);
  request.job_name = absl::GetFlag(FLAGS_job_name);
  request.on_progress = [](onnxopt::Phase phase, const std::string& pass, int done, int total) {
    Emit(srv::FormatProgress(phase, done, total, pass));
  };
  absl::StatusOr<std::string> config = onnxopt::ReadFile(absl::GetFlag(FLAGS_config));
  if (!config.ok() || !request.config.ParseFromString(*config)) {
    Emit(srv::FormatStatus(absl::InternalError("worker: cannot read its config")));
    return 0;
  }
  if (const std::string manifest = absl::GetFlag(FLAGS_inputs); !manifest.empty()) {
    absl::StatusOr<std::string> text = onnxopt::ReadFile(manifest);
    auto files = text.ok() ? srv::ParseInputManifest(*text, std::filesystem::path(manifest).parent_path())
                           : absl::StatusOr<std::vector<std::map<std::string, std::filesystem::path>>>(text.status());
    if (!files.ok()) {
      Emit(srv::FormatStatus(absl::InternalError(absl::StrCat("worker: cannot read its input manifest: ",
                                                              files.status().message()))));
      return 0;
    }
    request.input_files = *std::move(files);
  }
  onnxopt::v1::Report report;
  absl::Status status;
  if (const std::string digests = absl::GetFlag(FLAGS_digests); !digests.empty()) status = VerifyInputFiles(digests);
  try {
    if (status.ok()) status = onnxopt::Optimize(request, &report).status();
  } catch (const std::bad_alloc&) {
    status = onnxopt::Failure(absl::StatusCode::kResourceExhausted, onnxopt::v1::ErrorReason::WORKER_OUT_OF_MEMORY,
                              "the job needed more memory than the worker may use");
  } catch (const std::exception& e) {
    status = absl::InternalError(std::string("unexpected error: ") + e.what());
  }
  absl::Status saved = onnxopt::WriteFileAtomically(request.output_dir / "report.pb", report.SerializeAsString());
  if (status.ok() && !saved.ok()) status = saved;
  Emit(srv::FormatStatus(status));
  return 0;
}
