#include "client/client.h"

#include <fstream>
#include <future>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "optimizer/config_enums.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"
#include "optimizer/result_files.h"
#include "optimizer/sha256.h"

namespace onnxopt::client {
namespace fs = std::filesystem;

constexpr int64_t kChunkBytes = 1 << 20;
// Waits between tries of a call the server could not take (UNAVAILABLE): from 250 ms (RetryState), doubling,
// at most kMaxBackoff.
constexpr std::chrono::milliseconds kMaxBackoff(5000);
constexpr std::chrono::minutes kGiveUpAfter(5);

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<v1::OptimizationConfig> ParseConfigJson(const std::string& json) {
  v1::OptimizationConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  // Before the parser, whose error for a name an enum lacks names neither the field nor the choices.
  if (absl::Status names = CheckEnumNamesInJson(json, v1::OptimizationConfig::descriptor()); !names.ok()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::CONFIG_INVALID, names.message());
  }
  auto status = google::protobuf::util::JsonStringToMessage(json, &config, options);
  if (!status.ok()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::CONFIG_INVALID,
                   absl::StrCat(status.message().as_string()));
  }
  return config;
}

absl::StatusOr<v1::OptimizationConfig> LoadConfigFile(const fs::path& path) {
  absl::StatusOr<std::string> json = ReadFile(path);
  if (!json.ok()) return json.status();
  auto config = ParseConfigJson(*json);
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", config.status().message()));
  return config;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("a client certificate needs its key: give --tls-cert and --tls-key together");
  }
  grpc::SslCredentialsOptions options;
  auto read = [](const std::string& what, const std::string& path, std::string* pem) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    absl::StatusOr<std::string> read = ReadFile(path);
    if (!read.ok() || read->empty()) return absl::NotFoundError(absl::StrCat(what, " ", path, " cannot be read"));
    *pem = *std::move(read);
    return absl::OkStatus();
  };
  for (absl::Status status : {read("--tls-ca", tls.ca, &options.pem_root_certs),
                              read("--tls-cert", tls.cert, &options.pem_cert_chain),
                              read("--tls-key", tls.key, &options.pem_private_key)}) {
    if (!status.ok()) return status;
  }
  return grpc::SslCredentials(options);
}

std::string DefaultRequestId(const v1::CreateJobRequest& request) {
  const std::string config = DeterministicBytes(request.config());
  std::set<std::pair<std::string, std::string>> files;
  for (const auto& file : request.model().external_data()) files.insert({file.name(), file.sha256()});
  std::set<std::tuple<int, std::string, std::string>> inputs;
  for (const auto& input : request.inputs()) inputs.insert({input.sample(), input.name(), input.sha256()});
  const std::map<std::string, std::string> labels(request.labels().begin(), request.labels().end());
  // Length-prefixed fields: no two different requests encode alike.
  std::string material;
  auto add = [&](const std::string& field) { absl::StrAppend(&material, field.size(), ":", field, ";"); };
  add("onnxopt-request-v1");
  add(request.model().sha256());
  for (const auto& [name, digest] : files) absl::StrAppend(&material, "d", name.size(), ":", name, digest, ";");
  for (const auto& [sample, name, digest] : inputs) {
    absl::StrAppend(&material, "i", sample, ":", name.size(), ":", name, digest, ";");
  }
  for (const auto& [key, value] : labels) {
    absl::StrAppend(&material, "l", key.size(), ":", key, value.size(), ":", value, ";");
  }
  add(config);
  return absl::StrCat("auto-", Sha256OfBytes(material).substr(0, 32));
}

Client::Client(const std::string& address) : Client(address, grpc::InsecureChannelCredentials()) {}

Client::Client(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials,
               const std::string& server_name) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(16 << 20);
  // gRPC's own reconnect backoff grows to two minutes; a restarted server should be found in seconds.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  if (!server_name.empty()) arguments.SetSslTargetNameOverride(server_name);
  channel_ = grpc::CreateCustomChannel(address, std::move(credentials), arguments);
  stub_ = v1::Optimizer::NewStub(channel_);
}

