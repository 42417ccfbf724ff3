// Prometheus metrics, served on their own port (/metrics). Names follow Prometheus conventions:
// prefix onnxopt_, base units, _total for counters.
#ifndef ONNXOPT_SERVER_METRICS_H_
#define ONNXOPT_SERVER_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace onnxopt::server {

class Metrics {
 public:
  Metrics();
  // Stops serving at once: a connection wakes the HTTP server's accept loop (metrics.cc).
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;
  // Serves /metrics on `address` ("host:port", port 0 picks one); empty: kept but not served.
  // Returns the port it listens on (0 when not serving).
  absl::StatusOr<int> Serve(const std::string& address);

  void JobCreated() { jobs_created_->Increment(); }
  void CacheHit() { cache_hits_->Increment(); }
  // `reason`: the failure's stable reason (JobError.reason, e.g. PARITY_FAILED), "" for a success.
  void JobFinished(const std::string& result, const std::string& reason, double seconds);
  // From CreateJob to a worker's first start of the job.
  void JobWaited(double seconds) { queue_wait_->Observe(seconds); }
  void PassRan(const std::string& pass, double seconds);
  void UploadBytes(double bytes) { upload_bytes_->Increment(bytes); }
  void SetQueueLength(double length) { queue_length_->Set(length); }
  void SetRunning(double running) { jobs_running_->Set(running); }
  // `outcome`: requeued, failed or cancelled.
  void LeaseExpired(const std::string& outcome) { lease_expirations_->Add({{"outcome", outcome}}).Increment(); }
  // `kind`: blob or artifact, found corrupt (by a scrub or a download that read it whole).
  void CorruptFound(const std::string& kind) { corrupt_found_->Add({{"kind", kind}}).Increment(); }
  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string serving_address_;  // as given to Serve
  int serving_port_ = 0;
  prometheus::Family<prometheus::Counter>* jobs_total_;
  prometheus::Counter* jobs_created_;
  prometheus::Counter* cache_hits_;
  prometheus::Family<prometheus::Counter>* lease_expirations_;
  prometheus::Family<prometheus::Counter>* corrupt_found_;
  prometheus::Gauge* queue_length_;
  prometheus::Gauge* jobs_running_;
  prometheus::Histogram* job_duration_;
  prometheus::Histogram* queue_wait_;
  prometheus::Family<prometheus::Histogram>* pass_duration_;
  prometheus::Counter* upload_bytes_;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_METRICS_H_
