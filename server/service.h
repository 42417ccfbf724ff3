// The onnxopt.v1.Optimizer gRPC service: thin handlers that authenticate the caller, check requests,
// call the caller's blob store and the job manager, and turn absl::Status into gRPC status. Every
// handler works within the caller's tenant (see tenants.h). No handler lets an exception out.
#ifndef ONNXOPT_SERVER_SERVICE_H_
#define ONNXOPT_SERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "onnxopt/v1/service.grpc.pb.h"
#include "server/blob_store.h"
#include "server/job_manager.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/tenants.h"

namespace onnxopt::server {

class OptimizerService final : public v1::Optimizer::Service {
 public:
  OptimizerService(TenantBlobStores* blobs, JobStore* store, JobManager* jobs, Metrics* metrics,
                   const Authenticator* auth)
      : blobs_(blobs), store_(store), jobs_(jobs), metrics_(metrics), auth_(auth) {}

  grpc::Status UploadBlob(grpc::ServerContext* context, grpc::ServerReader<v1::UploadBlobRequest>* reader,
                          v1::Blob* response) override;
  grpc::Status GetUploadStatus(grpc::ServerContext* context, const v1::GetUploadStatusRequest* request,
                               v1::UploadStatus* response) override;
  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request, v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request, v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status Download(grpc::ServerContext* context, const v1::DownloadRequest* request,
                        grpc::ServerWriter<v1::DownloadChunk>* writer) override;
  grpc::Status GetReport(grpc::ServerContext* context, const v1::GetReportRequest* request, v1::Report* response) override;
  grpc::Status ListPasses(grpc::ServerContext* context, const v1::ListPassesRequest* request,
                          v1::ListPassesResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

 private:
  grpc::Status UploadBlobImpl(grpc::ServerContext* context, grpc::ServerReader<v1::UploadBlobRequest>* reader,
                              v1::Blob* response);
  grpc::Status DownloadImpl(grpc::ServerContext* context, const v1::DownloadRequest* request,
                            grpc::ServerWriter<v1::DownloadChunk>* writer);
  // An artifact a download may fetch: listed by the job (or its report) and not marked corrupt.
  struct ServedArtifact {
    std::string name;
    std::string sha256;  // recorded; empty for a failed job's report
    std::filesystem::path path;
  };
  absl::StatusOr<ServedArtifact> ArtifactToServe(const v1::Job& job, const std::string& name) const;
  // Streams `served` from `offset`; a whole read whose bytes miss the digest marks it and ends DATA_LOSS.
  grpc::Status StreamArtifact(grpc::ServerContext* context, const std::string& job_name, const ServedArtifact& served,
                              std::ifstream& in, int64_t offset, int64_t total,
                              grpc::ServerWriter<v1::DownloadChunk>* writer);
  // The caller, from the request's "authorization" metadata (UNAUTHENTICATED without a valid token
  // when authentication is on).
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContext* context) const;
  // The job `name` if the caller may see it (UNAUTHENTICATED as CallerOf); another tenant's job answers
  // exactly like a name that does not exist.
  // kOwner (cancel, delete): PERMISSION_DENIED for an admin's call on another tenant's job.
  enum class Access { kRead, kOwner };
  absl::StatusOr<v1::Job> CallersJob(const grpc::ServerContext* context, const std::string& name,
                                     Access access = Access::kRead) const;

  TenantBlobStores* const blobs_;
  JobStore* const store_;
  JobManager* const jobs_;
  Metrics* const metrics_;
  const Authenticator* const auth_;
};

grpc::Status ToGrpc(const absl::Status& status);

inline constexpr int64_t kChunkBytes = 1 << 20;

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_SERVICE_H_