void Client::Prepare(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
  if (deadline_) context->set_deadline(*deadline_);
}

bool Client::Backoff(RetryState* retry) const {
  thread_local std::mt19937 random(std::random_device{}());
  // Full jitter: replicas' clients that lost the same server do not all come back at once.
  const auto wait = std::chrono::milliseconds(
      std::uniform_int_distribution<int64_t>(retry->delay.count() / 2, retry->delay.count())(random));
  if (deadline_ && std::chrono::system_clock::now() + wait >= *deadline_) return false;
  // Without a deadline: a server never reached is a wrong address or TLS setting, said at once; one
  // that answered before is restarting (retried), until kGiveUpAfter without an answer.
  if (!deadline_ && (!reached_.load() || std::chrono::steady_clock::now() - retry->since > kGiveUpAfter)) return false;
  std::this_thread::sleep_for(wait);
  retry->delay = std::min<std::chrono::milliseconds>(retry->delay * 2, kMaxBackoff);
  return true;
}

absl::Status Client::Retrying(const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
  RetryState retry;
  while (true) {
    grpc::ClientContext context;
    Prepare(&context);
    absl::Status status = Answered(FromGrpc(call(&context)));
    if (status.code() != absl::StatusCode::kUnavailable || !Backoff(&retry)) return status;
  }
}

namespace {

bool IsFinal(const v1::Job& job) {
  return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED || job.state() == v1::CANCELLED;
}

// A fresh upload session id: the server keeps each session's partial data apart, and only whoever
// knows the id can resume it.
std::string NewUploadId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  return id;
}

}  // namespace

absl::StatusOr<v1::UploadStatus> Client::QueryUploadStatus(const std::string& sha256,
                                                           const std::string& upload_id) const {
  v1::UploadStatus status;
  v1::GetUploadStatusRequest status_request;
  status_request.set_sha256(sha256);
  status_request.set_upload_id(upload_id);
  absl::Status rpc =
      Retrying([&](grpc::ClientContext* context) { return stub_->GetUploadStatus(context, status_request, &status); });
  if (!rpc.ok()) return rpc;
  return status;
}

absl::Status Client::StreamUploadFrom(const fs::path& path, const v1::Blob& blob, const std::string& upload_id,
                                      int64_t offset, const Progress& progress) const {
  const int64_t total = blob.size();
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  grpc::ClientContext context;
  Prepare(&context);
  v1::Blob response;
  auto writer = stub_->UploadBlob(&context, &response);
  std::string buffer(kChunkBytes, '\0');
  bool first = true;
  do {
    in.read(buffer.data(), kChunkBytes);
    const std::streamsize got = in.gcount();
    v1::UploadBlobRequest chunk;
    if (first) {
      chunk.set_sha256(blob.sha256());
      chunk.set_total_size(total);
      chunk.set_upload_id(upload_id);
      first = false;
    }
    chunk.set_offset(offset);
    chunk.set_data(buffer.data(), static_cast<size_t>(got));
    offset += got;
    chunk.set_finish_write(offset >= total);
    if (!writer->Write(chunk)) break;  // the server ended the stream; Finish() says why
    if (progress) progress(offset, total);
  } while (offset < total && in);
  writer->WritesDone();
  return Answered(FromGrpc(writer->Finish()));
}

absl::StatusOr<v1::Blob> Client::UploadFile(const fs::path& path, const Progress& progress) {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error) return absl::NotFoundError(absl::StrCat("cannot read ", path.string(), ": ", error.message()));
  absl::StatusOr<std::string> digest = Sha256OfFile(path);
  if (!digest.ok()) return digest.status();
  const int64_t total = static_cast<int64_t>(size);
  v1::Blob blob;
  blob.set_sha256(*digest);
  blob.set_size(total);
  const std::string upload_id = NewUploadId();
  absl::Status finished;
  RetryState retry;
  int64_t last_committed = 0;
  while (true) {
    absl::StatusOr<v1::UploadStatus> status = QueryUploadStatus(*digest, upload_id);
    if (!status.ok()) return status.status();
    if (status->committed_size() > last_committed) {  // progress: a long upload's later breaks start afresh
      last_committed = status->committed_size();
      retry = RetryState();
    }
    if (status->complete()) {
      if (progress) progress(total, total);
      return blob;
    }
    const int64_t offset = status->committed_size() <= total ? status->committed_size() : 0;  // resume
    finished = StreamUploadFrom(path, blob, upload_id, offset, progress);
    // Connection lost (the server restarting), or the server still holds the broken stream of this
    // session: wait, then resume from what it committed (partial uploads survive a restart).
    if (finished.code() != absl::StatusCode::kUnavailable && finished.code() != absl::StatusCode::kAborted) break;
    if (!Backoff(&retry)) break;
  }
  if (!finished.ok()) return finished;
  return blob;
}

