// Where jobs live, and the queue workers take them from. Two implementations:
//   - SqliteJobStore: the embedded default for one machine (a file in the data folder);
//   - PostgresJobStore: one database shared by any number of server replicas (--job-store=postgresql://...).
//
// Queueing is the store's: a job is QUEUED from the moment it is stored, and a worker claims the next
// one (highest priority first, FIFO within a priority) under a lease. The worker renews the lease
// while the job runs; a job whose lease expired (its replica died) goes back to the queue, and after
// max_attempts starts it fails with LEASE_EXPIRED. Updates of a running job are fenced: only the lease
// holder's result is ever stored, so no job is completed twice.
#ifndef ONNXOPT_SERVER_JOB_STORE_H_
#define ONNXOPT_SERVER_JOB_STORE_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnxopt/v1/service.pb.h"
#include "server/postgres.h"

namespace onnxopt::server {

bool IsTerminal(v1::JobState state);
// NOT_FOUND (JOB_NOT_FOUND) for `name`: what every lookup of a job the caller cannot have says.
absl::Status JobNotFound(const std::string& name);

// Which jobs a worker takes (--worker-device).
enum class WorkerDevice { kAny, kCuda, kCpu };
absl::StatusOr<WorkerDevice> ParseWorkerDevice(const std::string& text);
// Whether a job asks for the CUDA device (what a kCuda worker takes and a kCpu worker leaves).
bool WantsCuda(const v1::Job& job);
bool MayClaim(WorkerDevice device, const v1::Job& job);

struct ClaimRequest {
  std::string owner;  // the claiming replica's id
  std::chrono::seconds lease{30};
  WorkerDevice device = WorkerDevice::kAny;
};

// What ListJobs asks for: a state (JOB_STATE_UNSPECIFIED: any) and labels every job must carry.
struct JobFilter {
  JobFilter(v1::JobState state = v1::JOB_STATE_UNSPECIFIED) : state(state) {}  // NOLINT: a state is a filter
  v1::JobState state;
  google::protobuf::Map<std::string, std::string> labels;
  bool Matches(const v1::Job& job) const;
};

struct LeaseState {
  bool held = false;              // false: the lease expired and the job was taken back; stop it
  bool cancel_requested = false;  // a CancelJob on any replica asked it to stop
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Stores a new job: QUEUED, unless it comes already ended (a result cache hit); named here unless
  // it has a name (ALREADY_EXISTS if that is taken). With a request id seen before, returns that job
  // and sets *created to false instead.
  virtual absl::StatusOr<v1::Job> Create(v1::Job job, bool* created) = 0;
  virtual absl::StatusOr<v1::Job> Get(const std::string& name) const = 0;
  // Request ids are per tenant: another tenant's id neither finds nor blocks anything.
  virtual std::optional<v1::Job> FindByRequestId(const std::string& tenant, const std::string& request_id) const = 0;
  // Applies `mutate` to the job as stored, atomically: it returns whether it changed anything, and
  // only then is the job written and its watchers woken. Returns the job as it is afterwards
  // (NOT_FOUND for unknown jobs); *applied (when given) says whether `mutate` changed it.
  virtual absl::StatusOr<v1::Job> Modify(const std::string& name, const std::function<bool(v1::Job&)>& mutate,
                                         bool* applied) = 0;
  absl::StatusOr<v1::Job> Update(const std::string& name, const std::function<void(v1::Job&)>& mutate) {
    return Modify(
        name, [&](v1::Job& job) { mutate(job); return true; }, nullptr);
  }

  struct Page {
    std::vector<v1::Job> jobs;
    std::string next_page_token;
  };
  // Newest first; only `tenant`'s jobs when it is set. INVALID_ARGUMENT for a malformed page token.
  virtual absl::StatusOr<Page> List(const JobFilter& filter, int page_size, const std::string& page_token,
                                    const std::optional<std::string>& tenant = std::nullopt) const = 0;

  // Waits until the job changes past `*version` or `deadline` passes; then fills `job` and `*version`.
  // Returns false on timeout with nothing changed. Version 0 is before any change.
  virtual bool WaitForChange(const std::string& name, uint64_t* version,
                             std::chrono::steady_clock::time_point deadline, v1::Job* job) const = 0;

