#include "server/job_attempt.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "optimizer/failure.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/result_files.h"
#include "optimizer/sha256.h"
#include "optimizer/utf8.h"
#include "server/job_outcome.h"
#include "server/log.h"
#include "server/worker_protocol.h"

namespace onnxopt::server {
namespace fs = std::filesystem;
namespace {

v1::JobPhase ToProto(Phase phase) {
  switch (phase) {
    case Phase::kLoading: return v1::PHASE_LOADING;
    case Phase::kOptimizing: return v1::PHASE_OPTIMIZING;
    case Phase::kSaving: return v1::PHASE_SAVING;
    case Phase::kValidating: return v1::PHASE_VALIDATING;
    case Phase::kBenchmarking: return v1::PHASE_BENCHMARKING;
  }
  return v1::PHASE_UNSPECIFIED;
}

// Whether `stored` is still the attempt the lease `token` (LeaseToken at the claim) holds.
bool Holds(const v1::Job& stored, const std::string& token) {
  return stored.state() == v1::RUNNING && LeaseToken(stored) == token;
}

}  // namespace

JobAttempt::JobAttempt(const JobServices& services, v1::Job job, AttemptFlags flags,
                       const std::atomic<bool>& interrupting)
    : services_(services),
      job_(std::move(job)),
      flags_(std::move(flags)),
      interrupting_(interrupting),
      // Each attempt works in a folder of its own: a replica that lost the job (and may still be
      // writing) never shares files with the one that took it over. Only the output is published.
      attempt_dir_(services_.folders.Attempt(job_.name(), job_.attempts())),
      input_dir_(attempt_dir_ / "input"),
      output_dir_(attempt_dir_ / "output") {}

void JobAttempt::Run() {
  static constexpr Next (JobAttempt::*kStages[])() = {
      &JobAttempt::StageInputs,   &JobAttempt::Work,  &JobAttempt::Keep,    &JobAttempt::IngestReport,
      &JobAttempt::HashArtifacts, &JobAttempt::Fence, &JobAttempt::Publish, &JobAttempt::Finish};
  for (const auto stage : kStages) {
    if ((this->*stage)() == Next::kStop) break;
  }
  RemoveAttemptFolder();
}

JobAttempt::Next JobAttempt::StageInputs() {
  RemoveAttemptFolder();
  std::error_code ignored;
  fs::create_directories(output_dir_, ignored);
  outcome_ = PrepareInputs();
  if (outcome_.ok()) outcome_ = WriteFileAtomically(attempt_dir_ / "config.pb", job_.config().SerializeAsString());
  return Next::kGoOn;
}

absl::Status JobAttempt::PrepareInputs() const {
  // Every staged file with the digest its blob must still have; the worker checks them first.
  std::vector<FileDigest> digests = {{job_.model().sha256(), kStagedModelName}};
  absl::StatusOr<BlobStore*> blobs = services_.blobs->For(job_.tenant());
  if (!blobs.ok()) return blobs.status();
  // A blob can go after the job was accepted: deleted with the last other job using it, on a replica
  // whose DeleteJob ran while this job was being submitted on another.
  absl::Status status = BlobsPresent(job_, **blobs, " after the job was accepted; upload it and submit again");
  if (status.ok()) status = LinkOrCopy((*blobs)->PathOf(job_.model().sha256()), input_dir_ / kStagedModelName);
  for (const auto& file : job_.model().external_data()) {
    if (!status.ok()) break;
    status = LinkOrCopy((*blobs)->PathOf(file.sha256()), input_dir_ / file.name());
    digests.push_back({file.sha256(), file.name()});
  }
  // Supplied inputs: tensors under inputs/, named by position, and a manifest the worker reads.
  std::vector<SuppliedInputFile> files;
  for (int i = 0; i < job_.inputs_size() && status.ok(); ++i) {
    const v1::InputTensor& input = job_.inputs(i);
    const std::string file = absl::StrCat(i, ".pb");
    status = LinkOrCopy((*blobs)->PathOf(input.sha256()), input_dir_ / kStagedInputsFolder / file);
    files.push_back({input.sample(), input.name(), file});
    digests.push_back({input.sha256(), absl::StrCat(kStagedInputsFolder, "/", file)});
  }
  if (status.ok() && !files.empty()) status = WriteFileAtomically(InputManifest(), FormatInputManifest(files));
  if (status.ok()) status = WriteFileAtomically(DigestManifest(), FormatDigestManifest(digests));
  return status;
}

JobAttempt::Next JobAttempt::Work() {
  if (outcome_.ok()) {
    WorkerJob work;
    work.job_dir = attempt_dir_;
    work.model = input_dir_ / kStagedModelName;
    work.output_dir = output_dir_;
    work.config = attempt_dir_ / "config.pb";
    work.inputs = job_.inputs().empty() ? fs::path() : InputManifest();
    work.digests = DigestManifest();
    work.name = job_.name();
    outcome_ = RunWorkerProcess(services_.options.worker, work, *flags_.cancel, [&](const WorkerLine& line) {
      ModifyIfHeld([&](v1::Job& job) {
        v1::JobProgress* progress = job.mutable_progress();
        progress->set_phase(ToProto(line.phase));
        progress->set_current_pass(line.pass);
        progress->set_passes_done(line.done);
        progress->set_passes_total(line.total);
      });
    });
  }
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return Next::kGoOn;
}

JobAttempt::Next JobAttempt::Keep() {
  if (flags_.lease_lost->load()) {
    // Another replica has the job now (or will): nothing of this attempt is kept.
    Log(LogLevel::kWarning, absl::StrCat(job_.name(), " attempt ", job_.attempts(), " dropped: its lease was lost"),
        {job_.name(), job_.tenant()});
    return Next::kStop;
  }
  if (ReasonOf(outcome_) == v1::ErrorReason::BLOB_CORRUPT) RemoveCorruptBlobs();
  if (outcome_.code() == absl::StatusCode::kCancelled && interrupting_) {
    Requeue();
    return Next::kStop;
  }
  return Next::kGoOn;
}

void JobAttempt::Requeue() {
  // Shutdown, not the user: back to the queue, to run again at the next start or on another replica.
  // The attempt does not count against --max-attempts.
  RemoveAttemptFolder();
  ModifyIfHeld([&](v1::Job& job) {
    if (job.cancel_requested()) {
      SetOutcome(
          job,
          Failure(absl::StatusCode::kCancelled, v1::ErrorReason::CANCELLED, "cancelled while the server shut down"),
          nullptr);
      return;
    }
    job.set_state(v1::QUEUED);
    job.clear_progress();
    job.clear_start_time();
    job.clear_worker();
    job.set_attempts(std::max(0, job.attempts() - 1));
  });
}

JobAttempt::Next JobAttempt::IngestReport() {
  // The worker leaves a report (partial when it failed) unless it crashed before writing one. A job
  // that succeeded without a report that parses has nothing trustworthy to publish: it fails.
  absl::StatusOr<std::string> bytes = ReadFile(output_dir_ / kReportProtoName);
  if (bytes.ok() && !report_.ParseFromString(*bytes)) {
    report_.Clear();
    if (outcome_.ok())
      outcome_ = Failure(absl::StatusCode::kInternal, v1::ErrorReason::WORKER_REPORT_CORRUPT,
                         "the worker's report does not parse");
  } else if (!bytes.ok() && outcome_.ok()) {
    outcome_ = Failure(absl::StatusCode::kInternal, v1::ErrorReason::WORKER_REPORT_MISSING,
                       "the worker succeeded without writing its report");
  }
  report_.set_job(job_.name());
  *report_.mutable_time() = TimestampNow();
  absl::Status written = WriteReport(report_, output_dir_);
  if (outcome_.ok()) outcome_ = written;
  return Next::kGoOn;
}

JobAttempt::Next JobAttempt::HashArtifacts() {
  std::error_code ignored;
  for (const ResultFileEntry& artifact : kResultFiles) {
    if (!outcome_.ok()) break;
    const fs::path file = output_dir_ / artifact.name;
    if (!fs::exists(file, ignored)) continue;
    absl::StatusOr<std::string> digest = Sha256OfFile(file);
    if (!digest.ok()) {
      outcome_ = digest.status();
      break;
    }
    v1::Artifact* entry = result_.add_artifacts();
    entry->set_name(artifact.name);
    entry->set_role(artifact.role);
    entry->set_size(static_cast<int64_t>(fs::file_size(file, ignored)));
    entry->set_sha256(*digest);
  }
  result_.set_nodes_before(report_.original().nodes());
  result_.set_nodes_after(report_.optimized().nodes());
  result_.set_parity_passed(!report_.parity().skipped() && report_.parity().passed());
  result_.set_speedup(report_.benchmark().speedup());
  result_.set_returned_original(report_.returned_original());
  for (const auto& excluded : report_.parity().bisection().excluded_passes()) result_.add_excluded_passes(excluded);
  return Next::kGoOn;
}

JobAttempt::Next JobAttempt::Fence() {
  // Published only while this attempt holds the job, then ended under the same fence. When the store
  // cannot say, the result is dropped: the lease runs out and the job runs again.
  absl::StatusOr<LeaseState> lease = absl::UnavailableError("not asked");
  for (int tries = 0; tries < 3 && !lease.ok(); ++tries) {
    if (tries > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    lease = services_.store->RenewLease(job_.name(), flags_.token, services_.options.lease);
  }
  if (lease.ok() && lease->held && !flags_.lease_lost->load()) return Next::kGoOn;
  Log(LogLevel::kWarning,
      absl::StrCat(job_.name(), " attempt ", job_.attempts(), " finished but no longer holds the job (",
                   lease.ok() ? "lease lost" : lease.status().ToString(), "); its result is dropped"),
      {job_.name(), job_.tenant()});
  return Next::kStop;
}

JobAttempt::Next JobAttempt::Publish() {
  // A rename, so readers see the whole folder or none. What is there already is an earlier attempt's,
  // of a replica that lost the job: this attempt holds the lease, so its output wins.
  const fs::path output = services_.folders.Output(job_.name());
  std::error_code error;
  fs::remove_all(output, error);
  fs::rename(output_dir_, output, error);
  // The worker wrote (and fsynced) each file; the rename is durable once the jobs folder is, before the
  // job record names the artifacts.
  absl::Status published =
      error ? absl::InternalError(absl::StrCat("cannot publish the job's output: ", error.message()))
            : SyncDirectory(output.parent_path());
  if (!published.ok() && outcome_.ok()) outcome_ = published;
  std::error_code ignored;
  fs::rename(attempt_dir_ / "worker.log", services_.folders.Job(job_.name()) / "worker.log", ignored);  // for debugging
  // What earlier attempts (replicas that died or lost the lease) left behind goes before the job ends,
  // so whoever sees it finished sees its folder final. Only lower attempt numbers: this attempt holds
  // the job, so no later one exists.
  RemoveAttemptFolder();
  for (int earlier = 1; earlier < job_.attempts(); ++earlier) {
    fs::remove_all(services_.folders.Attempt(job_.name(), earlier), ignored);
  }
  return Next::kGoOn;
}

JobAttempt::Next JobAttempt::Finish() {
  const std::string& name = job_.name();
  std::string outcome, reason;
  bool applied = false;
  auto updated = services_.store->Modify(
      name,
      [&](v1::Job& job) {
        if (!Holds(job, flags_.token)) return false;
        SetOutcome(job, outcome_, outcome_.ok() ? &result_ : nullptr);
        outcome = OutcomeName(job.state());
        if (job.has_error()) reason = ReasonName(job.error().reason());
        return true;
      },
      &applied);
  if (!updated.ok()) {
    Log(LogLevel::kError, absl::StrCat("cannot store the end of ", name, ": ", ValidUtf8(updated.status().ToString())),
        {name});
    return Next::kStop;
  }
  if (!applied) return Next::kStop;
  services_.metrics->JobFinished(outcome, reason, seconds_);
  Log(outcome == "failed" ? LogLevel::kWarning : LogLevel::kInfo,
      absl::StrCat(name, " ", outcome, reason.empty() || outcome == "cancelled" ? "" : absl::StrCat(" (", reason, ")"),
                   absl::StrFormat(" after %.2f s", seconds_)),
      {name, updated->tenant()});
  for (const auto& pass : report_.passes()) services_.metrics->PassRan(pass.name(), pass.duration_seconds());
  return Next::kGoOn;
}

void JobAttempt::ModifyIfHeld(const std::function<void(v1::Job&)>& mutate) {
  absl::StatusOr<v1::Job> updated = services_.store->Modify(
      job_.name(),
      [&](v1::Job& job) {
        if (!Holds(job, flags_.token)) return false;
        mutate(job);
        return true;
      },
      nullptr);
  if (!updated.ok()) {
    Log(LogLevel::kError, absl::StrCat("cannot update ", job_.name(), ": ", ValidUtf8(updated.status().ToString())),
        {job_.name()});
  }
}

void JobAttempt::RemoveCorruptBlobs() const {
  absl::StatusOr<BlobStore*> blobs = services_.blobs->For(job_.tenant());
  if (!blobs.ok()) return;
  for (const std::string& digest : BlobsOf(job_)) {
    if ((*blobs)->RemoveIfCorrupt(digest)) {
      Log(LogLevel::kWarning, absl::StrCat("blob ", digest, " no longer matched its SHA-256 and was removed"));
    }
  }
}

void JobAttempt::RemoveAttemptFolder() const {
  std::error_code ignored;
  fs::remove_all(attempt_dir_, ignored);
}

}  // namespace onnxopt::server
