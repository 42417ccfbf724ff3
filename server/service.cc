#include "server/service.h"

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "onnx/common/version.h"
#include "optimizer/config_enums.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_catalog.h"
#include "optimizer/pass_registry.h"
#include "optimizer/result_files.h"
#include "optimizer/sha256.h"
#include "optimizer/utf8.h"
#include "server/job_labels.h"
#include "server/log.h"

namespace onnxopt::server {
namespace fs = std::filesystem;

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Messages may quote a model's bytes; clients expect text.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), ValidUtf8(status.message()));
}

namespace {

// Runs a handler body so that no exception crosses into gRPC.
template <typename Body>
grpc::Status Guarded(Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("INTERNAL: ", e.what()));
  } catch (...) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "INTERNAL: unexpected error");
  }
}

grpc::Status Respond(const absl::StatusOr<v1::Job>& job, v1::Job* response) {
  if (!job.ok()) return ToGrpc(job.status());
  *response = *job;
  return grpc::Status::OK;
}

}  // namespace

absl::StatusOr<Caller> OptimizerService::CallerOf(const grpc::ServerContext* context) const {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  std::optional<absl::string_view> header;
  if (it != metadata.end()) header = absl::string_view(it->second.data(), it->second.size());
  return auth_->Authenticate(header);
}

absl::StatusOr<v1::Job> OptimizerService::CallersJob(const grpc::ServerContext* context, const std::string& name,
                                                     Access access) const {
  absl::StatusOr<Caller> caller = CallerOf(context);
  if (!caller.ok()) return caller.status();
  absl::StatusOr<v1::Job> job = store_->Get(name);
  if (job.ok() && !caller->MaySee(job->tenant())) return JobNotFound(name);
  if (job.ok() && access == Access::kOwner && job->tenant() != caller->tenant) {
    return Failure(absl::StatusCode::kPermissionDenied, v1::ErrorReason::NOT_OWNER,
                   absl::StrCat(name,
                                " belongs to another tenant; admin tokens read every tenant's jobs, only the owner "
                                "cancels or deletes them"));
  }
  return job;
}

grpc::Status OptimizerService::UploadBlob(grpc::ServerContext* context, grpc::ServerReader<v1::UploadBlobRequest>* reader,
                                          v1::Blob* response) {
  return Guarded([&] { return UploadBlobImpl(context, reader, response); });
}

grpc::Status OptimizerService::UploadBlobImpl(grpc::ServerContext* context,
                                              grpc::ServerReader<v1::UploadBlobRequest>* reader, v1::Blob* response) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  if (!caller.ok()) return ToGrpc(caller.status());
  absl::StatusOr<BlobStore*> blobs = blobs_->For(caller->tenant);
  if (!blobs.ok()) return ToGrpc(blobs.status());
  if (jobs_->draining()) {
    return ToGrpc(Failure(absl::StatusCode::kUnavailable, v1::ErrorReason::DRAINING, "the server is shutting down"));
  }
  v1::UploadBlobRequest message;
  if (!reader->Read(&message)) {
    return ToGrpc(
        Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EMPTY_UPLOAD, "the stream had no message"));
  }
  const std::string sha256 = message.sha256();
  const int64_t total_size = message.total_size();
  response->set_sha256(sha256);
  if ((*blobs)->Exists(sha256)) {  // content-addressed: nothing more to receive
    (*blobs)->Touch(sha256);       // about to be used: not garbage for another grace period
    response->set_size((*blobs)->CommittedSize(sha256, ""));
    return grpc::Status::OK;
  }
  absl::StatusOr<std::unique_ptr<BlobUpload>> upload = (*blobs)->BeginUpload(sha256, total_size, message.upload_id());
  if (!upload.ok()) return ToGrpc(upload.status());
  do {
    if (context->IsCancelled()) {
      return ToGrpc(Failure(absl::StatusCode::kCancelled, v1::ErrorReason::CANCELLED, "the client went away"));
    }
    if (!message.sha256().empty() && message.sha256() != sha256) {
      return ToGrpc(Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::DIGEST_CHANGED,
                            "every message of one upload must name the same sha256"));
    }
    if (!message.data().empty()) {
      absl::Status appended = (*upload)->Append(message.offset(), message.data());
      if (!appended.ok()) return ToGrpc(appended);
      metrics_->UploadBytes(static_cast<double>(message.data().size()));
    }
    if (message.finish_write()) {
      absl::Status finished = (*upload)->Finish();
      if (!finished.ok()) return ToGrpc(finished);
      response->set_size(total_size);
      return grpc::Status::OK;
    }
  } while (reader->Read(&message));
  return ToGrpc(Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::UPLOAD_INCOMPLETE,
                        absl::StrCat("the stream ended without finish_write after ", (*upload)->committed_size(),
                                     " of ", total_size, " bytes; resume from GetUploadStatus.committed_size")));
}

