#include "client/client.h"

#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "optimizer/model_io.h"
#include "optimizer/sha256.h"

namespace onnxopt::client {
namespace fs = std::filesystem;

constexpr int64_t kChunkBytes = 1 << 20;

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<v1::OptimizationConfig> ParseConfigJson(const std::string& json) {
  v1::OptimizationConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &config, options);
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat("CONFIG_INVALID: ", status.message().as_string()));
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

Client::Client(const std::string& address) : Client(address, grpc::InsecureChannelCredentials()) {}

void Client::Authorize(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
}

Client::Client(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(16 << 20);
  channel_ = grpc::CreateCustomChannel(address, std::move(credentials), arguments);
  stub_ = v1::Optimizer::NewStub(channel_);
}

namespace {

// A fresh upload session id: the server keeps each session's partial data apart, and only whoever
// knows the id can resume it.
std::string NewUploadId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  return id;
}

// An upload that broke off (connection lost, server restarting) is resumed this many times.
constexpr int kUploadAttempts = 3;

}  // namespace

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
  for (int attempt = 0; attempt < kUploadAttempts; ++attempt) {
    v1::UploadStatus status;
    {
      grpc::ClientContext context;
      Authorize(&context);
      v1::GetUploadStatusRequest request;
      request.set_sha256(*digest);
      request.set_upload_id(upload_id);
      absl::Status rpc = FromGrpc(stub_->GetUploadStatus(&context, request, &status));
      if (!rpc.ok()) return rpc;
    }
    if (status.complete()) {
      if (progress) progress(total, total);
      return blob;
    }
    int64_t offset = status.committed_size() <= total ? status.committed_size() : 0;  // resume
    std::ifstream in(path, std::ios::binary);
    in.seekg(offset);
    grpc::ClientContext context;
    Authorize(&context);
    v1::Blob response;
    auto writer = stub_->UploadBlob(&context, &response);
    std::string buffer(kChunkBytes, '\0');
    bool first = true;
    do {
      in.read(buffer.data(), kChunkBytes);
      const std::streamsize got = in.gcount();
      v1::UploadBlobRequest chunk;
      if (first) {
        chunk.set_sha256(*digest);
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
    finished = FromGrpc(writer->Finish());
    // Connection lost, or the server still holds the broken stream of this session: wait, resume.
    if (finished.code() != absl::StatusCode::kUnavailable && finished.code() != absl::StatusCode::kAborted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250) * (attempt + 1));
  }
  if (!finished.ok()) return finished;
  return blob;
}

