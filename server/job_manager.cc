#include "server/job_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "optimizer/failure.h"
#include "server/log.h"

namespace onnxopt::server {
namespace fs = std::filesystem;

JobManager::JobManager(JobManagerOptions options, JobStore* store, TenantBlobStores* blobs, Metrics* metrics)
    : options_(std::move(options)),
      services_{options_, store, blobs, metrics, JobFolders(options_.data_dir)},
      store_(store),
      metrics_(metrics),
      admission_(services_, blob_lock_, draining_, [this] { WakeWorkers(/*all=*/false); }),
      retention_(services_, blob_lock_),
      scrub_(services_, blob_lock_) {}

JobManager::~JobManager() {
  if (!workers_.empty() || lease_thread_.joinable()) Drain(std::chrono::milliseconds(0));
}

fs::path JobManager::OutputDir(const std::string& job_name) const { return services_.folders.Output(job_name); }

absl::StatusOr<v1::Job> JobManager::Submit(const v1::CreateJobRequest& request, const std::string& tenant) {
  return admission_.Submit(request, tenant);
}

absl::StatusOr<v1::DeleteJobResponse> JobManager::Delete(const std::string& name) { return retention_.Delete(name); }

JobManager::Collected JobManager::CollectGarbage(std::chrono::seconds retention, std::chrono::seconds orphan_age) {
  return retention_.CollectGarbage(retention, orphan_age);
}

absl::Status JobManager::Start() {
  std::error_code error;
  fs::create_directories(services_.folders.Sandbox(), error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", services_.folders.Sandbox().string(), ": ", error.message()));
  UpdateQueueMetric();
  if (!options_.run_jobs) {
    // An API replica runs no jobs (nor takes back expired leases: the workers do), but its queue gauge
    // must follow the shared queue: autoscalers and dashboards read it from every pod.
    lease_thread_ = std::thread([this] { LeaseLoop(); });
    return absl::OkStatus();
  }
  // With the embedded store, the jobs an earlier run left RUNNING hold no lease: they go back to the
  // queue now. With a shared store, those of dead replicas whose lease ran out.
  absl::StatusOr<std::vector<v1::Job>> recovered = store_->RecoverExpiredLeases(options_.max_attempts);
  if (!recovered.ok()) return recovered.status();
  for (const v1::Job& job : *recovered) CountRecovered(job);
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
  lease_thread_ = std::thread([this] { LeaseLoop(); });
  return absl::OkStatus();
}

void JobManager::RecoverExpiredLeases() {
  absl::StatusOr<std::vector<v1::Job>> recovered = store_->RecoverExpiredLeases(options_.max_attempts);
  if (!recovered.ok()) {
    Log(LogLevel::kError, absl::StrCat("cannot recover expired leases: ", recovered.status().ToString()));
    return;
  }
  for (const v1::Job& job : *recovered) {
    Log(LogLevel::kWarning, absl::StrCat(job.name(), " lost its lease; it is now ", v1::JobState_Name(job.state())),
        {job.name(), job.tenant()});
    CountRecovered(job);
  }
  if (!recovered->empty()) WakeWorkers(/*all=*/true);
}

void JobManager::CountRecovered(const v1::Job& job) {
  const char* outcome = OutcomeName(job.state());
  metrics_->LeaseExpired(outcome);
  if (IsTerminal(job.state()))
    metrics_->JobFinished(outcome, job.has_error() ? ReasonName(job.error().reason()) : "", 0);
}

void JobManager::WakeWorkers(bool all) {
  {
    std::lock_guard<std::mutex> lock(work_mutex_);
    ++queued_generation_;
  }
  if (all) {
    work_available_.notify_all();
  } else {
    work_available_.notify_one();
  }
}

void JobManager::UpdateQueueMetric() {
  absl::StatusOr<int> queued = store_->QueueLength();
  if (queued.ok()) metrics_->SetQueueLength(*queued);
}

void JobManager::LeaseLoop() {
  // Renewals come several times a lease, so one slow database round does not lose a job; they also
  // bring cancellations asked on other replicas. Expired leases are looked for as often (an indexed
  // query), so a dead replica's job runs again at most a sixth of a lease after its lease ran out.
  const auto renew_every = std::clamp<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.lease) / 6, std::chrono::milliseconds(100),
      std::chrono::milliseconds(5000));
  auto next_recovery = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(work_mutex_);
  while (!lease_wake_.wait_for(lock, renew_every, [this] { return draining_ && running_.load() == 0; })) {
    lock.unlock();
    RenewLeases();
    if (options_.run_jobs && std::chrono::steady_clock::now() >= next_recovery && !draining_) {
      RecoverExpiredLeases();
      next_recovery = std::chrono::steady_clock::now() + renew_every;
    }
    UpdateQueueMetric();
    lock.lock();
  }
}

