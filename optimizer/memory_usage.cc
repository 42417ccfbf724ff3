#include "optimizer/memory_usage.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace onnxopt {
namespace {

// The highest peak cleared by a reset since the window started.
std::atomic<int64_t> cleared_peak{0};

void RaiseClearedPeak(int64_t peak) {
  int64_t known = cleared_peak.load();
  while (peak > known && !cleared_peak.compare_exchange_weak(known, peak)) {
  }
}

bool ClearKernelPeak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";  // resets VmHWM to the current resident size
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace

std::optional<int64_t> ProcStatusBytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, key + ":")) continue;
    std::string digits;
    for (char c : line) {
      if (std::isdigit(static_cast<unsigned char>(c))) digits += c;
    }
    int64_t kilobytes = 0;
    if (absl::SimpleAtoi(digits, &kilobytes)) return kilobytes * 1024;
  }
  return std::nullopt;
}

std::optional<int64_t> ResidentBytes() { return ProcStatusBytes("VmRSS"); }

bool ResetResidentPeak() {
  if (std::optional<int64_t> peak = ProcStatusBytes("VmHWM")) RaiseClearedPeak(*peak);
  return ClearKernelPeak();
}

void StartResidentPeakWindow() {
  cleared_peak.store(0);
  ClearKernelPeak();
}

std::optional<int64_t> ResidentPeakInWindow() {
  const std::optional<int64_t> peak = ProcStatusBytes("VmHWM");
  if (!peak) return std::nullopt;
  return std::max(*peak, cleared_peak.load());
}

std::optional<int64_t> AddressSpaceLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<int64_t>(limit.rlim_cur);
}

int64_t JobMemoryTarget(int64_t model_bytes) {
  const int64_t target = model_bytes + model_bytes / 2 + (int64_t{1} << 30);
  const std::optional<int64_t> limit = AddressSpaceLimit();
  return limit ? std::min(target, *limit) : target;
}

}  // namespace onnxopt