absl::StatusOr<v1::ModelRef> Client::UploadModel(const fs::path& model_path, const Progress& progress) {
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(model_path);
  if (!model.ok()) return absl::Status(model.status().code(), absl::StrCat(model_path.string(), ": ", model.status().message()));
  v1::ModelRef reference;
  reference.set_display_name(model_path.filename().string());
  const fs::path folder = model_path.has_parent_path() ? model_path.parent_path() : fs::path(".");
  for (const std::string& location : ExternalDataLocations(*model)) {
    // Only regular files inside the model's folder go up: a link could point anywhere (/etc/passwd).
    std::error_code error;
    if (fs::is_symlink(fs::symlink_status(folder / location, error))) {
      return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_PATH: the model's external data '", location,
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
    return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: ", dir.string(), " is not a folder"));
  }
  // The tensor's own name, else the stem of a file given directly.
  auto input_name = [](const fs::path& file, bool stem_allowed) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> bytes = ReadFile(file);
    if (!bytes.ok()) return bytes.status();
    onnx::TensorProto tensor;
    if (!tensor.ParseFromString(*bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: ", file.string(), " is not an ONNX TensorProto"));
    }
    if (!tensor.name().empty()) return tensor.name();
    if (stem_allowed) return file.stem().string();
    return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: the tensor in ", file.string(),
                                                   " has no name, so it matches no input"));
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
    return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: no .pb tensors in ", dir.string(),
                                                   " (nor test_data_set_N/input_K.pb)"));
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
  grpc::ClientContext context;
  Authorize(&context);
  v1::CreateJobRequest request;
  *request.mutable_model() = model;
  *request.mutable_config() = config;
  request.set_request_id(request_id);
  for (const auto& input : inputs) *request.add_inputs() = input;
  v1::Job job;
  absl::Status status = FromGrpc(stub_->CreateJob(&context, request, &job));
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::Job> Client::GetJob(const std::string& name) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::GetJobRequest request;
  request.set_name(name);
  v1::Job job;
  absl::Status status = FromGrpc(stub_->GetJob(&context, request, &job));
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Client::ListJobs(v1::JobState state, int page_size, const std::string& page_token) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::ListJobsRequest request;
  request.set_state(state);
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  v1::ListJobsResponse response;
  absl::Status status = FromGrpc(stub_->ListJobs(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> Client::CancelJob(const std::string& name) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::CancelJobRequest request;
  request.set_name(name);
  v1::Job job;
  absl::Status status = FromGrpc(stub_->CancelJob(&context, request, &job));
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::DeleteJobResponse> Client::DeleteJob(const std::string& name) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::DeleteJobRequest request;
  request.set_name(name);
  v1::DeleteJobResponse response;
  absl::Status status = FromGrpc(stub_->DeleteJob(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> Client::WatchJob(const std::string& name, const std::function<void(const v1::Job&)>& on_event) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::WatchJobRequest request;
  request.set_name(name);
  auto reader = stub_->WatchJob(&context, request);
  v1::JobEvent event;
  v1::Job last;
  while (reader->Read(&event)) {
    last = event.job();
    if (on_event) on_event(last);
  }
  absl::Status status = FromGrpc(reader->Finish());
  if (!status.ok()) return status;
  if (last.name().empty()) return absl::UnavailableError("the watch ended without any event");
  return last;
}

absl::Status Client::Download(const std::string& name, const std::string& artifact, const fs::path& path) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::DownloadRequest request;
  request.set_name(name);
  request.set_artifact(artifact);
  auto reader = stub_->Download(&context, request);
  v1::DownloadChunk chunk;
  std::string data;
  std::string expected_digest;
  int64_t total = -1;
  while (reader->Read(&chunk)) {
    if (total < 0) {
      total = chunk.total_size();
      expected_digest = chunk.sha256();
      data.reserve(static_cast<size_t>(total));
    }
    if (chunk.offset() != static_cast<int64_t>(data.size())) return absl::DataLossError("download chunks out of order");
    data.append(chunk.data());
  }
  absl::Status status = FromGrpc(reader->Finish());
  if (!status.ok()) return status;
  if (total >= 0 && static_cast<int64_t>(data.size()) != total) {
    return absl::DataLossError(absl::StrCat("download of ", artifact, " ended after ", data.size(), " of ", total, " bytes"));
  }
  if (!expected_digest.empty() && Sha256OfBytes(data) != expected_digest) {
    return absl::DataLossError(absl::StrCat("CHECKSUM_MISMATCH: downloaded ", artifact, " does not match its SHA-256"));
  }
  return WriteFileAtomically(path, data);
}

absl::StatusOr<v1::Report> Client::GetReport(const std::string& name) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::GetReportRequest request;
  request.set_name(name);
  v1::Report report;
  absl::Status status = FromGrpc(stub_->GetReport(&context, request, &report));
  if (!status.ok()) return status;
  return report;
}

absl::StatusOr<v1::ListPassesResponse> Client::ListPasses() {
  grpc::ClientContext context;
  Authorize(&context);
  v1::ListPassesResponse response;
  absl::Status status = FromGrpc(stub_->ListPasses(&context, v1::ListPassesRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  grpc::ClientContext context;
  Authorize(&context);
  v1::ServerInfo response;
  absl::Status status = FromGrpc(stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

}  // namespace onnxopt::client