grpc::Status OptimizerService::GetUploadStatus(grpc::ServerContext* context, const v1::GetUploadStatusRequest* request,
                                               v1::UploadStatus* response) {
  return Guarded([&] {
    absl::StatusOr<Caller> caller = CallerOf(context);
    if (!caller.ok()) return ToGrpc(caller.status());
    absl::StatusOr<BlobStore*> blobs = blobs_->For(caller->tenant);
    if (!blobs.ok()) return ToGrpc(blobs.status());
    if (!IsValidSha256(request->sha256())) {
      return ToGrpc(Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_DIGEST,
                            "sha256 must be 64 lowercase hexadecimal digits"));
    }
    if (absl::Status id = CheckUploadId(request->upload_id()); !id.ok()) return ToGrpc(id);
    response->set_sha256(request->sha256());
    response->set_complete((*blobs)->Exists(request->sha256()));
    if (response->complete()) (*blobs)->Touch(request->sha256());  // a client about to use it skips the upload
    response->set_committed_size((*blobs)->CommittedSize(request->sha256(), request->upload_id()));
    return grpc::Status::OK;
  });
}

grpc::Status OptimizerService::CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                                         v1::Job* response) {
  return Guarded([&] {
    absl::StatusOr<Caller> caller = CallerOf(context);
    if (!caller.ok()) return ToGrpc(caller.status());
    v1::CreateJobRequest current = *request;
    if (absl::Status upgraded = UpgradeLegacyConfig(*current.mutable_config()); !upgraded.ok()) {
      return ToGrpc(Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::CONFIG_INVALID, upgraded.message()));
    }
    return Respond(jobs_->Submit(current, caller->tenant), response);
  });
}

grpc::Status OptimizerService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request, v1::Job* response) {
  return Guarded([&] { return Respond(CallersJob(context, request->name()), response); });
}

grpc::Status OptimizerService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                        v1::ListJobsResponse* response) {
  return Guarded([&] {
    absl::StatusOr<Caller> caller = CallerOf(context);
    if (!caller.ok()) return ToGrpc(caller.status());
    if (request->page_size() < 0) {
      return ToGrpc(
          Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_PAGE_SIZE, "page_size must be >= 0"));
    }
    if (!v1::JobState_IsValid(request->state())) {
      return ToGrpc(Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_STATE, "unknown state"));
    }
    if (absl::Status labels = ValidateLabels(request->labels(), "label filter"); !labels.ok()) return ToGrpc(labels);
    JobFilter filter(request->state());
    filter.labels = request->labels();
    // Admins see every tenant's jobs; everyone else their own.
    auto page = store_->List(filter, request->page_size(), request->page_token(),
                             caller->admin ? std::nullopt : std::optional<std::string>(caller->tenant));
    if (!page.ok()) return ToGrpc(page.status());
    for (auto& job : page->jobs) *response->add_jobs() = std::move(job);
    response->set_next_page_token(page->next_page_token);
    return grpc::Status::OK;
  });
}

grpc::Status OptimizerService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                        grpc::ServerWriter<v1::JobEvent>* writer) {
  return Guarded([&] {
    absl::StatusOr<v1::Job> job = CallersJob(context, request->name());
    if (!job.ok()) return ToGrpc(job.status());
    uint64_t version = 0;
    v1::JobEvent event;
    *event.mutable_job() = *job;
    // The first event is the job as it is; `version` 0 may repeat it once, which watchers tolerate.
    while (true) {
      if (!writer->Write(event)) return grpc::Status::OK;  // the client went away
      if (IsTerminal(event.job().state())) return grpc::Status::OK;
      v1::Job changed;
      while (!store_->WaitForChange(request->name(), &version,
                                    std::chrono::steady_clock::now() + std::chrono::milliseconds(500), &changed)) {
        if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED: watch cancelled");
        if (absl::StatusOr<v1::Job> still = store_->Get(request->name()); !still.ok()) return ToGrpc(still.status());
      }
      *event.mutable_job() = changed;
    }
  });
}

