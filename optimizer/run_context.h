// What one run of the optimizer carries down to every step that can take long (passes, parity,
// calibration, benchmarks, generation): whether it has been asked to stop. A step checks it between
// units of work (a pass, a sample, a timing window) and returns CANCELLED.
//
// Progress stays with the stage table (OptimizeRequest::on_progress, PassManagerOptions::on_pass_start):
// only stages report it. The job's wall-time and memory limits are the server's, enforced around the
// worker process (JOB_TIMEOUT, its memory limit), so a run needs no copy of them.
#ifndef ONNXOPT_OPTIMIZER_RUN_CONTEXT_H_
#define ONNXOPT_OPTIMIZER_RUN_CONTEXT_H_

#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace onnxopt {

class RunContext {
 public:
  // A run nothing stops (local commands, tools, tests).
  RunContext() = default;
  // A run that stops once `*cancel_flag` is true (the worker sets it on SIGTERM: a cancel or a drain).
  explicit RunContext(const std::atomic<bool>* cancel_flag) : cancel_flag_(cancel_flag) {}

  bool Cancelled() const { return cancel_flag_ != nullptr && cancel_flag_->load(std::memory_order_relaxed); }

  // OK, or CANCELLED "cancelled <during>" (e.g. "during the benchmark").
  absl::Status CheckNotCancelled(absl::string_view during) const {
    return Cancelled() ? absl::CancelledError(absl::StrCat("cancelled ", during)) : absl::OkStatus();
  }

 private:
  const std::atomic<bool>* cancel_flag_ = nullptr;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_RUN_CONTEXT_H_
