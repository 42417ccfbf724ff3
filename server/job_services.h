// What the parts of a job's life share: the replica's settings (JobManagerOptions), its job store, blob
// stores, metrics and folders. The JobManager owns them and outlives JobAdmission, JobAttempt and
// JobRetention, which hold them as JobServices.
#ifndef ONNXOPT_SERVER_JOB_SERVICES_H_
#define ONNXOPT_SERVER_JOB_SERVICES_H_

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>

#include "server/job_files.h"
#include "server/job_process.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/tenants.h"

namespace onnxopt::server {

struct JobManagerOptions {
  std::filesystem::path data_dir;
  int workers = 2;
  size_t queue_capacity = 64;
  int max_active_jobs_per_tenant = 0;  // queued + running per tenant; 0: only the queue bounds them
  WorkerLimits worker;  // each job runs in an onnxopt-worker child under these limits
  // Scale-out (--role, --replica-id, --worker-device, --lease-seconds, --max-attempts).
  bool run_jobs = true;  // false: an API replica, which stores jobs for others to run
  std::string replica_id = "local";
  WorkerDevice device = WorkerDevice::kAny;
  std::chrono::seconds lease{30};
  int max_attempts = 3;
  // How often an idle worker looks for jobs other replicas queued (jobs queued here wake it at once).
  std::chrono::milliseconds poll{500};
};

struct JobServices {
  const JobManagerOptions& options;
  JobStore* store;
  TenantBlobStores* blobs;
  Metrics* metrics;
  JobFolders folders;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_SERVICES_H_
