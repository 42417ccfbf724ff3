// The process's resident memory, as the kernel counts it (/proc/self/status), for the report's memory
// section and the benchmark's per-session figures. The kernel keeps one peak (VmHWM) and lets a process
// reset it (/proc/self/clear_refs); every reset goes through ResetResidentPeak, which first folds the
// peak it clears into the current window's, so a measurement inside a stage never hides the stage's peak.
#ifndef ONNXOPT_OPTIMIZER_MEMORY_USAGE_H_
#define ONNXOPT_OPTIMIZER_MEMORY_USAGE_H_

#include <cstdint>
#include <optional>
#include <string>

namespace onnxopt {

// A "Name:   123 kB" line of /proc/self/status ("VmRSS", "VmHWM"), in bytes.
std::optional<int64_t> ProcStatusBytes(const std::string& key);
std::optional<int64_t> ResidentBytes();

// Resets the kernel's peak to the current resident size, keeping the peak it clears for
// ResidentPeakInWindow; false where the kernel does not allow it.
bool ResetResidentPeak();
// Starts a new window: what came before no longer counts.
void StartResidentPeakWindow();
// The highest resident size since StartResidentPeakWindow (or the process's start), resets included.
std::optional<int64_t> ResidentPeakInWindow();

// The address-space limit of this process (RLIMIT_AS, as the server sets it on a job's worker); none
// when unlimited.
std::optional<int64_t> AddressSpaceLimit();

// Memory the process could still take: the kernel's MemAvailable (/proc/meminfo), within the cgroup's
// limit (memory.max less memory.current, cgroup v2) where one is set; none where neither is readable.
// The environment's ONNXOPT_MEMORY_AVAILABLE_BYTES, where set, replaces both (a machine shared with
// other work; tests that make a small model "larger than memory").
std::optional<int64_t> MemoryAvailable();

// What a job may hold at once: 1.5x the original's bytes plus 1 GiB (graphs, inputs, outputs, ONNX
// Runtime's arenas), within the address-space limit and within what the machine has (resident now plus
// MemoryAvailable). Two sessions that would not fit in it together take turns (BenchmarkSessions); a
// model that alone does not fit is run from its memory-mapped files (ModelExceedsMemory).
int64_t JobMemoryTarget(int64_t model_bytes);

// Whether a session of a model of `model_bytes` would not fit beside what the process holds: its
// weights must then stay in their memory-mapped files (no prepacked copies), each run reading them
// from the disk again.
bool ModelExceedsMemory(int64_t model_bytes);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_MEMORY_USAGE_H_