grpc::Status OptimizerService::CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                                         v1::Job* response) {
  return Guarded([&] {
    absl::StatusOr<v1::Job> job = CallersJob(context, request->name(), Access::kOwner);
    if (!job.ok()) return ToGrpc(job.status());
    return Respond(jobs_->Cancel(request->name()), response);
  });
}

grpc::Status OptimizerService::DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                                         v1::DeleteJobResponse* response) {
  return Guarded([&] {
    absl::StatusOr<v1::Job> job = CallersJob(context, request->name(), Access::kOwner);
    if (!job.ok()) return ToGrpc(job.status());
    absl::StatusOr<v1::DeleteJobResponse> deleted = jobs_->Delete(request->name());
    if (!deleted.ok()) return ToGrpc(deleted.status());
    *response = *deleted;
    return grpc::Status::OK;
  });
}

grpc::Status OptimizerService::Download(grpc::ServerContext* context, const v1::DownloadRequest* request,
                                        grpc::ServerWriter<v1::DownloadChunk>* writer) {
  return Guarded([&] { return DownloadImpl(context, request, writer); });
}

namespace {

absl::Status ArtifactCorrupt(const std::string& job_name, const std::string& artifact) {
  return Failure(absl::StatusCode::kDataLoss, v1::ErrorReason::ARTIFACT_CORRUPT,
                 absl::StrCat("the server's copy of ", job_name, "/", artifact,
                              " no longer matches its SHA-256; it is not served (submit the model again)"));
}

}  // namespace

absl::StatusOr<OptimizerService::ServedArtifact> OptimizerService::ArtifactToServe(const v1::Job& job,
                                                                                  const std::string& name) const {
  ServedArtifact served{name, "", jobs_->OutputDir(job.name()) / name};
  // Only files the job lists (or its report, which failed jobs keep too) can be fetched.
  bool listed = false;
  for (const auto& entry : job.result().artifacts()) {
    if (entry.name() != name) continue;
    if (entry.corrupt()) return ArtifactCorrupt(job.name(), name);
    listed = true;
    served.sha256 = entry.sha256();
  }
  std::error_code error;
  if (listed || (name == kReportFileName && IsTerminal(job.state()) && fs::exists(served.path, error))) return served;
  if (!IsTerminal(job.state())) {
    return Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::JOB_NOT_DONE,
                   absl::StrCat(job.name(), " is ", v1::JobState_Name(job.state()), "; wait for it to finish"));
  }
  return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::ARTIFACT_NOT_FOUND,
                 absl::StrCat(job.name(), " has no artifact '", name, "'"));
}

grpc::Status OptimizerService::DownloadImpl(grpc::ServerContext* context, const v1::DownloadRequest* request,
                                            grpc::ServerWriter<v1::DownloadChunk>* writer) {
  absl::StatusOr<v1::Job> job = CallersJob(context, request->name());
  if (!job.ok()) return ToGrpc(job.status());
  absl::StatusOr<ServedArtifact> served =
      ArtifactToServe(*job, request->artifact().empty() ? kModelFileName : request->artifact());
  if (!served.ok()) return ToGrpc(served.status());
  std::ifstream in(served->path, std::ios::binary);
  if (!in) {
    return ToGrpc(Failure(absl::StatusCode::kNotFound, v1::ErrorReason::ARTIFACT_NOT_FOUND,
                          absl::StrCat("'", served->name, "' is gone from disk")));
  }
  std::error_code error;
  const int64_t total = static_cast<int64_t>(fs::file_size(served->path, error));
  if (request->offset() < 0 || request->offset() > total) {
    return ToGrpc(Failure(absl::StatusCode::kOutOfRange, v1::ErrorReason::BAD_OFFSET,
                          absl::StrCat("offset must be within 0..", total)));
  }
  in.seekg(request->offset());
  return StreamArtifact(context, job->name(), *served, in, request->offset(), total, writer);
}