absl::StatusOr<v1::ModelRef> Client::UploadModel(const fs::path& model_path, const Progress& progress) {
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(model_path);
  if (!model.ok()) {
    return WithReason(
        absl::Status(model.status().code(), absl::StrCat(model_path.string(), ": ", model.status().message())),
        ReasonOf(model.status()));
  }
  v1::ModelRef reference;
  reference.set_display_name(model_path.filename().string());
  const fs::path folder = model_path.has_parent_path() ? model_path.parent_path() : fs::path(".");
  for (const std::string& location : ExternalDataLocations(*model)) {
    // Only regular files inside the model's folder go up: a link could point anywhere (/etc/passwd).
    std::error_code error;
    if (fs::is_symlink(fs::symlink_status(folder / location, error))) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_PATH,
                     absl::StrCat("the model's external data '", location,
                                  "' is a symbolic link; onnxopt uploads only regular files "
                                  "inside the model's folder"));
    }
    absl::StatusOr<fs::path> file = ResolveExternalDataPath(folder, location);
    if (!file.ok()) return file.status();
    absl::StatusOr<v1::Blob> blob = UploadFile(*file, progress);
    if (!blob.ok()) return blob.status();
    v1::ExternalDataFile* entry = reference.add_external_data();
    entry->set_name(location);
    entry->set_sha256(blob->sha256());
  }
  absl::StatusOr<v1::Blob> blob = UploadFile(model_path, progress);
  if (!blob.ok()) return blob.status();
  reference.set_sha256(blob->sha256());
  return reference;
}

absl::StatusOr<std::vector<std::map<std::string, fs::path>>> FindInputFiles(const fs::path& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                   absl::StrCat(dir.string(), " is not a folder"));
  }
  // The tensor's own name, else the stem of a file given directly.
  auto input_name = [](const fs::path& file, bool stem_allowed) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> bytes = ReadFile(file);
    if (!bytes.ok()) return bytes.status();
    onnx::TensorProto tensor;
    if (!tensor.ParseFromString(*bytes)) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                     absl::StrCat(file.string(), " is not an ONNX TensorProto"));
    }
    if (!tensor.name().empty()) return tensor.name();
    if (stem_allowed) return file.stem().string();
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                   absl::StrCat("the tensor in ", file.string(), " has no name, so it matches no input"));
  };
  auto sorted_entries = [&](const fs::path& folder) {
    std::vector<fs::path> entries;
    for (const auto& entry : fs::directory_iterator(folder, error)) entries.push_back(entry.path());
    std::sort(entries.begin(), entries.end());
    return entries;
  };
  std::vector<std::map<std::string, fs::path>> sets;
  std::map<std::string, fs::path> loose;
  for (const fs::path& entry : sorted_entries(dir)) {
    if (fs::is_directory(entry, error) && absl::StartsWith(entry.filename().string(), "test_data_set_")) {
      std::map<std::string, fs::path> set;
      for (const fs::path& file : sorted_entries(entry)) {
        if (!absl::StartsWith(file.filename().string(), "input_") || file.extension() != ".pb") continue;
        absl::StatusOr<std::string> name = input_name(file, false);
        if (!name.ok()) return name.status();
        set[*name] = file;
      }
      if (!set.empty()) sets.push_back(std::move(set));
    } else if (fs::is_regular_file(entry, error) && entry.extension() == ".pb") {
      absl::StatusOr<std::string> name = input_name(entry, true);
      if (!name.ok()) return name.status();
      loose[*name] = entry;
    }
  }
  if (!loose.empty()) sets.insert(sets.begin(), std::move(loose));
  if (sets.empty()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                   absl::StrCat("no .pb tensors in ", dir.string(), " (nor test_data_set_N/input_K.pb)"));
  }
  return sets;
}

