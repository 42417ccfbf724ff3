// Errors with a stable reason (optimizer/failure.h): the message reads "REASON: text", the reason
// travels as a payload, and a status without one is named after its code.
#include "optimizer/failure.h"

#include <gtest/gtest.h>

#include "absl/status/statusor.h"

namespace onnxopt {
namespace {

TEST(FailureTest, TheMessageStartsWithTheReasonAndTheReasonTravelsBesideIt) {
  const absl::Status status = Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED,
                                      "the file is not a model");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "MODEL_PARSE_FAILED: the file is not a model");
  EXPECT_EQ(ReasonOf(status), v1::ErrorReason::MODEL_PARSE_FAILED);
  EXPECT_EQ(TextOf(status), "the file is not a model");
  EXPECT_EQ(ReasonName(ReasonOf(status)), "MODEL_PARSE_FAILED");
  // Copies, StatusOr and moves keep it.
  absl::StatusOr<int> carried = status;
  EXPECT_EQ(ReasonOf(carried.status()), v1::ErrorReason::MODEL_PARSE_FAILED);
}

TEST(FailureTest, AStatusWithoutAReasonIsNamedAfterItsCodeAndItsMessageIsNotParsed) {
  EXPECT_EQ(ReasonOf(absl::InternalError("QUEUE_FULL: looks like a reason")), v1::ErrorReason::INTERNAL);
  EXPECT_EQ(TextOf(absl::InternalError("QUEUE_FULL: looks like a reason")), "QUEUE_FULL: looks like a reason");
  EXPECT_EQ(ReasonOf(absl::DeadlineExceededError("late")), v1::ErrorReason::DEADLINE_EXCEEDED);
  EXPECT_EQ(ReasonOf(absl::UnauthenticatedError("who")), v1::ErrorReason::UNAUTHENTICATED);
  EXPECT_EQ(ReasonOf(absl::OkStatus()), v1::ErrorReason::REASON_UNSPECIFIED);
  // Every absl code maps to the reason of the same name.
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "x");
    EXPECT_EQ(ReasonName(ReasonOf(status)), absl::StatusCodeToString(status.code())) << code;
  }
}

TEST(FailureTest, WithReasonKeepsTheMessageAsItIs) {
  const absl::Status rebuilt = WithReason(absl::AbortedError("PARITY_FAILED: outputs differ"),
                                          v1::ErrorReason::PARITY_FAILED);
  EXPECT_EQ(rebuilt.message(), "PARITY_FAILED: outputs differ");
  EXPECT_EQ(ReasonOf(rebuilt), v1::ErrorReason::PARITY_FAILED);
  EXPECT_EQ(TextOf(rebuilt), "outputs differ");
  EXPECT_TRUE(WithReason(absl::OkStatus(), v1::ErrorReason::PARITY_FAILED).ok());
}

}  // namespace
}  // namespace onnxopt
