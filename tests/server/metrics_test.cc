// server/metrics.h: /metrics served on its own port, and stopped at once. civetweb (under prometheus-cpp's
// Exposer) looks for a stop only when its accept loop's poll returns, every 2 s unless a connection wakes
// it: a server used to take up to 2 s longer to exit than everything else did.
#include "server/metrics.h"

#include <chrono>
#include <memory>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/scrape_metrics.h"

namespace onnxopt::server {
namespace {

TEST(MetricsTest, ServesItsCountersAndStopsAtOnce) {
  for (int round = 0; round < 3; ++round) {
    auto metrics = std::make_unique<Metrics>();
    absl::StatusOr<int> port = metrics->Serve("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_GT(*port, 0);
    metrics->JobCreated();
    EXPECT_TRUE(absl::StrContains(testing::ScrapeMetrics(*port), "onnxopt_jobs_created_total 1"));
    const auto stopping = std::chrono::steady_clock::now();
    metrics.reset();
    // Without the wake-up each of these stops took 2 s (the poll's whole timeout).
    EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(1)) << "round " << round;
    EXPECT_EQ(testing::ScrapeMetrics(*port), "") << "nothing serves the port any more";
  }
}

TEST(MetricsTest, NotServingIsPortZeroAndStopsTrivially) {
  Metrics metrics;
  absl::StatusOr<int> port = metrics.Serve("");
  ASSERT_TRUE(port.ok());
  EXPECT_EQ(*port, 0);
}

}  // namespace
}  // namespace onnxopt::server