grpc::Status OptimizerService::StreamArtifact(grpc::ServerContext* context, const std::string& job_name,
                                              const ServedArtifact& served, std::ifstream& in, int64_t offset,
                                              int64_t total, grpc::ServerWriter<v1::DownloadChunk>* writer) {
  // Read whole, the bytes are checked against the recorded digest as they go: a copy that rotted since
  // the last scrub ends the stream with DATA_LOSS (the client discards it too) and is marked.
  const bool whole = offset == 0 && !served.sha256.empty();
  Sha256 streamed;
  std::string buffer(kChunkBytes, '\0');
  bool first = true;
  do {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED: client went away");
    in.read(buffer.data(), kChunkBytes);
    const std::streamsize got = in.gcount();
    if (whole) streamed.Update(buffer.data(), static_cast<size_t>(got));
    v1::DownloadChunk chunk;
    chunk.set_offset(offset);
    chunk.set_data(buffer.data(), static_cast<size_t>(got));
    chunk.set_total_size(total);
    if (first) chunk.set_sha256(served.sha256);
    first = false;
    if (!writer->Write(chunk)) return grpc::Status::OK;
    offset += got;
  } while (offset < total && in);
  if (!whole || streamed.HexDigest() == served.sha256) return grpc::Status::OK;
  if (absl::Status marked = jobs_->MarkArtifactCorrupt(job_name, served.name); !marked.ok()) {
    Log(LogLevel::kError, absl::StrCat("cannot mark ", job_name, "/", served.name, " corrupt: ", marked.ToString()));
  }
  return ToGrpc(ArtifactCorrupt(job_name, served.name));
}

grpc::Status OptimizerService::GetReport(grpc::ServerContext* context, const v1::GetReportRequest* request,
                                         v1::Report* response) {
  return Guarded([&] {
    absl::StatusOr<v1::Job> job = CallersJob(context, request->name());
    if (!job.ok()) return ToGrpc(job.status());
    if (!IsTerminal(job->state())) {
      return ToGrpc(Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::JOB_NOT_DONE,
                            absl::StrCat(job->name(), " is ", v1::JobState_Name(job->state()))));
    }
    absl::StatusOr<std::string> bytes = ReadFile(jobs_->OutputDir(job->name()) / kReportProtoName);
    if (!bytes.ok() || !response->ParseFromString(*bytes)) {
      return ToGrpc(Failure(absl::StatusCode::kNotFound, v1::ErrorReason::REPORT_NOT_FOUND,
                            absl::StrCat(job->name(), " ended before it had a report")));
    }
    return grpc::Status::OK;
  });
}

grpc::Status OptimizerService::ListPasses(grpc::ServerContext* context, const v1::ListPassesRequest*,
                                          v1::ListPassesResponse* response) {
  return Guarded([&] {
    if (absl::StatusOr<Caller> caller = CallerOf(context); !caller.ok()) return ToGrpc(caller.status());
    *response = DescribePasses(DefaultPassRegistry());
    return grpc::Status::OK;
  });
}

grpc::Status OptimizerService::GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest*,
                                             v1::ServerInfo* response) {
  return Guarded([&] {
    if (absl::StatusOr<Caller> caller = CallerOf(context); !caller.ok()) return ToGrpc(caller.status());
    response->set_version(kOptimizerVersion);
    response->set_onnxruntime_version(OrtVersion());
    for (const auto& provider : OrtAvailableProviders()) response->add_execution_providers(provider);
    for (const ProviderStatus& provider : ProviderStatuses()) {
      v1::ProviderStatus* status = response->add_providers();
      status->set_name(provider.name);
      status->set_usable(provider.usable);
      status->set_reason(ValidUtf8(provider.reason));
    }
    response->set_onnx_version(onnx::LAST_RELEASE_VERSION);
    response->set_max_opset(kMaxCheckedOpset);
    response->set_workers(jobs_->options().run_jobs ? jobs_->options().workers : 0);
    response->set_replica_id(jobs_->options().replica_id);
    response->set_role(jobs_->options().run_jobs ? "all" : "api");
    response->set_job_store(store_->kind());
    response->set_queue_capacity(static_cast<int32_t>(jobs_->options().queue_capacity));
    absl::StatusOr<BlobStore*> blobs = blobs_->For("");
    if (blobs.ok()) response->set_max_upload_bytes((*blobs)->max_blob_bytes());
    response->set_draining(jobs_->draining());
    return grpc::Status::OK;
  });
}

}  // namespace onnxopt::server