void JobManager::RenewLeases() {
  std::map<std::string, AttemptFlags> running;
  {
    std::lock_guard<std::mutex> lock(flags_mutex_);
    running = running_jobs_;
  }
  for (const auto& [name, flags] : running) {
    absl::StatusOr<LeaseState> lease = store_->RenewLease(name, flags.token, options_.lease);
    if (!lease.ok()) {
      // The database is away: keep running; if it stays away past the lease, another replica may
      // take the job, and this one's result will not be stored (JobAttempt's fence).
      Log(LogLevel::kWarning, absl::StrCat("cannot renew the lease of ", name, ": ", lease.status().ToString()), {name});
      continue;
    }
    if (!lease->held) {
      Log(LogLevel::kWarning, absl::StrCat("lost the lease of ", name, "; stopping it here"), {name});
      flags.lease_lost->store(true);
      flags.cancel->store(true);
    } else if (lease->cancel_requested) {
      flags.cancel->store(true);
    }
  }
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& name) {
  // One atomic step against claims on any replica: a queued job ends here, a running one is asked
  // to stop (its replica sees that with its next lease renewal, or at once when it is this one).
  bool cancelled_queued = false;
  absl::StatusOr<v1::Job> updated = store_->Modify(
      name,
      [&](v1::Job& job) {
        if (job.state() == v1::QUEUED) {
          SetOutcome(job, Failure(absl::StatusCode::kCancelled, v1::ErrorReason::CANCELLED, "cancelled while queued"),
                     nullptr);
          cancelled_queued = true;
          return true;
        }
        if (job.state() != v1::RUNNING || job.cancel_requested()) return false;
        job.set_cancel_requested(true);
        return true;
      },
      nullptr);
  if (!updated.ok()) return updated;
  if (cancelled_queued) {
    metrics_->JobFinished("cancelled", "CANCELLED", 0);
    UpdateQueueMetric();
    return updated;
  }
  std::lock_guard<std::mutex> lock(flags_mutex_);
  auto running = running_jobs_.find(name);
  if (running != running_jobs_.end()) running->second.cancel->store(true);
  return updated;
}

void JobManager::Drain(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(work_mutex_);
    draining_ = true;
  }
  work_available_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (running_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (running_.load() > 0) {
    interrupting_ = true;
    std::lock_guard<std::mutex> lock(flags_mutex_);
    for (auto& [name, job] : running_jobs_) job.cancel->store(true);
  }
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
  lease_wake_.notify_all();
  if (lease_thread_.joinable()) lease_thread_.join();
}

void JobManager::WorkerLoop() {
  const ClaimRequest request{options_.replica_id, options_.lease, options_.device};
  while (!draining_) {
    uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(work_mutex_);
      generation = queued_generation_;
    }
    ++running_;  // counted from before the claim, so that Drain never misses a job being claimed
    absl::StatusOr<std::optional<v1::Job>> claimed = draining_ ? std::optional<v1::Job>() : store_->Claim(request);
    if (claimed.ok() && claimed->has_value()) {
      metrics_->SetRunning(++busy_);
      UpdateQueueMetric();
      Log(LogLevel::kInfo, absl::StrCat((*claimed)->name(), " started (attempt ", (*claimed)->attempts(), ")"),
          {(*claimed)->name(), (*claimed)->tenant()});
      if ((*claimed)->attempts() == 1) {
        metrics_->JobWaited(google::protobuf::util::TimeUtil::DurationToMilliseconds(
                                (*claimed)->start_time() - (*claimed)->create_time()) / 1000.0);
      }
      RunJob(**claimed);
      metrics_->SetRunning(--busy_);
      --running_;
      continue;
    }
    --running_;
    if (!claimed.ok()) Log(LogLevel::kError, absl::StrCat("cannot claim a job: ", claimed.status().ToString()));
    // Nothing to do: wait for a job queued here since the claim looked, or look again after the poll
    // interval for ones queued on other replicas.
    std::unique_lock<std::mutex> lock(work_mutex_);
    work_available_.wait_for(lock, options_.poll,
                             [&] { return draining_.load() || queued_generation_ != generation; });
  }
}

void JobManager::RunJob(const v1::Job& job) {
  AttemptFlags flags;
  flags.token = LeaseToken(job);
  {
    std::lock_guard<std::mutex> lock(flags_mutex_);
    auto [it, added] = running_jobs_.emplace(job.name(), flags);
    if (!added) {
      // An earlier attempt of this job still runs here: its lease was lost (this replica took the job
      // back from itself after losing the database). It stops, and keeps nothing.
      it->second.lease_lost->store(true);
      it->second.cancel->store(true);
      it->second = flags;
    }
    // Drain may have interrupted the running jobs while this one was being claimed.
    if (job.cancel_requested() || interrupting_) flags.cancel->store(true);
  }
  // The lease is renewed until the job has ended in the store: hashing and publishing a large result
  // can take longer than a lease.
  JobAttempt(services_, job, flags, interrupting_).Run();
  std::lock_guard<std::mutex> lock(flags_mutex_);
  auto it = running_jobs_.find(job.name());
  if (it != running_jobs_.end() && it->second.token == flags.token) running_jobs_.erase(it);
}

}  // namespace onnxopt::server
