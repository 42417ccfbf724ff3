// The onnxopt client library: what the CLI does, as calls. Uploads resume where the server left
// off and skip blobs it already has; downloads are verified against the job's SHA-256 and written
// atomically. Errors come back as absl::Status with the server's code and reason.
#ifndef ONNXOPT_CLIENT_CLIENT_H_
#define ONNXOPT_CLIENT_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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

// A request id that stands for the request itself: the model's, its data files' and the inputs'
// SHA-256s, the config and the labels. Submitting the same thing again (a retry after a lost answer,
// a pipeline step run twice) finds the first job instead of queueing a second.
std::string DefaultRequestId(const v1::CreateJobRequest& request);

// Where an interrupted download of `path` keeps its bytes until they are complete and verified.
std::filesystem::path PartialDownloadPath(const std::filesystem::path& path, const std::string& sha256);

class Client {
 public:
  explicit Client(const std::string& address);
  // `server_name`, when set, is the name checked against the server's certificate instead of the
  // address's host (a probe dialing localhost inside the pod).
  Client(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials,
         const std::string& server_name = "");

  // Every call, retries included, ends by `deadline` (DEADLINE_EXCEEDED past it), and UNAVAILABLE is
  // retried until then. Unset: calls have no limit; UNAVAILABLE is retried only once the server has
  // answered (a restart, not a wrong address), for at most five minutes without an answer.
  void set_deadline(std::chrono::system_clock::time_point deadline) { deadline_ = deadline; }

  using Progress = std::function<void(int64_t done, int64_t total)>;
  absl::StatusOr<v1::Blob> UploadFile(const std::filesystem::path& path, const Progress& progress = nullptr);
  // Uploads a model and every external data file it names (found next to it).
  absl::StatusOr<v1::ModelRef> UploadModel(const std::filesystem::path& model_path, const Progress& progress = nullptr);

  // Uploads the input sets FindInputFiles finds in `dir`.
  absl::StatusOr<std::vector<v1::InputTensor>> UploadInputs(const std::filesystem::path& dir);

  absl::StatusOr<v1::Job> CreateJob(const v1::ModelRef& model, const v1::OptimizationConfig& config,
                                    const std::string& request_id = "",
                                    const std::vector<v1::InputTensor>& inputs = {});
  // Retried while the server is unavailable when the request has a request id (so a retry cannot
  // make a second job).
  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& name);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(v1::JobState state, int page_size, const std::string& page_token,
                                                const std::map<std::string, std::string>& labels = {});
  absl::StatusOr<v1::Job> CancelJob(const std::string& name);
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& name);
  // Calls on_event for every event until the job ends; returns the final job. A stream that breaks
  // (the server restarting, a rolling API pod) is opened again, with backoff, until the deadline.
  absl::StatusOr<v1::Job> WatchJob(const std::string& name, const std::function<void(const v1::Job&)>& on_event);
  // Streams the artifact into PartialDownloadPath(path, its SHA-256) and resumes from the bytes held
  // there after a broken stream (or an earlier, interrupted run); `path` appears only once the whole
  // file matches the job's size and SHA-256.
  absl::Status Download(const std::string& name, const std::string& artifact, const std::filesystem::path& path,
                        const Progress& progress = nullptr);
  // grpc.health.v1's ServingStatus of `service` ("" = the server as a whole): 1 SERVING, 2 NOT_SERVING,
  // 0 UNKNOWN. One try, no retries.
  absl::StatusOr<int> CheckHealth(const std::string& service);
  absl::StatusOr<v1::Report> GetReport(const std::string& name);
  absl::StatusOr<v1::ListPassesResponse> ListPasses();
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // Sends "authorization: Bearer <token>" with every call (servers with --auth-tokens-file).
  void set_token(std::string token) { token_ = std::move(token); }

 private:
  // A context for one try: the token, and the deadline.
  void Prepare(grpc::ClientContext* context) const;
  // Notes that the server answered (anything but UNAVAILABLE); returns `status`.
  absl::Status Answered(absl::Status status) const {
    if (status.code() != absl::StatusCode::kUnavailable) reached_ = true;
    return status;
  }
  // Whether a broken stream's status means the server is restarting (retry) rather than an answer.
  static bool Restarting(const absl::Status& status) {
    return status.code() == absl::StatusCode::kUnavailable || status.code() == absl::StatusCode::kCancelled;
  }
  // Runs `call` until it returns something other than UNAVAILABLE or the deadline passes, waiting
  // between tries with exponential backoff and jitter.
  absl::Status Retrying(const std::function<grpc::Status(grpc::ClientContext*)>& call) const;
  // Where a run of failed tries stands: the next wait, and since when nothing has answered.
  struct RetryState {
    std::chrono::milliseconds delay{250};
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  };
  // Sleeps the next backoff step; false when the deadline leaves no time for another try (or, without
  // one, after five minutes without an answer).
  bool Backoff(RetryState* retry) const;
  // The server's status of upload session `upload_id` of the blob `sha256` (retried while UNAVAILABLE).
  absl::StatusOr<v1::UploadStatus> QueryUploadStatus(const std::string& sha256, const std::string& upload_id) const;
  // One UploadBlob stream of `path` from byte `offset` to the end; returns how the server finished it.
  absl::Status StreamUploadFrom(const std::filesystem::path& path, const v1::Blob& blob, const std::string& upload_id,
                                int64_t offset, const Progress& progress) const;
  // A download in progress: the artifact, its size and SHA-256 once known, and its partial file (client.cc).
  struct DownloadState;
  // One Download stream from the bytes held: OK to go on (it ended, or broke and the backoff allows another
  // try), else the error that ends the download.
  absl::Status DownloadAttempt(const std::string& name, DownloadState* state, RetryState* retry,
                               const Progress& progress) const;
  // Verifies the complete partial file against the SHA-256 (removing a corrupt one) and moves it to `path`.
  static absl::Status FinishDownload(DownloadState* state, const std::filesystem::path& path);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Optimizer::Stub> stub_;
  std::string token_;
  std::optional<std::chrono::system_clock::time_point> deadline_;
  mutable std::atomic<bool> reached_{false};  // some call got an answer from the server
};

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_CLIENT_H_