  // Removes a job's record (NOT_FOUND for unknown jobs); watchers of it see it gone.
  virtual absl::Status Delete(const std::string& name) = 0;
  // Every job, oldest first (for retention and blob garbage collection). An error is never an empty
  // list: what garbage collection keeps depends on it.
  virtual absl::StatusOr<std::vector<v1::Job>> All() const = 0;
  // The latest SUCCEEDED job of `tenant` with this cache key (see Job.cache_key).
  virtual std::optional<v1::Job> FindSucceeded(const std::string& tenant, const std::string& cache_key) const = 0;
  // `tenant`'s jobs that are QUEUED or RUNNING.
  virtual absl::StatusOr<int> CountActive(const std::string& tenant) const = 0;

  // The queue. Jobs that are QUEUED.
  virtual absl::StatusOr<int> QueueLength() const = 0;
  // Takes the next QUEUED job `request.device` allows: it becomes RUNNING under a lease of
  // `request.owner` (see MarkClaimed). nullopt when there is none; concurrent claimers, in this
  // process or another replica, never get the same job.
  virtual absl::StatusOr<std::optional<v1::Job>> Claim(const ClaimRequest& request) = 0;
  // Extends the lease `token` (LeaseToken of the job as claimed) holds on a RUNNING job. A later
  // attempt of the same job, even by the same replica, holds another lease.
  virtual absl::StatusOr<LeaseState> RenewLease(const std::string& name, const std::string& token,
                                                std::chrono::seconds lease) = 0;
  // Takes back the RUNNING jobs whose lease expired (see ExpireLease); returns them as they are now.
  virtual absl::StatusOr<std::vector<v1::Job>> RecoverExpiredLeases(int max_attempts) = 0;

  // "sqlite" or "postgresql".
  virtual std::string kind() const = 0;
  // Where the jobs are, for logs ("SQLite at ...", "PostgreSQL database ... on host:port"); no secrets.
  virtual std::string Describe() const = 0;
};

// Opens the store `spec` names: "" or "sqlite" for <data_dir>/jobs.sqlite3, "sqlite:<path>", or a
// libpq connection URI ("postgresql://user@host:5432/db?sslmode=require"; a password is better given
// in PGPASSWORD or ~/.pgpass). INVALID_ARGUMENT for anything else. `connections`: how a PostgreSQL store holds
// the connections it opens for requests (lease renewals have two more of their own, as old at most).
absl::StatusOr<std::unique_ptr<JobStore>> OpenJobStore(const std::string& spec, const std::filesystem::path& data_dir,
                                                       const pg::PoolOptions& connections = {});
// Whether `spec` names a store that replicas share (PostgreSQL), rather than one server's own.
bool IsSharedJobStore(const std::string& spec);

// The time now, to the nanosecond (TimeUtil::GetCurrentTime has whole seconds in this protobuf build;
// jobs need finer times).
google::protobuf::Timestamp TimestampNow();

// What both stores do to a job's record at the queue's transitions.
// A fresh job name, "jobs/<time><random>".
std::string NewJobName();
// What identifies one attempt's lease: "<worker>#<attempt>".
std::string LeaseToken(const v1::Job& job);
// QUEUED -> RUNNING for `owner`: start time, phase LOADING, one more attempt.
void MarkClaimed(v1::Job& job, const std::string& owner);
// A RUNNING job whose lease expired: CANCELLED if cancelling was asked, FAILED (LEASE_EXPIRED) after
// `max_attempts` starts, else QUEUED again.
void ExpireLease(v1::Job& job, int max_attempts);
// Brings a record an earlier version wrote to the current shape: artifacts listed before they had roles
// get theirs from their file names. Both stores call it on every record they read.
void UpgradeRecord(v1::Job& job);
// What is left of a job whose stored record does not parse (written by an older version, or
// damaged): one that had not finished cannot be run again without its request, so it is failed.
v1::Job UnreadableJob(const std::string& name, const std::string& request_id, v1::JobState state,
                      const std::string& tenant);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_STORE_H_
