#include "server/job_store.h"

#include <mutex>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/time_util.h"
#include "optimizer/config_enums.h"
#include "optimizer/failure.h"
#include "optimizer/result_files.h"
#include "server/job_labels.h"
#include "server/postgres_job_store.h"
#include "server/sqlite_job_store.h"

namespace onnxopt::server {
google::protobuf::Timestamp TimestampNow() {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

absl::Status JobNotFound(const std::string& name) {
  return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::JOB_NOT_FOUND,
                 absl::StrCat("no job named '", name, "'"));
}

bool JobFilter::Matches(const v1::Job& job) const {
  return (state == v1::JOB_STATE_UNSPECIFIED || job.state() == state) && HasLabels(job, labels);
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

absl::StatusOr<WorkerDevice> ParseWorkerDevice(const std::string& text) {
  if (text == "any") return WorkerDevice::kAny;
  if (text == "cuda") return WorkerDevice::kCuda;
  if (text == "cpu") return WorkerDevice::kCpu;
  return absl::InvalidArgumentError(absl::StrCat("worker_device must be any, cuda or cpu, not '", text, "'"));
}

bool WantsCuda(const v1::Job& job) { return job.config().benchmark().device() == v1::DEVICE_CUDA; }

bool MayClaim(WorkerDevice device, const v1::Job& job) {
  switch (device) {
    case WorkerDevice::kAny: return true;
    case WorkerDevice::kCuda: return WantsCuda(job);
    case WorkerDevice::kCpu: return !WantsCuda(job);
  }
  return false;
}

std::string NewJobName() {
  static std::mt19937_64 random{std::random_device{}()};
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  return absl::StrFormat("jobs/%011x%06x", millis, random() & 0xffffff);
}

std::string LeaseToken(const v1::Job& job) { return absl::StrCat(job.worker(), "#", job.attempts()); }

void MarkClaimed(v1::Job& job, const std::string& owner) {
  job.set_state(v1::RUNNING);
  *job.mutable_start_time() = TimestampNow();
  job.clear_progress();
  job.mutable_progress()->set_phase(v1::PHASE_LOADING);
  job.set_attempts(job.attempts() + 1);
  job.set_worker(owner);
}

void ExpireLease(v1::Job& job, int max_attempts) {
  const std::string worker = job.worker().empty() ? "its replica" : absl::StrCat("replica ", job.worker());
  if (job.cancel_requested() || job.attempts() >= max_attempts) {
    const bool cancelled = job.cancel_requested();
    job.set_state(cancelled ? v1::CANCELLED : v1::FAILED);
    *job.mutable_end_time() = TimestampNow();
    v1::JobError* error = job.mutable_error();
    error->set_code(static_cast<int>(cancelled ? absl::StatusCode::kCancelled : absl::StatusCode::kUnavailable));
    error->set_reason(cancelled ? v1::ErrorReason::CANCELLED : v1::ErrorReason::LEASE_EXPIRED);
    error->set_message(cancelled ? absl::StrCat("cancelled; ", worker, " stopped before the job ended")
                                 : absl::StrCat(worker, " stopped renewing the job's lease (it died or lost the job "
                                                "store) on attempt ", job.attempts(), " of ", max_attempts,
                                                " (--max-attempts); the job is not tried again"));
    return;
  }
  job.set_state(v1::QUEUED);
  job.clear_progress();
  job.clear_start_time();
  job.clear_worker();
}

namespace {

// A record written while JobError.reason was a string holds the reason's name where the enum now is:
// field 2 as bytes, which parsing keeps as an unknown field.
void UpgradeErrorReason(v1::JobError& error) {
  google::protobuf::UnknownFieldSet* unknown = error.GetReflection()->MutableUnknownFields(&error);
  for (int i = 0; i < unknown->field_count(); ++i) {
    const google::protobuf::UnknownField& field = unknown->field(i);
    if (field.number() != 2 || field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    Reason reason = v1::ErrorReason::UNKNOWN;
    if (!v1::ErrorReason::Reason_Parse(field.length_delimited(), &reason)) reason = v1::ErrorReason::UNKNOWN;
    error.set_reason(reason);
    unknown->DeleteSubrange(i, 1);
    return;
  }
}

}  // namespace

void UpgradeRecord(v1::Job& job) {
  if (job.has_error()) UpgradeErrorReason(*job.mutable_error());
  // Its config was checked when it was accepted: every legacy name is known.
  if (job.has_config()) UpgradeLegacyConfig(*job.mutable_config()).IgnoreError();
  if (!job.has_result()) return;  // result and error are a oneof: asking for a result would drop the error
  for (v1::Artifact& artifact : *job.mutable_result()->mutable_artifacts()) {
    if (artifact.role() == v1::ARTIFACT_ROLE_UNSPECIFIED) artifact.set_role(ResultFileRole(artifact.name()));
  }
}

v1::Job UnreadableJob(const std::string& name, const std::string& request_id, v1::JobState state,
                      const std::string& tenant) {
  v1::Job job;
  job.set_name(name);
  job.set_tenant(tenant);  // from its own column: the job stays its owner's
  job.set_request_id(request_id);
  job.set_state(IsTerminal(state) ? state : v1::FAILED);
  if (state != v1::SUCCEEDED) {
    v1::JobError* error = job.mutable_error();
    error->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
    error->set_reason(v1::ErrorReason::JOB_RECORD_UNREADABLE);
    error->set_message(absl::StrCat("the job store could not read this job's record (it was ",
                                    v1::JobState_Name(state), "); submit the model again"));
  }
  return job;
}

bool IsSharedJobStore(const std::string& spec) {
  return absl::StartsWith(spec, "postgresql://") || absl::StartsWith(spec, "postgres://");
}

absl::StatusOr<std::unique_ptr<JobStore>> OpenJobStore(const std::string& spec, const std::filesystem::path& data_dir,
                                                       const pg::PoolOptions& connections) {
  auto widen = [](auto store) -> absl::StatusOr<std::unique_ptr<JobStore>> {
    if (!store.ok()) return store.status();
    return std::unique_ptr<JobStore>(std::move(*store));
  };
  if (spec.empty() || spec == "sqlite") return widen(SqliteJobStore::Open(data_dir / "jobs.sqlite3"));
  if (absl::StartsWith(spec, "sqlite:") && spec.size() > 7) return widen(SqliteJobStore::Open(spec.substr(7)));
  if (IsSharedJobStore(spec)) return widen(PostgresJobStore::Open(spec, connections));
  return absl::InvalidArgumentError(
      "job_store must be \"sqlite\" (the default), \"sqlite:<path>\" or a postgresql:// connection URI");
}

}  // namespace onnxopt::server
