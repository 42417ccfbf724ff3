#include "server/job_admission.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/message_differencer.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/sha256.h"
#include "optimizer/utf8.h"
#include "server/job_labels.h"
#include "server/job_outcome.h"
#include "server/log.h"

namespace onnxopt::server {
namespace fs = std::filesystem;
namespace {

absl::Status Draining() {
  return Failure(absl::StatusCode::kUnavailable, v1::ErrorReason::DRAINING,
                 "the server is shutting down; retry on another replica");
}

// `existing`, the job of `request`'s request id, if `request` repeats the one that made it.
absl::StatusOr<v1::Job> SameRequestsJob(const v1::Job& existing, const v1::CreateJobRequest& request) {
  absl::Status same = CheckRetry(existing, request);
  if (!same.ok()) return same;
  return existing;
}

v1::Job NewJob(const v1::CreateJobRequest& request, const std::string& tenant) {
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
  return job;
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

absl::Status CheckRetry(const v1::Job& existing, const v1::CreateJobRequest& request) {
  const std::string difference = RequestDifference(existing, request);
  if (difference.empty()) return absl::OkStatus();
  // The other job is not named: whoever reused the id need not learn anything about it.
  return Failure(
      absl::StatusCode::kAlreadyExists, v1::ErrorReason::REQUEST_ID_REUSED,
      absl::StrCat("request_id '", request.request_id(), "' was used before for a different request (", difference,
                   "); a retry must repeat the request exactly, a new request needs a "
                   "new request_id"));
}

bool IsReservedStagingName(const std::string& name) {
  return name == kStagedModelName || name == kDigestManifestName || name == kStagedInputsFolder ||
         absl::StartsWith(name, absl::StrCat(kStagedInputsFolder, "/"));
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

JobAdmission::JobAdmission(const JobServices& services, std::mutex& blob_lock, const std::atomic<bool>& draining,
                           std::function<void()> on_queued)
    : services_(services), blob_lock_(blob_lock), draining_(draining), on_queued_(std::move(on_queued)) {}

absl::StatusOr<v1::Job> JobAdmission::Submit(const v1::CreateJobRequest& request, const std::string& tenant) {
  if (request.request_id().size() > 256) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_REQUEST_ID, "request_id is too long");
  }
  absl::StatusOr<BlobStore*> blobs = services_.blobs->For(tenant);
  if (!blobs.ok()) return blobs.status();
  // A retry of a request that already made a job gets that job, whatever happened since; the same id
  // on a different request is refused, so nobody gets a job made from someone else's model.
  if (auto found = Earlier(request, tenant)) return *found;
  if (draining_) return Draining();
  // Checked without the lock: inspecting the model takes a worker process, and other clients' requests
  // must not wait for it.
  absl::Status valid = ValidateRequest(request, **blobs);
  if (!valid.ok()) return valid;
  std::lock_guard<std::mutex> lock(blob_lock_);
  if (auto found = Earlier(request, tenant)) return *found;  // the same request id may have arrived meanwhile
  v1::Job job = NewJob(request, tenant);
  // A DeleteJob may have removed a blob since it was checked; deletions hold this lock, so what
  // exists now stays until the job is stored and uses it.
  if (absl::Status present = BlobsPresent(job, **blobs, "; upload it again"); !present.ok()) return present;
  if (draining_) return Draining();
  std::optional<v1::Job> cached;
  if (!request.config().has_cache() || request.config().cache()) {
    cached = services_.store->FindSucceeded(tenant, job.cache_key());
  }
  const absl::StatusOr<int> queued = CheckRoom(tenant, cached.has_value());
  if (!queued.ok()) return queued.status();
  if (cached) {
    if (auto served = ServeFromCache(job, *cached, request)) return *std::move(served);
    // The hit's files are gone: it runs after all, even past a full queue (it was accepted).
  }
  return Enqueue(std::move(job), request, *queued);
}

std::optional<absl::StatusOr<v1::Job>> JobAdmission::Earlier(const v1::CreateJobRequest& request,
                                                             const std::string& tenant) const {
  if (request.request_id().empty()) return std::nullopt;
  std::optional<v1::Job> existing = services_.store->FindByRequestId(tenant, request.request_id());
  if (!existing) return std::nullopt;
  return SameRequestsJob(*existing, request);
}

absl::StatusOr<int> JobAdmission::CheckRoom(const std::string& tenant, bool cached) const {
  // A cache hit neither waits in the queue nor counts against the quota.
  const int quota = services_.options.max_active_jobs_per_tenant;
  if (!cached && quota > 0) {
    const absl::StatusOr<int> active = services_.store->CountActive(tenant);
    if (!active.ok()) return active.status();
    if (*active >= quota) {
      return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::QUOTA_EXCEEDED,
                     absl::StrCat("this tenant has ", *active,
                                  " queued or running jobs, its quota (--tenant-max-active-jobs); "
                                  "retry when one has finished"));
    }
  }
  // Workers only take jobs out, so a free slot seen here is still free when the job is stored (on
  // one replica; with several submitting at once, the queue may pass its capacity by a few jobs).
  const absl::StatusOr<int> queued = services_.store->QueueLength();
  if (!queued.ok()) return queued.status();
  const size_t capacity = services_.options.queue_capacity;
  if (!cached && *queued >= static_cast<int>(capacity)) {
    return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::QUEUE_FULL,
                   absl::StrCat("all ", capacity, " queue slots are taken; retry with backoff"));
  }
  return queued;
}

