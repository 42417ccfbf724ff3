#include "server/job_manager.h"

#include <iostream>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/sha256.h"
#include "optimizer/utf8.h"
#include "server/job_labels.h"
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

// Stages a blob as a job's file. Never writes through an existing file: staged files are hard links to
// blobs, so overwriting one would overwrite a stored blob.
absl::Status LinkOrCopy(const fs::path& from, const fs::path& to) {
  std::error_code error;
  fs::create_directories(to.parent_path(), error);
  if (fs::exists(fs::symlink_status(to, error))) {
    return absl::InternalError(absl::StrCat("cannot stage ", to.string(), ": a file of that name is already staged"));
  }
  fs::create_hard_link(from, to, error);
  if (error) fs::copy_file(from, to, fs::copy_options::none, error);
  if (error) return absl::InternalError(absl::StrCat("cannot stage ", to.string(), ": ", error.message()));
  return absl::OkStatus();
}

// The blobs a job uses.
std::vector<std::string> BlobsOf(const v1::Job& job) {
  std::vector<std::string> digests = {job.model().sha256()};
  for (const auto& file : job.model().external_data()) digests.push_back(file.sha256());
  for (const auto& input : job.inputs()) digests.push_back(input.sha256());
  return digests;
}

// NOT_FOUND (BLOB_NOT_FOUND) naming the first blob of `job` that is gone, `advice` after "was deleted".
absl::Status BlobsPresent(const v1::Job& job, const BlobStore& blobs, absl::string_view advice) {
  for (const std::string& digest : BlobsOf(job)) {
    if (!blobs.Exists(digest)) {
      return absl::NotFoundError(absl::StrCat("BLOB_NOT_FOUND: blob ", digest, " was deleted", advice));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteReport(const v1::Report& report, const fs::path& dir) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  auto status = google::protobuf::util::MessageToJsonString(report, &json, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  absl::Status written = WriteFileAtomically(dir / "report.json", json);
  if (!written.ok()) return written;
  return WriteFileAtomically(dir / "report.pb", report.SerializeAsString());
}

// Ends `job`: SUCCEEDED with `result` when `status` is OK, else CANCELLED or FAILED with the reason.
void SetOutcome(v1::Job& job, const absl::Status& status, const v1::JobResult* result) {
  *job.mutable_end_time() = TimestampNow();
  if (status.ok()) {
    job.set_state(v1::SUCCEEDED);
    *job.mutable_result() = *result;
    return;
  }
  const auto [reason, message] = SplitReason(status);
  job.set_state(status.code() == absl::StatusCode::kCancelled ? v1::CANCELLED : v1::FAILED);
  v1::JobError* error = job.mutable_error();
  error->set_code(static_cast<int>(status.code()));
  error->set_reason(reason);
  error->set_message(message);
}

}  // namespace

std::string ResultCacheKey(const v1::CreateJobRequest& request) {
  v1::OptimizationConfig config = request.config();
  config.clear_priority();
  config.clear_cache();
  const std::string config_bytes = DeterministicBytes(config);
  std::set<std::pair<std::string, std::string>> files;
  for (const auto& file : request.model().external_data()) files.insert({file.name(), file.sha256()});
  std::set<std::tuple<int, std::string, std::string>> inputs;
  for (const auto& input : request.inputs()) inputs.insert({input.sample(), input.name(), input.sha256()});
  // Length-prefixed fields: no two different requests encode alike.
  std::string material;
  auto add = [&](const std::string& field) { absl::StrAppend(&material, field.size(), ":", field, ";"); };
  add("onnxopt-result-cache-v1");
  add(kOptimizerVersion);
  add(OrtVersion());
  add(request.model().sha256());
  for (const auto& [name, digest] : files) {
    add(name);
    add(digest);
  }
  for (const auto& [sample, name, digest] : inputs) {
    add(std::to_string(sample));
    add(name);
    add(digest);
  }
  add(config_bytes);
  return Sha256OfBytes(material);
}

std::string RequestDifference(const v1::Job& existing, const v1::CreateJobRequest& request) {
  using google::protobuf::util::MessageDifferencer;
  auto files = [](const v1::ModelRef& model) {
    std::set<std::pair<std::string, std::string>> named;
    for (const auto& file : model.external_data()) named.insert({file.name(), file.sha256()});
    return named;
  };
  auto inputs = [](const google::protobuf::RepeatedPtrField<v1::InputTensor>& tensors) {
    std::set<std::tuple<int, std::string, std::string>> keyed;
    for (const auto& tensor : tensors) keyed.insert({tensor.sample(), tensor.name(), tensor.sha256()});
    return keyed;
  };
  if (existing.model().sha256() != request.model().sha256()) return "another model";
  if (files(existing.model()) != files(request.model())) return "other external data files";
  if (!MessageDifferencer::Equivalent(existing.config(), request.config())) return "another config";
  if (inputs(existing.inputs()) != inputs(request.inputs())) return "other inputs";
  const std::map<std::string, std::string> existing_labels(existing.labels().begin(), existing.labels().end());
  if (existing_labels != std::map<std::string, std::string>(request.labels().begin(), request.labels().end())) {
    return "other labels";
  }
  return "";
}

void JobManager::ModifyOrLog(const std::string& name, const std::function<bool(v1::Job&)>& mutate) {
  absl::StatusOr<v1::Job> updated = store_->Modify(name, mutate, nullptr);
  if (!updated.ok()) {
    Log(LogLevel::kError, absl::StrCat("cannot update ", name, ": ", ValidUtf8(updated.status().ToString())), {name});
  }
}

bool IsReservedStagingName(const std::string& name) {
  return name == "model.onnx" || name == "digests.tsv" || name == "inputs" || absl::StartsWith(name, "inputs/");
}

bool IsSafeRelativeName(const std::string& name) {
  if (name.empty() || name.size() > 1024 || name.front() == '/' || name.find('\0') != std::string::npos ||
      name.find('\\') != std::string::npos) {
    return false;
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

std::pair<std::string, std::string> SplitReason(const absl::Status& status) {
  absl::string_view message = status.message();
  const size_t colon = message.find(": ");
  if (colon != absl::string_view::npos && colon > 0) {
    absl::string_view head = message.substr(0, colon);
    bool is_reason = true;
    for (char c : head) is_reason &= absl::ascii_isupper(c) || c == '_' || absl::ascii_isdigit(c);
    if (is_reason) return {std::string(head), std::string(message.substr(colon + 2))};
  }
  return {absl::StatusCodeToString(status.code()), std::string(message)};
}

JobManager::JobManager(JobManagerOptions options, JobStore* store, TenantBlobStores* blobs, Metrics* metrics)
    : options_(std::move(options)), store_(store), blobs_(blobs), metrics_(metrics) {}

JobManager::~JobManager() {
  if (!workers_.empty() || lease_thread_.joinable()) Drain(std::chrono::milliseconds(0));
}

fs::path JobManager::JobDir(const std::string& job_name) const {
  return options_.data_dir / "jobs" / std::string(absl::StripPrefix(job_name, "jobs/"));
}

fs::path JobManager::OutputDir(const std::string& job_name) const { return JobDir(job_name) / "output"; }

absl::Status JobManager::Start() {
  std::error_code error;
  fs::create_directories(SandboxDir(), error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", SandboxDir().string(), ": ", error.message()));
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
  const char* outcome = job.state() == v1::CANCELLED ? "cancelled" : job.state() == v1::FAILED ? "failed" : "requeued";
  metrics_->LeaseExpired(outcome);
  if (IsTerminal(job.state())) metrics_->JobFinished(outcome, job.error().reason(), 0);
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
    std::map<std::string, RunningJob> running;
    {
      std::lock_guard<std::mutex> flags(flags_mutex_);
      running = running_jobs_;
    }
    for (const auto& [name, job] : running) {
      absl::StatusOr<LeaseState> lease = store_->RenewLease(name, job.token, options_.lease);
      if (!lease.ok()) {
        // The database is away: keep running; if it stays away past the lease, another replica may
        // take the job, and this one's result will not be stored (see Finish).
        Log(LogLevel::kWarning, absl::StrCat("cannot renew the lease of ", name, ": ", lease.status().ToString()), {name});
        continue;
      }
      if (!lease->held) {
        Log(LogLevel::kWarning, absl::StrCat("lost the lease of ", name, "; stopping it here"), {name});
        job.lease_lost->store(true);
        job.cancel->store(true);
      } else if (lease->cancel_requested) {
        job.cancel->store(true);
      }
    }
    if (options_.run_jobs && std::chrono::steady_clock::now() >= next_recovery && !draining_) {
      RecoverExpiredLeases();
      next_recovery = std::chrono::steady_clock::now() + renew_every;
    }
    UpdateQueueMetric();
    lock.lock();
  }
}

absl::Status JobManager::ValidateInputs(const google::protobuf::RepeatedPtrField<v1::InputTensor>& inputs,
                                        const BlobStore& blobs) const {
  if (inputs.size() > kMaxSuppliedTensors) {
    return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: at most ", kMaxSuppliedTensors, " input tensors per job"));
  }
  std::set<std::pair<int, std::string>> seen;
  std::set<int> samples;
  for (const auto& input : inputs) {
    if (input.sample() < 0 || input.sample() >= kMaxSuppliedTensors) {
      return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: sample ", input.sample(), " is out of range"));
    }
    const bool printable = std::all_of(input.name().begin(), input.name().end(),
                                       [](char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; });
    if (input.name().empty() || input.name().size() > 1024 || !printable) {
      return absl::InvalidArgumentError("INPUTS_INVALID: an input name is empty, too long or has control characters");
    }
    if (!IsValidSha256(input.sha256())) {
      return absl::InvalidArgumentError("BAD_DIGEST: inputs[].sha256 must be 64 lowercase hexadecimal digits");
    }
    if (!blobs.Exists(input.sha256())) {
      return absl::NotFoundError(absl::StrCat("BLOB_NOT_FOUND: no uploaded blob for input '", input.name(), "' of sample ",
                                              input.sample()));
    }
    if (!seen.insert({input.sample(), input.name()}).second) {
      return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: input '", input.name(), "' is given twice in sample ",
                                                     input.sample()));
    }
    samples.insert(input.sample());
  }
  // Numbered 0..n-1: the k-th smallest sample is k.
  int expected = 0;
  for (int sample : samples) {
    if (sample != expected) {
      return absl::InvalidArgumentError(absl::StrCat("INPUTS_INVALID: samples must be numbered from 0 without gaps; ",
                                                     expected, " is missing"));
    }
    ++expected;
  }
  return absl::OkStatus();
}

absl::Status JobManager::ValidateRequest(const v1::CreateJobRequest& request, BlobStore& blobs) const {
  const v1::ModelRef& model = request.model();
  if (!IsValidSha256(model.sha256())) {
    return absl::InvalidArgumentError("BAD_DIGEST: model.sha256 must be 64 lowercase hexadecimal digits");
  }
  if (!blobs.Exists(model.sha256())) {
    return absl::NotFoundError(absl::StrCat("BLOB_NOT_FOUND: no uploaded blob ", model.sha256(), "; upload the model first"));
  }
  std::set<std::string> provided;
  for (const auto& file : model.external_data()) {
    if (!IsSafeRelativeName(file.name()) || IsReservedStagingName(file.name())) {
      return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_PATH: '", ValidUtf8(file.name()),
                                                     "' is not a safe relative file name, or one onnxopt reserves "
                                                     "(model.onnx, digests.tsv, inputs/)"));
    }
    if (!provided.insert(file.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_PATH: '", file.name(), "' is listed twice"));
    }
    if (!blobs.Exists(file.sha256())) {
      return absl::NotFoundError(absl::StrCat("BLOB_NOT_FOUND: no uploaded blob for external data file '", file.name(), "'"));
    }
  }
  const int32_t priority = request.config().priority();
  if (priority < kMinPriority || priority > kMaxPriority) {
    return absl::InvalidArgumentError(absl::StrCat("CONFIG_INVALID: priority ", priority, " is outside ", kMinPriority,
                                                   "..", kMaxPriority));
  }
  if (absl::Status labels = ValidateLabels(request.labels(), "labels"); !labels.ok()) return labels;
  absl::Status config = CheckConfig(request.config());
  if (!config.ok()) return config;
  absl::Status inputs = ValidateInputs(request.inputs(), blobs);
  if (!inputs.ok()) return inputs;
  // Parse now so that a file that is no model is refused at once rather than failing a job later; in a
  // worker process, under the job limits, so the server never holds an uploaded model in its memory.
  absl::StatusOr<std::vector<std::string>> locations = InspectModelBounded(blobs.PathOf(model.sha256()));
  if (!locations.ok() && SplitReason(locations.status()).first == "MODEL_PARSE_FAILED" &&
      blobs.RemoveIfCorrupt(model.sha256())) {
    // Not the upload's fault: the stored copy was altered. Dropped, so the next submit uploads it again.
    return absl::DataLossError("BLOB_CORRUPT: the server's stored copy of the model no longer matches its SHA-256; "
                               "it was removed, so submitting again uploads it anew");
  }
  if (!locations.ok() && SplitReason(locations.status()).first == "WORKER_CRASHED") {
    // A model that crashes the parser or needs more than the job's memory fails its own job, with the
    // job's own report of why; the worker checks its external data again when it loads it.
    return absl::OkStatus();
  }
  if (!locations.ok()) return locations.status();
  for (const std::string& location : *locations) {
    if (provided.count(location) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_MISSING: the model keeps tensors in '", ValidUtf8(location),
                                                     "'; upload that file and list it in model.external_data"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> JobManager::InspectModelBounded(const fs::path& model) const {
  // Each inspection is a worker process under the job memory limit: at most as many at once as there
  // are job workers, so a burst of CreateJob calls cannot multiply the server's memory footprint.
  {
    std::unique_lock<std::mutex> lock(inspect_mutex_);
    if (!inspect_slot_free_.wait_for(lock, kInspectWait, [&] { return inspections_ < MaxInspections(); })) {
      return absl::ResourceExhaustedError("INSPECT_BUSY: every model check slot is taken; retry with backoff");
    }
    ++inspections_;
  }
  absl::StatusOr<std::vector<std::string>> locations = InspectModel(options_.worker, model, SandboxDir());
  {
    std::lock_guard<std::mutex> lock(inspect_mutex_);
    --inspections_;
  }
  inspect_slot_free_.notify_one();
  return locations;
}

absl::Status JobManager::CheckRetry(const v1::Job& existing, const v1::CreateJobRequest& request) {
  const std::string difference = RequestDifference(existing, request);
  if (difference.empty()) return absl::OkStatus();
  // The other job is not named: whoever reused the id need not learn anything about it.
  return absl::AlreadyExistsError(absl::StrCat("REQUEST_ID_REUSED: request_id '", request.request_id(),
                                               "' was used before for a different request (", difference,
                                               "); a retry must repeat the request exactly, a new request needs a "
                                               "new request_id"));
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::CreateJobRequest& request, const std::string& tenant) {
  if (request.request_id().size() > 256) return absl::InvalidArgumentError("BAD_REQUEST_ID: request_id is too long");
  absl::StatusOr<BlobStore*> blobs = blobs_->For(tenant);
  if (!blobs.ok()) return blobs.status();
  // A retry of a request that already made a job gets that job, whatever happened since; the same id
  // on a different request is refused, so nobody gets a job made from someone else's model.
  auto earlier = [&]() -> std::optional<absl::StatusOr<v1::Job>> {
    if (request.request_id().empty()) return std::nullopt;
    std::optional<v1::Job> existing = store_->FindByRequestId(tenant, request.request_id());
    if (!existing) return std::nullopt;
    absl::Status same = CheckRetry(*existing, request);
    if (!same.ok()) return absl::StatusOr<v1::Job>(same);
    return absl::StatusOr<v1::Job>(*existing);
  };
  if (auto found = earlier()) return *found;
  if (draining_) return absl::UnavailableError("DRAINING: the server is shutting down; retry on another replica");
  // Checked without the lock: inspecting the model takes a worker process, and other clients' requests
  // must not wait for it.
  absl::Status valid = ValidateRequest(request, **blobs);
  if (!valid.ok()) return valid;
  std::lock_guard<std::mutex> lock(submit_mutex_);
  if (auto found = earlier()) return *found;  // the same request id may have arrived meanwhile
  v1::Job job;
  job.set_tenant(tenant);
  job.set_request_id(request.request_id());
  job.set_state(v1::QUEUED);
  *job.mutable_model() = request.model();
  *job.mutable_config() = request.config();
  *job.mutable_inputs() = request.inputs();
  *job.mutable_labels() = request.labels();
  *job.mutable_create_time() = TimestampNow();
  job.set_cache_key(ResultCacheKey(request));
  // A DeleteJob may have removed a blob since it was checked; deletions hold this lock, so what
  // exists now stays until the job is stored and uses it.
  if (absl::Status present = BlobsPresent(job, **blobs, "; upload it again"); !present.ok()) return present;
  if (draining_) return absl::UnavailableError("DRAINING: the server is shutting down; retry on another replica");
  std::optional<v1::Job> cached;
  if (!request.config().has_cache() || request.config().cache()) cached = store_->FindSucceeded(tenant, job.cache_key());
  // A cache hit neither waits in the queue nor counts against the quota.
  if (!cached && options_.max_active_jobs_per_tenant > 0) {
    const absl::StatusOr<int> active = store_->CountActive(tenant);
    if (!active.ok()) return active.status();
    if (*active >= options_.max_active_jobs_per_tenant) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "QUOTA_EXCEEDED: this tenant has ", *active, " queued or running jobs, its quota (--tenant-max-active-jobs); "
          "retry when one has finished"));
    }
  }
  // Workers only take jobs out, so a free slot seen here is still free when the job is stored (on
  // one replica; with several submitting at once, the queue may pass its capacity by a few jobs).
  const absl::StatusOr<int> queued = store_->QueueLength();
  if (!queued.ok()) return queued.status();
  if (!cached && *queued >= static_cast<int>(options_.queue_capacity)) {
    return absl::ResourceExhaustedError(absl::StrCat("QUEUE_FULL: all ", options_.queue_capacity,
                                                     " queue slots are taken; retry with backoff"));
  }
  bool created = false;
  if (cached) {
    // A hit is stored already SUCCEEDED, so that no worker anywhere claims it meanwhile.
    v1::Job hit = job;
    hit.set_name(NewJobName());
    const std::string hit_name = hit.name();
    if (std::optional<v1::JobResult> result = CopyCachedResult(hit, *cached)) {
      hit.set_state(v1::SUCCEEDED);
      hit.set_cached_from(cached->name());
      *hit.mutable_start_time() = TimestampNow();
      *hit.mutable_end_time() = hit.start_time();
      *hit.mutable_result() = *std::move(result);
      absl::StatusOr<v1::Job> stored = store_->Create(std::move(hit), &created);
      if (stored.ok() && created) {
        metrics_->JobCreated();
        metrics_->CacheHit();
        metrics_->JobFinished("succeeded", "", 0);
        Log(LogLevel::kInfo, absl::StrCat(stored->name(), " succeeded from the result cache (", cached->name(), ")"),
            {stored->name(), tenant});
        return stored;
      }
      RemoveFolder(JobDir(hit_name));
      if (stored.ok()) return Retried(*stored, request);
      return stored;
    }
    // The hit's files are gone: it runs after all, even past a full queue (it was accepted).
  }
  absl::StatusOr<v1::Job> stored = store_->Create(std::move(job), &created);
  if (!stored.ok()) return stored;
  // The request id was taken meanwhile (on another replica): the same request gets that job.
  if (!created) return Retried(*stored, request);
  metrics_->JobCreated();
  metrics_->SetQueueLength(*queued + 1);
  Log(LogLevel::kInfo, absl::StrCat(stored->name(), " queued (", stored->model().display_name(), ")"),
      {stored->name(), tenant});
  WakeWorkers(/*all=*/false);
  return stored;
}

absl::StatusOr<v1::Job> JobManager::Retried(const v1::Job& existing, const v1::CreateJobRequest& request) {
  absl::Status same = CheckRetry(existing, request);
  if (!same.ok()) return same;
  return existing;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& name) {
  // One atomic step against claims on any replica: a queued job ends here, a running one is asked
  // to stop (its replica sees that with its next lease renewal, or at once when it is this one).
  bool cancelled_queued = false;
  absl::StatusOr<v1::Job> updated = store_->Modify(
      name,
      [&](v1::Job& job) {
        if (job.state() == v1::QUEUED) {
          SetOutcome(job, absl::CancelledError("CANCELLED: cancelled while queued"), nullptr);
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

namespace {

int64_t FolderBytes(const fs::path& folder) {
  int64_t total = 0;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(folder, error); !error && it != fs::recursive_directory_iterator();
       it.increment(error)) {
    std::error_code ignored;
    if (it->is_regular_file(ignored)) total += static_cast<int64_t>(it->file_size(ignored));
  }
  return total;
}

}  // namespace

absl::StatusOr<v1::DeleteJobResponse> JobManager::Delete(const std::string& name) {
  absl::StatusOr<v1::DeleteJobResponse> deleted;
  {
    std::lock_guard<std::mutex> lock(submit_mutex_);
    absl::StatusOr<v1::Job> job = store_->Get(name);
    if (!job.ok()) return job.status();
    if (!IsTerminal(job->state())) {
      return absl::FailedPreconditionError(absl::StrCat("JOB_NOT_DONE: ", name, " is ",
                                                        v1::JobState_Name(job->state()), "; cancel it first"));
    }
    deleted = DeleteLocked(*job);
  }
  // The folder goes without the lock: with the record gone nothing reads it, and a crash before this
  // leaves a stray folder that garbage collection removes.
  if (deleted.ok()) deleted->set_bytes_freed(deleted->bytes_freed() + RemoveFolder(JobDir(name)));
  return deleted;
}

int64_t JobManager::RemoveFolder(const fs::path& folder) {
  const int64_t bytes = FolderBytes(folder);
  std::error_code ignored;
  fs::remove_all(folder, ignored);
  return bytes;
}

JobManager::BlobUsage JobManager::CountBlobUsage(const std::vector<v1::Job>& jobs) {
  BlobUsage usage;
  for (const v1::Job& job : jobs) {
    const std::vector<std::string> digests = BlobsOf(job);
    for (const std::string& digest : std::set<std::string>(digests.begin(), digests.end())) ++usage[job.tenant()][digest];
  }
  return usage;
}

absl::StatusOr<v1::DeleteJobResponse> JobManager::DeleteLocked(const v1::Job& job, BlobUsage* usage) {
  // The record goes first: a crash after it leaves only files, which garbage collection finds.
  absl::Status deleted = store_->Delete(job.name());
  if (!deleted.ok()) return deleted;
  v1::DeleteJobResponse response;
  response.set_name(job.name());
  BlobUsage counted;
  if (usage == nullptr) {
    absl::StatusOr<std::vector<v1::Job>> all = store_->All();  // without `job` now
    if (!all.ok()) {
      // Which blobs other jobs use is unknown: they stay, for garbage collection to judge later.
      Log(LogLevel::kWarning, absl::StrCat(job.name(), " deleted, its blobs kept: ", all.status().ToString()),
          {job.name(), job.tenant()});
      return response;
    }
    counted = CountBlobUsage(*all);
  } else {
    // The counts include `job`: it goes now.
    const std::vector<std::string> digests = BlobsOf(job);
    for (const std::string& digest : std::set<std::string>(digests.begin(), digests.end())) {
      --(*usage)[job.tenant()][digest];
    }
  }
  std::map<std::string, int>& used = (usage != nullptr ? *usage : counted)[job.tenant()];
  absl::StatusOr<BlobStore*> blobs = blobs_->For(job.tenant());
  if (blobs.ok()) {
    const std::vector<std::string> digests = BlobsOf(job);
    for (const std::string& digest : std::set<std::string>(digests.begin(), digests.end())) {
      if (used[digest] > 0) continue;
      const int64_t bytes = (*blobs)->Remove(digest);
      if (bytes > 0) response.set_blobs_deleted(response.blobs_deleted() + 1);
      response.set_bytes_freed(response.bytes_freed() + bytes);
    }
  }
  return response;
}

JobManager::Collected JobManager::CollectGarbage(std::chrono::seconds retention, std::chrono::seconds orphan_age) {
  Collected collected;
  std::vector<fs::path> folders;  // removed once the lock is released
  std::unique_lock<std::mutex> lock(submit_mutex_);
  // Old folders are listed before the jobs are read: a folder made after that (a job another replica
  // sharing the data folder stored meanwhile) is young, so it is never taken for a stray.
  const auto folder_cutoff = fs::file_time_type::clock::now() - orphan_age;
  std::vector<fs::path> old_folders;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(options_.data_dir / "jobs", error)) {
    std::error_code ignored;
    const auto written = fs::last_write_time(entry.path(), ignored);
    if (!ignored && written < folder_cutoff) old_folders.push_back(entry.path());
  }
  absl::StatusOr<std::vector<v1::Job>> all = store_->All();
  if (!all.ok()) {
    // Without the list of jobs, every blob and folder would look unused: nothing is collected.
    Log(LogLevel::kError, absl::StrCat("garbage collection skipped: ", all.status().ToString()));
    return collected;
  }
  // Which blobs the jobs use, counted once: each expired job's deletion takes its own share off.
  BlobUsage usage = CountBlobUsage(*all);
  if (retention.count() > 0) {
    const int64_t cutoff = google::protobuf::util::TimeUtil::TimestampToSeconds(TimestampNow()) - retention.count();
    for (const v1::Job& job : *all) {
      if (!IsTerminal(job.state()) || !job.has_end_time() ||
          google::protobuf::util::TimeUtil::TimestampToSeconds(job.end_time()) > cutoff) {
        continue;
      }
      absl::StatusOr<v1::DeleteJobResponse> deleted = DeleteLocked(job, &usage);
      if (!deleted.ok()) {
        Log(LogLevel::kError, absl::StrCat("cannot delete expired ", job.name(), ": ", deleted.status().ToString()),
            {job.name(), job.tenant()});
        continue;
      }
      ++collected.jobs;
      folders.push_back(JobDir(job.name()));
      collected.blobs += deleted->blobs_deleted();
      collected.bytes += deleted->bytes_freed();
    }
    all = store_->All();
    if (!all.ok()) {
      Log(LogLevel::kError, absl::StrCat("garbage collection stopped after retention: ", all.status().ToString()));
      lock.unlock();
      for (const fs::path& folder : folders) collected.bytes += RemoveFolder(folder);
      return collected;
    }
  }
  // Blobs no job of their tenant uses, that nobody wrote for the orphan age.
  std::map<std::string, std::set<std::string>> used;  // tenant -> digests
  std::set<std::string> names;
  for (const v1::Job& job : *all) {
    names.insert(std::string(absl::StripPrefix(job.name(), "jobs/")));
    for (const std::string& digest : BlobsOf(job)) used[job.tenant()].insert(digest);
  }
  blobs_->ForEach([&](const std::string& tenant, BlobStore& store) {
    for (const std::string& digest : store.BlobsOlderThan(orphan_age)) {
      if (used[tenant].count(digest) > 0) continue;
      const int64_t bytes = store.Remove(digest);
      collected.blobs += bytes > 0;
      collected.bytes += bytes;
    }
  });
  // Old folders without a job: what a crash left.
  for (const fs::path& folder : old_folders) {
    if (names.count(folder.filename().string()) > 0 ||
        std::find(folders.begin(), folders.end(), folder) != folders.end()) {
      continue;
    }
    folders.push_back(folder);
    ++collected.folders;
  }
  lock.unlock();
  for (const fs::path& folder : folders) collected.bytes += RemoveFolder(folder);
  return collected;
}

std::optional<v1::JobResult> JobManager::CopyCachedResult(const v1::Job& job, const v1::Job& source) {
  const fs::path from = OutputDir(source.name()), to = OutputDir(job.name());
  std::error_code error;
  fs::remove_all(to, error);
  fs::create_directories(to, error);
  v1::JobResult result = source.result();
  result.clear_artifacts();
  bool ok = !error;
  for (const v1::Artifact& artifact : source.result().artifacts()) {
    if (!ok || artifact.name() == "report.json") continue;
    ok = LinkOrCopy(from / artifact.name(), to / artifact.name()).ok();
    *result.add_artifacts() = artifact;
  }
  v1::Report report;
  absl::StatusOr<std::string> bytes = ok ? ReadFile(from / "report.pb") : absl::NotFoundError("");
  ok = bytes.ok() && report.ParseFromString(*bytes);
  if (ok) {
    report.set_job(job.name());
    report.set_cached_from(source.name());  // `time` stays the source's: when the figures were measured
    report.add_warnings(absl::StrCat("served from the result cache: the same request succeeded as ", source.name(),
                                     "; set \"cache\": false in the config to run it again"));
    ok = WriteReport(report, to).ok();
  }
  absl::StatusOr<std::string> digest = ok ? Sha256OfFile(to / "report.json") : absl::NotFoundError("");
  if (!digest.ok()) {
    RemoveFolder(JobDir(job.name()));
    return std::nullopt;
  }
  v1::Artifact* report_json = result.add_artifacts();
  report_json->set_name("report.json");
  report_json->set_size(static_cast<int64_t>(fs::file_size(to / "report.json", error)));
  report_json->set_sha256(*digest);
  return result;
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

absl::Status JobManager::PrepareInputs(const v1::Job& job, const fs::path& input_dir) const {
  std::error_code error;
  fs::remove_all(input_dir, error);
  // Every staged file with the digest its blob must still have; the worker checks them first.
  std::vector<FileDigest> digests = {{job.model().sha256(), "model.onnx"}};
  absl::StatusOr<BlobStore*> blobs = blobs_->For(job.tenant());
  if (!blobs.ok()) return blobs.status();
  // A blob can go after the job was accepted: deleted with the last other job using it, on a replica
  // whose DeleteJob ran while this job was being submitted on another.
  absl::Status present = BlobsPresent(job, **blobs, " after the job was accepted; upload it and submit again");
  if (!present.ok()) return present;
  absl::Status status = LinkOrCopy((*blobs)->PathOf(job.model().sha256()), input_dir / "model.onnx");
  for (const auto& file : job.model().external_data()) {
    if (!status.ok()) break;
    status = LinkOrCopy((*blobs)->PathOf(file.sha256()), input_dir / file.name());
    digests.push_back({file.sha256(), file.name()});
  }
  // Supplied inputs: tensors under inputs/, named by position, and a manifest the worker reads.
  std::vector<SuppliedInputFile> files;
  for (int i = 0; i < job.inputs_size() && status.ok(); ++i) {
    const v1::InputTensor& input = job.inputs(i);
    const std::string file = absl::StrCat(i, ".pb");
    status = LinkOrCopy((*blobs)->PathOf(input.sha256()), input_dir / "inputs" / file);
    files.push_back({input.sample(), input.name(), file});
    digests.push_back({input.sha256(), absl::StrCat("inputs/", file)});
  }
  if (status.ok() && !files.empty()) status = WriteFileAtomically(InputManifest(input_dir), FormatInputManifest(files));
  if (status.ok()) status = WriteFileAtomically(DigestManifest(input_dir), FormatDigestManifest(digests));
  return status;
}

void JobManager::RemoveCorruptBlobs(const v1::Job& job) {
  const std::vector<std::string> digests = BlobsOf(job);
  absl::StatusOr<BlobStore*> blobs = blobs_->For(job.tenant());
  if (!blobs.ok()) return;
  for (const std::string& digest : digests) {
    if ((*blobs)->RemoveIfCorrupt(digest)) {
      Log(LogLevel::kWarning, absl::StrCat("blob ", digest, " no longer matched its SHA-256 and was removed"));
    }
  }
}

fs::path JobManager::DigestManifest(const fs::path& input_dir) { return input_dir / "digests.tsv"; }

fs::path JobManager::SandboxDir() const { return options_.data_dir / "sandbox"; }

fs::path JobManager::InputManifest(const fs::path& input_dir) { return input_dir / "inputs" / "manifest.tsv"; }

bool JobManager::Finish(const std::string& name, const std::string& token, const absl::Status& status,
                        const v1::JobResult* result, double seconds) {
  std::string outcome;
  std::string reason;
  bool applied = false;
  auto updated = store_->Modify(
      name,
      [&](v1::Job& job) {
        if (!Holds(job, token)) return false;
        SetOutcome(job, status, result);
        outcome = job.state() == v1::SUCCEEDED ? "succeeded" : job.state() == v1::CANCELLED ? "cancelled" : "failed";
        reason = job.error().reason();
        return true;
      },
      &applied);
  if (!updated.ok()) {
    Log(LogLevel::kError, absl::StrCat("cannot store the end of ", name, ": ", ValidUtf8(updated.status().ToString())),
        {name});
    return false;
  }
  if (applied) {
    metrics_->JobFinished(outcome, reason, seconds);
    Log(outcome == "failed" ? LogLevel::kWarning : LogLevel::kInfo,
        absl::StrCat(name, " ", outcome, reason.empty() || outcome == "cancelled" ? "" : absl::StrCat(" (", reason, ")"),
                     absl::StrFormat(" after %.2f s", seconds)),
        {name, updated->tenant()});
  }
  return applied;
}

absl::Status JobManager::PublishOutput(const std::string& name, const fs::path& attempt_output) const {
  // A rename, so readers see the whole folder or none. What is there already is an earlier attempt's,
  // of a replica that lost the job: this attempt holds the lease, so its output wins.
  const fs::path output = OutputDir(name);
  std::error_code error;
  fs::remove_all(output, error);
  fs::rename(attempt_output, output, error);
  if (error) return absl::InternalError(absl::StrCat("cannot publish the job's output: ", error.message()));
  // The worker wrote (and fsynced) each file; the rename is durable once the jobs folder is, before the
  // job record names the artifacts.
  return SyncDirectory(output.parent_path());
}

void JobManager::RunJob(const v1::Job& job) {
  const std::string& name = job.name();
  const auto start = std::chrono::steady_clock::now();
  RunningJob running;
  running.token = LeaseToken(job);
  const std::string& token = running.token;
  {
    std::lock_guard<std::mutex> lock(flags_mutex_);
    auto [it, added] = running_jobs_.emplace(name, running);
    if (!added) {
      // An earlier attempt of this job still runs here: its lease was lost (this replica took the job
      // back from itself after losing the database). It stops, and keeps nothing.
      it->second.lease_lost->store(true);
      it->second.cancel->store(true);
      it->second = running;
    }
    // Drain may have interrupted the running jobs while this one was being claimed.
    if (job.cancel_requested() || interrupting_) running.cancel->store(true);
  }
  // The lease is renewed until the job has ended in the store: hashing and publishing a large result
  // can take longer than a lease.
  struct Forget {
    JobManager* manager;
    const std::string& name;
    const std::string& token;
    ~Forget() {
      std::lock_guard<std::mutex> lock(manager->flags_mutex_);
      auto it = manager->running_jobs_.find(name);
      if (it != manager->running_jobs_.end() && it->second.token == token) manager->running_jobs_.erase(it);
    }
  } forget{this, name, token};

  // Each attempt works in a folder of its own: a replica that lost the job (and may still be writing)
  // never shares files with the one that took it over. Only the output is published.
  const fs::path attempt_dir = JobDir(name) / absl::StrCat("attempt-", job.attempts());
  const fs::path input_dir = attempt_dir / "input";
  const fs::path output_dir = attempt_dir / "output";
  const fs::path config_path = attempt_dir / "config.pb";
  std::error_code ignored;
  fs::remove_all(attempt_dir, ignored);
  fs::create_directories(output_dir, ignored);
  absl::Status outcome = PrepareInputs(job, input_dir);
  if (outcome.ok()) outcome = WriteFileAtomically(config_path, job.config().SerializeAsString());
  if (outcome.ok()) {
    WorkerJob work;
    work.job_dir = attempt_dir;
    work.model = input_dir / "model.onnx";
    work.output_dir = output_dir;
    work.config = config_path;
    work.inputs = job.inputs().empty() ? fs::path() : InputManifest(input_dir);
    work.digests = DigestManifest(input_dir);
    work.name = job.name();
    outcome = RunWorkerProcess(options_.worker, work, *running.cancel, [&](const WorkerLine& line) {
      ModifyOrLog(name, [&](v1::Job& j) {
        if (!Holds(j, token)) return false;
        v1::JobProgress* progress = j.mutable_progress();
        progress->set_phase(ToProto(line.phase));
        progress->set_current_pass(line.pass);
        progress->set_passes_done(line.done);
        progress->set_passes_total(line.total);
        return true;
      });
    });
  }
  auto cleanup = [&] { fs::remove_all(attempt_dir, ignored); };
  if (running.lease_lost->load()) {
    // Another replica has the job now (or will): nothing of this attempt is kept.
    Log(LogLevel::kWarning, absl::StrCat(name, " attempt ", job.attempts(), " dropped: its lease was lost"),
        {name, job.tenant()});
    cleanup();
    return;
  }
  if (SplitReason(outcome).first == "BLOB_CORRUPT") RemoveCorruptBlobs(job);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (outcome.code() == absl::StatusCode::kCancelled && interrupting_) {
    // Shutdown, not the user: back to the queue, to run again at the next start or on another
    // replica. The attempt does not count against --max-attempts.
    cleanup();
    ModifyOrLog(name, [&](v1::Job& j) {
      if (!Holds(j, token)) return false;
      if (j.cancel_requested()) {
        SetOutcome(j, absl::CancelledError("CANCELLED: cancelled while the server shut down"), nullptr);
        return true;
      }
      j.set_state(v1::QUEUED);
      j.clear_progress();
      j.clear_start_time();
      j.clear_worker();
      j.set_attempts(std::max(0, j.attempts() - 1));
      return true;
    });
    return;
  }
  // The worker leaves a report (partial when it failed) unless it crashed before writing one. A job
  // that succeeded without a report that parses has nothing trustworthy to publish: it fails.
  v1::Report report;
  absl::StatusOr<std::string> report_bytes = ReadFile(output_dir / "report.pb");
  if (report_bytes.ok() && !report.ParseFromString(*report_bytes)) {
    report.Clear();
    if (outcome.ok()) outcome = absl::InternalError("WORKER_REPORT_CORRUPT: the worker's report does not parse");
  } else if (!report_bytes.ok() && outcome.ok()) {
    outcome = absl::InternalError("WORKER_REPORT_MISSING: the worker succeeded without writing its report");
  }
  report.set_job(name);
  *report.mutable_time() = TimestampNow();
  absl::Status report_written = WriteReport(report, output_dir);
  v1::JobResult result;
  if (outcome.ok()) outcome = report_written;
  for (const char* artifact :
       {"model.onnx", "model.onnx.data", "report.json", "ort_session.json", onnxopt::kAdapterFileName}) {
    if (!outcome.ok()) break;
    const fs::path file = output_dir / artifact;
    if (!fs::exists(file, ignored)) continue;
    absl::StatusOr<std::string> digest = Sha256OfFile(file);
    if (!digest.ok()) {
      outcome = digest.status();
      break;
    }
    v1::Artifact* entry = result.add_artifacts();
    entry->set_name(artifact);
    entry->set_size(static_cast<int64_t>(fs::file_size(file, ignored)));
    entry->set_sha256(*digest);
  }
  result.set_nodes_before(report.original().nodes());
  result.set_nodes_after(report.optimized().nodes());
  result.set_parity_passed(!report.parity().skipped() && report.parity().passed());
  result.set_speedup(report.benchmark().speedup());
  result.set_returned_original(report.returned_original());
  for (const auto& excluded : report.parity().bisection().excluded_passes()) result.add_excluded_passes(excluded);
  // Published only while this attempt holds the job, then ended under the same fence. When the store
  // cannot say, the result is dropped: the lease runs out and the job runs again.
  absl::StatusOr<LeaseState> lease = absl::UnavailableError("not asked");
  for (int tries = 0; tries < 3 && !lease.ok(); ++tries) {
    if (tries > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    lease = store_->RenewLease(name, token, options_.lease);
  }
  if (!lease.ok() || !lease->held || running.lease_lost->load()) {
    Log(LogLevel::kWarning,
        absl::StrCat(name, " attempt ", job.attempts(), " finished but no longer holds the job (",
                     lease.ok() ? "lease lost" : lease.status().ToString(), "); its result is dropped"),
        {name, job.tenant()});
    cleanup();
    return;
  }
  if (absl::Status published = PublishOutput(name, output_dir); !published.ok() && outcome.ok()) outcome = published;
  fs::rename(attempt_dir / "worker.log", JobDir(name) / "worker.log", ignored);  // kept for whoever debugs the job
  cleanup();
  // What earlier attempts (replicas that died or lost the lease) left behind goes before the job ends,
  // so whoever sees it finished sees its folder final. Only lower attempt numbers: this attempt holds
  // the job, so no later one exists.
  for (int earlier = 1; earlier < job.attempts(); ++earlier) {
    fs::remove_all(JobDir(name) / absl::StrCat("attempt-", earlier), ignored);
  }
  if (Finish(name, token, outcome, outcome.ok() ? &result : nullptr, seconds)) {
    for (const auto& pass : report.passes()) metrics_->PassRan(pass.name(), pass.duration_seconds());
  }
}

}  // namespace onnxopt::server
