// The process's resident memory: a stage's peak survives a reset made inside it (as the benchmark's
// per-session measurement makes one), and the job's memory target is 1.5x the model + 1 GiB.
#include "optimizer/memory_usage.h"

#include <sys/mman.h>
#include <sys/resource.h>

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
  EXPECT_EQ(JobMemoryTarget(4 * (int64_t{1} << 30)), 7 * (int64_t{1} << 30));
  EXPECT_FALSE(AddressSpaceLimit().has_value());
  rlimit limited = saved;
  limited.rlim_cur = static_cast<rlim_t>(int64_t{64} << 30);
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &limited), 0);
  EXPECT_EQ(AddressSpaceLimit(), int64_t{64} << 30);
  EXPECT_EQ(JobMemoryTarget(int64_t{100} << 30), int64_t{64} << 30) << "bounded by the limit";
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &saved), 0);
}

}  // namespace
}  // namespace onnxopt
