// The onnxopt client library: what the CLI does, as calls. Uploads resume where the server left
// off and skip blobs it already has; downloads are verified against the job's SHA-256 and written
// atomically. Errors come back as absl::Status with the server's code and reason.
#ifndef ONNXOPT_CLIENT_CLIENT_H_
#define ONNXOPT_CLIENT_CLIENT_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "onnxopt/v1/service.grpc.pb.h"

namespace onnxopt::client {

absl::Status FromGrpc(const grpc::Status& status);
// Reads a config written in protobuf's JSON mapping; INVALID_ARGUMENT with the parser's reason.
absl::StatusOr<v1::OptimizationConfig> ParseConfigJson(const std::string& json);
absl::StatusOr<v1::OptimizationConfig> LoadConfigFile(const std::filesystem::path& path);

// Input sets in `dir`, per set input name -> TensorProto file, in ONNX's test data layout:
// test_data_set_<N>/input_<K>.pb (one set per folder), or .pb files directly in `dir` (one set). The
// input name is the tensor's own name, else (for files directly in `dir`) the file's stem.
absl::StatusOr<std::vector<std::map<std::string, std::filesystem::path>>> FindInputFiles(const std::filesystem::path& dir);

// Where the CLI finds TLS material: a CA bundle to verify the server with (else the system's), and a
// client certificate and key for servers that require one (mutual TLS). All empty: plaintext.
struct TlsFiles {
  std::string ca, cert, key;
  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// Channel credentials for `tls`: INVALID_ARGUMENT for a certificate without its key (or the reverse),
// NOT_FOUND naming a PEM file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(const TlsFiles& tls);

class Client {
 public:
  explicit Client(const std::string& address);
  Client(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials);

  using Progress = std::function<void(int64_t done, int64_t total)>;
  absl::StatusOr<v1::Blob> UploadFile(const std::filesystem::path& path, const Progress& progress = nullptr);
  // Uploads a model and every external data file it names (found next to it).
  absl::StatusOr<v1::ModelRef> UploadModel(const std::filesystem::path& model_path, const Progress& progress = nullptr);

  // Uploads the input sets FindInputFiles finds in `dir`.
  absl::StatusOr<std::vector<v1::InputTensor>> UploadInputs(const std::filesystem::path& dir);

  absl::StatusOr<v1::Job> CreateJob(const v1::ModelRef& model, const v1::OptimizationConfig& config,
                                    const std::string& request_id = "",
                                    const std::vector<v1::InputTensor>& inputs = {});
  absl::StatusOr<v1::Job> GetJob(const std::string& name);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(v1::JobState state, int page_size, const std::string& page_token);
  absl::StatusOr<v1::Job> CancelJob(const std::string& name);
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& name);
  // Calls on_event for every event until the job ends; returns the final job.
  absl::StatusOr<v1::Job> WatchJob(const std::string& name, const std::function<void(const v1::Job&)>& on_event);
  // Writes the artifact to `path` (atomically), checking size and SHA-256.
  absl::Status Download(const std::string& name, const std::string& artifact, const std::filesystem::path& path);
  absl::StatusOr<v1::Report> GetReport(const std::string& name);
  absl::StatusOr<v1::ListPassesResponse> ListPasses();
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // Sends "authorization: Bearer <token>" with every call (servers with --auth_tokens_file).
  void set_token(std::string token) { token_ = std::move(token); }

 private:
  void Authorize(grpc::ClientContext* context) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Optimizer::Stub> stub_;
  std::string token_;
};

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_CLIENT_H_
