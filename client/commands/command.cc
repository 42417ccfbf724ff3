#include "client/commands/command.h"

#include <iostream>

namespace onnxopt::cli {

int ExitFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return kOk;
    case absl::StatusCode::kCancelled: return kCancelled;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists: return kRejected;
    case absl::StatusCode::kAborted: return kJobFailed;
    default: return kServerError;
  }
}

int ExitForJob(const v1::Job& job) {
  switch (job.state()) {
    case v1::SUCCEEDED: return kOk;
    case v1::CANCELLED: return kCancelled;
    default: return kJobFailed;
  }
}

int Fail(const absl::Status& status) {
  std::cerr << "onnxopt: " << absl::StatusCodeToString(status.code()) << ": " << status.message() << std::endl;
  return ExitFor(status);
}

}  // namespace onnxopt::cli