std::optional<absl::StatusOr<v1::Job>> JobAdmission::ServeFromCache(const v1::Job& job, const v1::Job& cached,
                                                                    const v1::CreateJobRequest& request) {
  // A hit is stored already SUCCEEDED, so that no worker anywhere claims it meanwhile.
  v1::Job hit = job;
  hit.set_name(NewJobName());
  const std::string hit_name = hit.name();
  std::optional<v1::JobResult> result = CopyCachedResult(hit, cached);
  if (!result) return std::nullopt;
  hit.set_state(v1::SUCCEEDED);
  hit.set_cached_from(cached.name());
  *hit.mutable_start_time() = TimestampNow();
  *hit.mutable_end_time() = hit.start_time();
  *hit.mutable_result() = *std::move(result);
  bool created = false;
  absl::StatusOr<v1::Job> stored = services_.store->Create(std::move(hit), &created);
  if (stored.ok() && created) {
    services_.metrics->JobCreated();
    services_.metrics->CacheHit();
    services_.metrics->JobFinished("succeeded", "", 0);
    Log(LogLevel::kInfo, absl::StrCat(stored->name(), " succeeded from the result cache (", cached.name(), ")"),
        {stored->name(), job.tenant()});
    return stored;
  }
  RemoveFolder(services_.folders.Job(hit_name));
  if (stored.ok()) return SameRequestsJob(*stored, request);
  return stored;
}

std::optional<v1::JobResult> JobAdmission::CopyCachedResult(const v1::Job& job, const v1::Job& source) const {
  const fs::path from = services_.folders.Output(source.name()), to = services_.folders.Output(job.name());
  std::error_code error;
  fs::remove_all(to, error);
  fs::create_directories(to, error);
  v1::JobResult result = source.result();
  result.clear_artifacts();
  bool ok = !error;
  for (const v1::Artifact& artifact : source.result().artifacts()) {
    if (!ok || artifact.name() == kReportFileName) continue;
    ok = LinkOrCopy(from / artifact.name(), to / artifact.name()).ok();
    *result.add_artifacts() = artifact;
  }
  v1::Report report;
  absl::StatusOr<std::string> bytes = ok ? ReadFile(from / kReportProtoName) : absl::NotFoundError("");
  ok = bytes.ok() && report.ParseFromString(*bytes);
  if (ok) {
    report.set_job(job.name());
    report.set_cached_from(source.name());  // `time` stays the source's: when the figures were measured
    report.add_warnings(absl::StrCat("served from the result cache: the same request succeeded as ", source.name(),
                                     "; set \"cache\": false in the config to run it again"));
    ok = WriteReport(report, to).ok();
  }
  absl::StatusOr<std::string> digest = ok ? Sha256OfFile(to / kReportFileName) : absl::NotFoundError("");
  if (!digest.ok()) {
    RemoveFolder(services_.folders.Job(job.name()));
    return std::nullopt;
  }
  v1::Artifact* report_json = result.add_artifacts();
  report_json->set_name(kReportFileName);
  report_json->set_role(v1::ARTIFACT_REPORT);
  report_json->set_size(static_cast<int64_t>(fs::file_size(to / kReportFileName, error)));
  report_json->set_sha256(*digest);
  return result;
}

