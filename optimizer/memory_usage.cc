#include "optimizer/memory_usage.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

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

std::optional<int64_t> MemoryAvailable() {
  // An operator's figure first: what jobs may take of a machine shared with other work.
  if (const char* set = std::getenv("ONNXOPT_MEMORY_AVAILABLE_BYTES")) {
    int64_t bytes = 0;
    if (absl::SimpleAtoi(set, &bytes) && bytes >= 0) return bytes;
  }
  std::optional<int64_t> available;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    int64_t kilobytes = 0;
    if (absl::StartsWith(line, "MemAvailable:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(13), "kB")), &kilobytes)) {
      available = kilobytes * 1024;
    }
  }
  auto read_number = [](const char* path) -> std::optional<int64_t> {
    std::ifstream file(path);
    std::string text;
    int64_t value = 0;
    if (!std::getline(file, text) || !absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) return std::nullopt;
    return value;  // "max" (no limit) does not parse
  };
  const std::optional<int64_t> limit = read_number("/sys/fs/cgroup/memory.max");
  const std::optional<int64_t> used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) {
    const int64_t left = std::max<int64_t>(0, *limit - *used);
    available = available ? std::min(*available, left) : left;
  }
  return available;
}

int64_t JobMemoryTarget(int64_t model_bytes) {
  int64_t target = model_bytes + model_bytes / 2 + (int64_t{1} << 30);
  if (const std::optional<int64_t> limit = AddressSpaceLimit()) target = std::min(target, *limit);
  if (const std::optional<int64_t> available = MemoryAvailable()) {
    target = std::min(target, ResidentBytes().value_or(0) + *available);
  }
  return target;
}

bool ModelExceedsMemory(int64_t model_bytes) {
  return ResidentBytes().value_or(0) + model_bytes > JobMemoryTarget(model_bytes);
}

}  // namespace onnxopt