absl::StatusOr<std::vector<v1::InputTensor>> Client::UploadInputs(const fs::path& dir) {
  absl::StatusOr<std::vector<std::map<std::string, fs::path>>> sets = FindInputFiles(dir);
  if (!sets.ok()) return sets.status();
  std::vector<v1::InputTensor> inputs;
  for (size_t sample = 0; sample < sets->size(); ++sample) {
    for (const auto& [name, file] : (*sets)[sample]) {
      absl::StatusOr<v1::Blob> blob = UploadFile(file);
      if (!blob.ok()) return blob.status();
      v1::InputTensor input;
      input.set_sample(static_cast<int32_t>(sample));
      input.set_name(name);
      input.set_sha256(blob->sha256());
      inputs.push_back(std::move(input));
    }
  }
  return inputs;
}

absl::StatusOr<v1::Job> Client::CreateJob(const v1::ModelRef& model, const v1::OptimizationConfig& config,
                                          const std::string& request_id, const std::vector<v1::InputTensor>& inputs) {
  v1::CreateJobRequest request;
  *request.mutable_model() = model;
  *request.mutable_config() = config;
  request.set_request_id(request_id);
  for (const auto& input : inputs) *request.add_inputs() = input;
  return CreateJob(request);
}

absl::StatusOr<v1::Job> Client::CreateJob(const v1::CreateJobRequest& request) {
  v1::Job job;
  auto call = [&](grpc::ClientContext* context) { return stub_->CreateJob(context, request, &job); };
  absl::Status status;
  if (request.request_id().empty()) {  // no id: a lost answer cannot be told from a refusal, so one try
    grpc::ClientContext context;
    Prepare(&context);
    status = Answered(FromGrpc(call(&context)));
  } else {
    status = Retrying(call);
  }
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::Job> Client::GetJob(const std::string& name) {
  v1::GetJobRequest request;
  request.set_name(name);
  v1::Job job;
  absl::Status status = Retrying([&](grpc::ClientContext* context) { return stub_->GetJob(context, request, &job); });
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Client::ListJobs(v1::JobState state, int page_size, const std::string& page_token,
                                                      const std::map<std::string, std::string>& labels) {
  v1::ListJobsRequest request;
  request.set_state(state);
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  for (const auto& [key, value] : labels) (*request.mutable_labels())[key] = value;
  v1::ListJobsResponse response;
  absl::Status status =
      Retrying([&](grpc::ClientContext* context) { return stub_->ListJobs(context, request, &response); });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> Client::CancelJob(const std::string& name) {
  v1::CancelJobRequest request;
  request.set_name(name);
  v1::Job job;
  // Cancelling twice is cancelling once.
  absl::Status status = Retrying([&](grpc::ClientContext* context) { return stub_->CancelJob(context, request, &job); });
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::DeleteJobResponse> Client::DeleteJob(const std::string& name) {
  grpc::ClientContext context;
  Prepare(&context);
  v1::DeleteJobRequest request;
  request.set_name(name);
  v1::DeleteJobResponse response;
  absl::Status status = FromGrpc(stub_->DeleteJob(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> Client::WatchJob(const std::string& name, const std::function<void(const v1::Job&)>& on_event) {
  v1::WatchJobRequest request;
  request.set_name(name);
  v1::Job last;
  RetryState retry;
  while (true) {
    grpc::ClientContext context;
    Prepare(&context);
    auto reader = stub_->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      last = event.job();
      reached_ = true;
      retry = RetryState();  // the server is back: the next break starts the backoff anew
      if (on_event) on_event(last);
    }
    absl::Status status = Answered(FromGrpc(reader->Finish()));
    if (IsFinal(last)) return last;
    // A stream that ended before the job did: the server went away (UNAVAILABLE), or shut down with
    // the stream open (CANCELLED: this client never cancels it) or closed it while draining. Anything
    // else (NOT_FOUND, PERMISSION_DENIED...) is the answer.
    if (!status.ok() && !Restarting(status)) return status;
    if (!Backoff(&retry)) {
      return status.ok() ? absl::DeadlineExceededError(absl::StrCat("the deadline passed while watching ", name))
                         : status;
    }
  }
}

fs::path PartialDownloadPath(const fs::path& path, const std::string& sha256) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  return dir / absl::StrCat(".", path.filename().string(), ".", sha256.substr(0, 16), ".partial");
}

namespace {

// Whether `path` already holds the listed artifact (delivered by an earlier run).
bool AlreadyDownloaded(const fs::path& path, int64_t size, const std::string& digest) {
  std::error_code error;
  if (digest.empty() || static_cast<int64_t>(fs::file_size(path, error)) != size || error) return false;
  absl::StatusOr<std::string> existing = Sha256OfFile(path);
  return existing.ok() && *existing == digest;
}

// Where the download resumes: the bytes an earlier try left in `partial` when the artifact is listed (its
// digest names the file) and they do not exceed its size; else 0, and the file is written afresh.
int64_t ResumeOffsetOfPartial(const fs::path& partial, const std::string& digest, int64_t size) {
  std::error_code error;
  int64_t held =
      !digest.empty() && fs::exists(partial, error) ? static_cast<int64_t>(fs::file_size(partial, error)) : 0;
  if (error || held > size) held = 0;
  return held;
}

}  // namespace

struct Client::DownloadState {
  std::string wanted;  // the artifact's name
  int64_t size = -1;   // -1 until the job's listing or the first chunk says
  std::string digest;  // the artifact's SHA-256; "" until known
  fs::path partial;    // PartialDownloadPath: where the bytes go until verified
  std::ofstream out;   // the partial file
  int64_t held = 0;    // the bytes in it
};

absl::Status Client::DownloadAttempt(const std::string& name, DownloadState* state, RetryState* retry,
                                     const Progress& progress) const {
  grpc::ClientContext context;
  Prepare(&context);
  v1::DownloadRequest request;
  request.set_name(name);
  request.set_artifact(state->wanted);
  request.set_offset(state->held);
  auto reader = stub_->Download(&context, request);
  v1::DownloadChunk chunk;
  bool in_order = true;
  while (reader->Read(&chunk)) {
    if (state->size < 0) {
      state->size = chunk.total_size();
      state->digest = chunk.sha256();
    }
    if (chunk.offset() != state->held || state->held + static_cast<int64_t>(chunk.data().size()) > state->size) {
      in_order = false;
      context.TryCancel();
      break;
    }
    state->out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    state->held += static_cast<int64_t>(chunk.data().size());
    reached_ = true;
    *retry = RetryState();
    if (progress) progress(state->held, state->size);
  }
  absl::Status status = Answered(FromGrpc(reader->Finish()));
  if (!in_order) return absl::DataLossError(absl::StrCat("download of ", state->wanted, ": chunks out of order"));
  state->out.flush();
  if (!state->out) return absl::InternalError(absl::StrCat("cannot write ", state->partial.string()));
  if (status.ok() && state->size < 0) state->size = 0;  // an empty artifact sends no chunk
  if (status.ok() && state->held < state->size) {
    return absl::DataLossError(
        absl::StrCat("download of ", state->wanted, " ended after ", state->held, " of ", state->size, " bytes"));
  }
  // A stream broken by a restart: UNAVAILABLE, or CANCELLED when the server shut down with it open.
  if (!status.ok() && (!Restarting(status) || !Backoff(retry))) return status;
  return absl::OkStatus();
}

absl::Status Client::FinishDownload(DownloadState* state, const fs::path& path) {
  state->out.close();
  absl::StatusOr<std::string> received = Sha256OfFile(state->partial);
  if (!received.ok()) return received.status();
  std::error_code error;
  if (!state->digest.empty() && *received != state->digest) {
    fs::remove(state->partial, error);  // a corrupt copy must not be resumed
    return Failure(absl::StatusCode::kDataLoss, v1::ErrorReason::CHECKSUM_MISMATCH,
                   absl::StrCat("downloaded ", state->wanted, " does not match its SHA-256"));
  }
  fs::rename(state->partial, path, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot move ", state->partial.string(), " to ", path.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status Client::Download(const std::string& name, const std::string& artifact, const fs::path& path,
                              const Progress& progress) {
  // The job's listing gives the artifact's size and SHA-256 before the first byte: the partial file
  // is named by the digest, so bytes of another artifact (another job's model.onnx) never mix in.
  // What the listing leaves out (a failed job's report.json) learns them from its first chunk, and
  // resumes within this call only.
  absl::StatusOr<v1::Job> job = GetJob(name);
  if (!job.ok()) return job.status();
  DownloadState state;
  state.wanted = artifact.empty() ? kModelFileName : artifact;
  for (const auto& entry : job->result().artifacts()) {
    if (entry.name() == state.wanted) {
      state.size = entry.size();
      state.digest = entry.sha256();
    }
  }
  std::error_code error;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), error);
  if (AlreadyDownloaded(path, state.size, state.digest)) return absl::OkStatus();  // delivered by an earlier run
  state.partial = PartialDownloadPath(path, state.digest.empty() ? "unlisted" : state.digest);
  state.held = ResumeOffsetOfPartial(state.partial, state.digest, state.size);
  state.out.open(state.partial, state.held > 0 ? std::ios::binary | std::ios::app : std::ios::binary | std::ios::trunc);
  if (!state.out) return absl::InternalError(absl::StrCat("cannot write ", state.partial.string()));
  RetryState retry;
  while (state.size < 0 || state.held < state.size) {
    absl::Status attempt = DownloadAttempt(name, &state, &retry, progress);
    if (attempt.code() == absl::StatusCode::kDataLoss) {
      // Bytes the server says are bad (ARTIFACT_CORRUPT) or that arrived out of order: nothing to resume.
      state.out.close();
      fs::remove(state.partial, error);
    }
    if (!attempt.ok()) return attempt;
  }
  return FinishDownload(&state, path);
}

absl::StatusOr<v1::Report> Client::GetReport(const std::string& name) {
  v1::GetReportRequest request;
  request.set_name(name);
  v1::Report report;
  absl::Status status = Retrying([&](grpc::ClientContext* context) { return stub_->GetReport(context, request, &report); });
  if (!status.ok()) return status;
  return report;
}

absl::StatusOr<v1::ListPassesResponse> Client::ListPasses() {
  v1::ListPassesResponse response;
  absl::Status status = Retrying(
      [&](grpc::ClientContext* context) { return stub_->ListPasses(context, v1::ListPassesRequest(), &response); });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  v1::ServerInfo response;
  absl::Status status = Retrying(
      [&](grpc::ClientContext* context) { return stub_->GetServerInfo(context, v1::GetServerInfoRequest(), &response); });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<int> Client::CheckHealth(const std::string& service) {
  // grpc.health.v1.Health/Check by hand: HealthCheckRequest{string service = 1} in, and
  // HealthCheckResponse{ServingStatus status = 1} (1 = SERVING) out; Debian ships no stubs for it.
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back(0x0a);  // field 1, length-delimited
    uint64_t length = service.size();
    do {
      request_bytes.push_back(static_cast<char>((length & 0x7f) | (length > 0x7f ? 0x80 : 0)));
      length >>= 7;
    } while (length > 0);
    request_bytes += service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  Prepare(&context);
  grpc::GenericStub stub(channel_);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  absl::Status status = FromGrpc(done.get_future().get());
  if (!status.ok()) return status;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const auto& part : slices) bytes.append(reinterpret_cast<const char*>(part.begin()), part.size());
  // The only field: tag 0x08 (field 1, varint) and the status; absent means UNKNOWN (0).
  return bytes.size() >= 2 && bytes[0] == 0x08 ? static_cast<int>(bytes[1]) : 0;
}

}  // namespace onnxopt::client