absl::StatusOr<v1::Job> JobAdmission::Enqueue(v1::Job job, const v1::CreateJobRequest& request, int queued) {
  bool created = false;
  absl::StatusOr<v1::Job> stored = services_.store->Create(std::move(job), &created);
  if (!stored.ok()) return stored;
  // The request id was taken meanwhile (on another replica): the same request gets that job.
  if (!created) return SameRequestsJob(*stored, request);
  services_.metrics->JobCreated();
  services_.metrics->SetQueueLength(queued + 1);
  Log(LogLevel::kInfo, absl::StrCat(stored->name(), " queued (", stored->model().display_name(), ")"),
      {stored->name(), stored->tenant()});
  on_queued_();
  return stored;
}

absl::Status JobAdmission::ValidateRequest(const v1::CreateJobRequest& request, BlobStore& blobs) const {
  if (absl::Status model = ValidateModelRef(request.model(), blobs); !model.ok()) return model;
  const int32_t priority = request.config().priority();
  if (priority < kMinPriority || priority > kMaxPriority) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::CONFIG_INVALID,
                   absl::StrCat("priority ", priority, " is outside ", kMinPriority, "..", kMaxPriority));
  }
  if (absl::Status labels = ValidateLabels(request.labels(), "labels"); !labels.ok()) return labels;
  if (absl::Status config = CheckConfig(request.config()); !config.ok()) return config;
  if (absl::Status inputs = ValidateInputs(request.inputs(), blobs); !inputs.ok()) return inputs;
  return CheckModelParses(request.model(), blobs);
}

