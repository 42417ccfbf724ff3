// The process's resident memory: a stage's peak survives a reset made inside it (as the benchmark's
// per-session measurement makes one), and the job's memory target is 1.5x the model + 1 GiB.
#include "optimizer/memory_usage.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>

#include "gtest/gtest.h"

namespace onnxopt {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Maps and touches `bytes`, so that they are resident, then unmaps them (no allocator keeps them).
void TouchAndFree(int64_t bytes) {
  void* block = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(block, MAP_FAILED);
  std::memset(block, 1, static_cast<size_t>(bytes));
  ::munmap(block, static_cast<size_t>(bytes));
}

TEST(MemoryUsageTest, AResetInsideAWindowKeepsTheWindowsPeak) {
  ASSERT_TRUE(ResidentBytes().has_value());
  StartResidentPeakWindow();
  const int64_t before = *ResidentBytes();
  TouchAndFree(256 * kMiB);
  if (!ResetResidentPeak()) GTEST_SKIP() << "the kernel does not let this process reset its peak";
  const std::optional<int64_t> peak = ResidentPeakInWindow();
  ASSERT_TRUE(peak.has_value());
  EXPECT_GE(*peak, before + 200 * kMiB) << "the 256 MiB touched before the reset";
  // A new window forgets it.
  StartResidentPeakWindow();
  EXPECT_LT(*ResidentPeakInWindow(), before + 200 * kMiB);
}

TEST(MemoryUsageTest, TheJobTargetIsOneAndAHalfTheModelPlusAGibibyteWithinTheAddressSpaceLimit) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &saved), 0);
  if (saved.rlim_cur != RLIM_INFINITY) GTEST_SKIP() << "this process already runs under an address-space limit";
  const std::optional<int64_t> available = MemoryAvailable();
  ASSERT_TRUE(available.has_value()) << "/proc/meminfo has MemAvailable";
  if (*available < 8 * (int64_t{1} << 30)) GTEST_SKIP() << "less than 8 GiB available: the machine bounds the target";
  EXPECT_EQ(JobMemoryTarget(4 * (int64_t{1} << 30)), 7 * (int64_t{1} << 30));
  EXPECT_FALSE(AddressSpaceLimit().has_value());
  rlimit limited = saved;
  limited.rlim_cur = static_cast<rlim_t>(int64_t{64} << 30);
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &limited), 0);
  EXPECT_EQ(AddressSpaceLimit(), int64_t{64} << 30);
  const int64_t machine = ResidentBytes().value_or(0) + *MemoryAvailable();
  EXPECT_EQ(JobMemoryTarget(int64_t{100} << 30), std::min(int64_t{64} << 30, machine))
      << "bounded by the limit and by what the machine has";
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &saved), 0);
}

// A model bigger than what is left of the machine is run from its mapped files; one that fits is not.
TEST(MemoryUsageTest, AModelBeyondWhatTheMachineHasExceedsMemory) {
  const std::optional<int64_t> available = MemoryAvailable();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0);
  EXPECT_LE(JobMemoryTarget(2 * *available), ResidentBytes().value_or(0) + *available);
  EXPECT_TRUE(ModelExceedsMemory(2 * *available + (int64_t{1} << 30)));
  EXPECT_FALSE(ModelExceedsMemory(int64_t{1} << 20));
}

}  // namespace
}  // namespace onnxopt
