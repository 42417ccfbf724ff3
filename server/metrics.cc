#include "server/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"

namespace onnxopt::server {
namespace {

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800};
}

// The addresses to connect to for a listening address "host:port" (or "port"): loopback for a wildcard host.
addrinfo* ResolveListener(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  return getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0 ? found : nullptr;
}

// Opens and closes a connection to the first of `addresses` that accepts one.
void Knock(const addrinfo* addresses) {
  for (const addrinfo* at = addresses; at != nullptr; at = at->ai_next) {
    const int fd = socket(at->ai_family, at->ai_socktype | SOCK_CLOEXEC, at->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, at->ai_addr, at->ai_addrlen) == 0;
    close(fd);
    if (connected) return;
  }
}

}  // namespace

Metrics::~Metrics() {
  if (exposer_ == nullptr) return;
  // prometheus-cpp's Exposer stops civetweb, whose accept loop sees the stop only when its poll returns:
  // on a connection, or after 2 s. Without a connection the server took up to 2 s longer to exit than
  // everything else did; knocking on the port while it stops wakes the poll.
  addrinfo* listener = ResolveListener(serving_address_, serving_port_);
  std::atomic<bool> stopped = false;
  std::thread knocker([&] {
    while (!stopped.load()) {
      Knock(listener);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  exposer_.reset();
  stopped = true;
  knocker.join();
  if (listener != nullptr) freeaddrinfo(listener);
}

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto counter = [this](const char* name, const char* help) -> prometheus::Family<prometheus::Counter>& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  };
  auto gauge = [this](const char* name, const char* help) -> prometheus::Family<prometheus::Gauge>& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  };
  auto histogram = [this](const char* name, const char* help) -> prometheus::Family<prometheus::Histogram>& {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
  };
  jobs_total_ = &counter("onnxopt_jobs_total",
                         "Jobs finished, by result and, for failures and cancellations, the stable reason");
  jobs_created_ = &counter("onnxopt_jobs_created_total", "Jobs accepted into the queue").Add({});
  cache_hits_ = &counter("onnxopt_result_cache_hits_total", "Jobs answered from the result cache without running").Add({});
  lease_expirations_ = &counter("onnxopt_job_lease_expirations_total",
                                "Running jobs taken back because their replica stopped renewing the lease, by "
                                "what became of them (requeued, failed after the last attempt, cancelled)");
  corrupt_found_ = &counter("onnxopt_corrupt_found_total",
                            "Stored bytes found no longer matching their SHA-256, by kind (blob: deleted; "
                            "artifact: marked, its downloads refused)");
  queue_length_ = &gauge("onnxopt_job_queue_length", "Jobs waiting in the queue").Add({});
  jobs_running_ = &gauge("onnxopt_jobs_running", "Jobs being worked on").Add({});
  job_duration_ = &histogram("onnxopt_job_duration_seconds", "Wall time of a job from start to end")
                       .Add({}, SecondsBuckets());
  queue_wait_ = &histogram("onnxopt_job_queue_wait_seconds",
                           "Time a job waited in the queue, from CreateJob to its first start on a worker")
                     .Add({}, SecondsBuckets());
  pass_duration_ = &histogram("onnxopt_pass_duration_seconds", "Wall time of one pass run over a model");
  upload_bytes_ = &counter("onnxopt_upload_bytes_total", "Bytes received by UploadBlob").Add({});
  gauge("onnxopt_build_info", "Build information (always 1)")
      .Add({{"version", kOptimizerVersion}, {"onnxruntime_version", OrtVersion()}})
      .Set(1);
  jobs_total_->Add({{"result", "succeeded"}, {"reason", ""}});
  auto& providers = gauge("onnxopt_execution_provider_usable",
                          "1 if the execution provider runs on this machine, 0 if the build has it but it cannot "
                          "load here (GetServerInfo says why)");
  for (const ProviderStatus& provider : ProviderStatuses()) {
    providers.Add({{"provider", provider.name}}).Set(provider.usable ? 1 : 0);
  }
}

absl::StatusOr<int> Metrics::Serve(const std::string& address) {
  if (address.empty()) return 0;
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  serving_address_ = address;
  serving_port_ = ports.empty() ? 0 : ports.front();
  return serving_port_;
}

void Metrics::JobFinished(const std::string& result, const std::string& reason, double seconds) {
  // Reasons are the server's own constants; anything else is folded so a label cannot grow unbounded.
  const bool constant = reason.size() <= 64 && std::all_of(reason.begin(), reason.end(), [](char c) {
                          return absl::ascii_isupper(c) || absl::ascii_isdigit(c) || c == '_';
                        });
  jobs_total_->Add({{"result", result}, {"reason", constant ? reason : "OTHER"}}).Increment();
  job_duration_->Observe(seconds);
}

void Metrics::PassRan(const std::string& pass, double seconds) {
  pass_duration_->Add({{"pass", pass}}, SecondsBuckets()).Observe(seconds);
}

}  // namespace onnxopt::server