absl::Status JobAdmission::ValidateModelRef(const v1::ModelRef& model, const BlobStore& blobs) const {
  if (!IsValidSha256(model.sha256())) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_DIGEST,
                   "model.sha256 must be 64 lowercase hexadecimal digits");
  }
  if (!blobs.Exists(model.sha256())) {
    return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::BLOB_NOT_FOUND,
                   absl::StrCat("no uploaded blob ", model.sha256(), "; upload the model first"));
  }
  std::set<std::string> provided;
  for (const auto& file : model.external_data()) {
    if (!IsSafeRelativeName(file.name()) || IsReservedStagingName(file.name())) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_PATH,
                     absl::StrCat("'", ValidUtf8(file.name()),
                                  "' is not a safe relative file name, or one onnxopt reserves "
                                  "(model.onnx, digests.tsv, inputs/)"));
    }
    if (!provided.insert(file.name()).second) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_PATH,
                     absl::StrCat("'", file.name(), "' is listed twice"));
    }
    if (!blobs.Exists(file.sha256())) {
      return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::BLOB_NOT_FOUND,
                     absl::StrCat("no uploaded blob for external data file '", file.name(), "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status JobAdmission::ValidateInputs(const google::protobuf::RepeatedPtrField<v1::InputTensor>& inputs,
                                          const BlobStore& blobs) const {
  if (inputs.size() > kMaxSuppliedTensors) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                   absl::StrCat("at most ", kMaxSuppliedTensors, " input tensors per job"));
  }
  std::set<std::pair<int, std::string>> seen;
  std::set<int> samples;
  for (const auto& input : inputs) {
    if (input.sample() < 0 || input.sample() >= kMaxSuppliedTensors) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                     absl::StrCat("sample ", input.sample(), " is out of range"));
    }
    const bool printable = std::all_of(input.name().begin(), input.name().end(),
                                       [](char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; });
    if (input.name().empty() || input.name().size() > 1024 || !printable) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                     "an input name is empty, too long or has control characters");
    }
    if (!IsValidSha256(input.sha256())) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_DIGEST,
                     "inputs[].sha256 must be 64 lowercase hexadecimal digits");
    }
    if (!blobs.Exists(input.sha256())) {
      return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::BLOB_NOT_FOUND,
                     absl::StrCat("no uploaded blob for input '", input.name(), "' of sample ", input.sample()));
    }
    if (!seen.insert({input.sample(), input.name()}).second) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                     absl::StrCat("input '", input.name(), "' is given twice in sample ", input.sample()));
    }
    samples.insert(input.sample());
  }
  // Numbered 0..n-1: the k-th smallest sample is k.
  int expected = 0;
  for (int sample : samples) {
    if (sample != expected) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUTS_INVALID,
                     absl::StrCat("samples must be numbered from 0 without gaps; ", expected, " is missing"));
    }
    ++expected;
  }
  return absl::OkStatus();
}

absl::Status JobAdmission::CheckModelParses(const v1::ModelRef& model, BlobStore& blobs) const {
  // Parse now so that a file that is no model is refused at once rather than failing a job later; in a
  // worker process, under the job limits, so the server never holds an uploaded model in its memory.
  absl::StatusOr<std::vector<std::string>> locations = InspectModelBounded(blobs.PathOf(model.sha256()));
  const Reason reason = ReasonOf(locations.status());
  if (reason == v1::ErrorReason::MODEL_PARSE_FAILED && blobs.RemoveIfCorrupt(model.sha256())) {
    // Not the upload's fault: the stored copy was altered. Dropped, so the next submit uploads it again.
    return Failure(absl::StatusCode::kDataLoss, v1::ErrorReason::BLOB_CORRUPT,
                   "the server's stored copy of the model no longer matches its SHA-256; "
                   "it was removed, so submitting again uploads it anew");
  }
  if (reason == v1::ErrorReason::WORKER_CRASHED) {
    // A model that crashes the parser or needs more than the job's memory fails its own job, with the
    // job's own report of why; the worker checks its external data again when it loads it.
    return absl::OkStatus();
  }
  if (!locations.ok()) return locations.status();
  std::set<std::string> provided;
  for (const auto& file : model.external_data()) provided.insert(file.name());
  for (const std::string& location : *locations) {
    if (provided.count(location) == 0) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_MISSING,
                     absl::StrCat("the model keeps tensors in '", ValidUtf8(location),
                                  "'; upload that file and list it in model.external_data"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> JobAdmission::InspectModelBounded(const fs::path& model) const {
  // Each inspection is a worker process under the job memory limit: at most as many at once as there
  // are job workers, so a burst of CreateJob calls cannot multiply the server's memory footprint.
  {
    std::unique_lock<std::mutex> lock(inspect_mutex_);
    if (!inspect_slot_free_.wait_for(lock, kInspectWait, [&] { return inspections_ < MaxInspections(); })) {
      return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::INSPECT_BUSY,
                     "every model check slot is taken; retry with backoff");
    }
    ++inspections_;
  }
  absl::StatusOr<std::vector<std::string>> locations =
      InspectModel(services_.options.worker, model, services_.folders.Sandbox());
  {
    std::lock_guard<std::mutex> lock(inspect_mutex_);
    --inspections_;
  }
  inspect_slot_free_.notify_one();
  return locations;
}

}  // namespace onnxopt::server
