// The line protocol between onnxopt-server and an onnxopt-worker child, on the child's stdout:
//   progress <phase> <done> <total> <pass>      any number of times
//   status <code> <message>                     once, last; <code> is an absl::StatusCode number
// The worker also leaves report.pb (complete or partial) and the model files in its output folder.
// A child that exits without a status line crashed, and its job fails with WORKER_CRASHED.
#ifndef ONNXOPT_SERVER_WORKER_PROTOCOL_H_
#define ONNXOPT_SERVER_WORKER_PROTOCOL_H_

#include <string>

#include "absl/status/status.h"
#include "optimizer/optimize.h"

namespace onnxopt::server {

std::string FormatProgress(Phase phase, int done, int total, const std::string& pass);
std::string FormatStatus(const absl::Status& status);

struct WorkerLine {
  enum class Kind { kProgress, kStatus, kOther } kind = Kind::kOther;
  Phase phase = Phase::kLoading;
  int done = 0;
  int total = 0;
  std::string pass;
  absl::Status status;
};
WorkerLine ParseWorkerLine(const std::string& line);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_WORKER_PROTOCOL_H_
