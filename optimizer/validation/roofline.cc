#include "optimizer/validation/roofline.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "optimizer/model_io.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

constexpr size_t kProbeBytes = size_t{512} << 20;
constexpr int kProbePasses = 5;

// 32-byte lanes: the probe reads as wide as the cores can, or it measures its own loop and not memory
// (four scalar sums read 15.7 GB/s here where these read 21-22).
typedef uint64_t Lanes __attribute__((vector_size(32)));

// The sum of words[begin, end), in four independent lane sums so that the loads are not serialized;
// built for AVX2 and for any x86-64, picked when the program loads.
__attribute__((target_clones("avx2", "default"))) uint64_t SumWords(const uint64_t* words, size_t begin,
                                                                     size_t end) {
  Lanes a{}, b{}, c{}, d{};
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    Lanes x, y, z, w;
    std::memcpy(&x, words + i, sizeof(Lanes));
    std::memcpy(&y, words + i + 4, sizeof(Lanes));
    std::memcpy(&z, words + i + 8, sizeof(Lanes));
    std::memcpy(&w, words + i + 12, sizeof(Lanes));
    a += x;
    b += y;
    c += z;
    d += w;
  }
  const Lanes sum = a + b + c + d;
  uint64_t total = sum[0] + sum[1] + sum[2] + sum[3];
  for (; i < end; ++i) total += words[i];
  return total;
}

// One pass: every thread sums its slice; the seconds it took.
double SumOnce(const uint64_t* words, size_t count, int threads, std::vector<uint64_t>* sums) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const size_t begin = count * static_cast<size_t>(t) / static_cast<size_t>(threads);
      const size_t end = count * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
      (*sums)[static_cast<size_t>(t)] = SumWords(words, begin, end);
    });
  }
  for (auto& worker : workers) worker.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A past input's or present output's bytes at the step's lengths; 0 where a dim other than the cache
// axis and the batch is not a number, or the element type has no fixed size.
int64_t CacheTensorBytes(const onnx::ValueInfoProto& value, int axis, int64_t batch, int64_t length) {
  const auto& tensor = value.type().tensor_type();
  int64_t elements = 1;
  for (int i = 0; i < tensor.shape().dim_size(); ++i) {
    const auto& dim = tensor.shape().dim(i);
    if (i == axis) {
      elements *= length;
    } else if (i == 0) {
      elements *= batch;
    } else if (dim.has_dim_value()) {
      elements *= dim.dim_value();
    } else {
      return 0;
    }
  }
  return elements * static_cast<int64_t>(ElementSize(tensor.elem_type()));
}

const onnx::ValueInfoProto* Find(const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& values,
                                 const std::string& name) {
  for (const auto& value : values) {
    if (value.name() == name) return &value;
  }
  return nullptr;
}

// True if input `i` of `node` is a table it reads rows of: a Gather's data, or EmbedLayerNormalization's
// word, position and segment embeddings (its inputs 2, 3 and 4).
bool IsLookupTable(const onnx::NodeProto& node, int i) {
  if (node.op_type() == "Gather" || node.op_type() == "GatherBlockQuantized") return i == 0;
  return node.op_type() == "EmbedLayerNormalization" && node.domain() == "com.microsoft" && i >= 2 && i <= 4;
}

}  // namespace

double MemoryReadBandwidth(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  static std::mutex mutex;
  static std::map<int, double> measured;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = measured.find(threads); it != measured.end()) return it->second;
  const size_t count = kProbeBytes / sizeof(uint64_t);
  // Mapped and unmapped here, not kept by the allocator: the probe's memory is gone when it returns.
  void* mapped = ::mmap(nullptr, kProbeBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return 0;
  auto* words = static_cast<uint64_t*>(mapped);
  for (size_t i = 0; i < count; ++i) words[i] = i;  // maps every page in before the timed passes
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  double best = 0;
  for (int pass = 0; pass < kProbePasses; ++pass) {
    const double seconds = SumOnce(words, count, threads, &sums);
    if (seconds > 0) best = std::max(best, static_cast<double>(kProbeBytes) / seconds);
  }
  ::munmap(mapped, kProbeBytes);
  measured[threads] = best;
  return best;
}

int64_t StepBytes(const onnx::ModelProto& model, const CacheInterface& cache, int64_t batch, int64_t past,
                  int64_t new_tokens) {
  const onnx::GraphProto& graph = model.graph();
  // Initializers read only as lookup tables give the rows looked up; any other reader reads them whole.
  std::map<std::string, bool> only_gathered;
  for (const auto& node : graph.node()) {
    for (int i = 0; i < node.input_size(); ++i) {
      const bool table = IsLookupTable(node, i);
      auto [entry, added] = only_gathered.emplace(node.input(i), table);
      if (!added) entry->second = entry->second && table;
    }
  }
  int64_t bytes = 0;
  for (const auto& tensor : graph.initializer()) {
    auto read = only_gathered.find(tensor.name());
    if (read == only_gathered.end()) continue;
    const int64_t size = TensorDataBytes(tensor);
    if (read->second && tensor.dims_size() > 0 && tensor.dims(0) > 0) {
      bytes += size / tensor.dims(0) * std::min(tensor.dims(0), batch * new_tokens);
    } else {
      bytes += size;
    }
  }
  for (const auto& entry : cache.entries) {
    if (const onnx::ValueInfoProto* input = Find(graph.input(), entry.past)) {
      bytes += CacheTensorBytes(*input, entry.axis, batch, past);
    }
    if (const onnx::ValueInfoProto* output = Find(graph.output(), entry.present)) {
      bytes += CacheTensorBytes(*output, entry.axis, batch, past + new_tokens);
    }
  }
  return bytes;
}

void DescribeRoofline(const onnx::ModelProto& original, const onnx::ModelProto& optimized, double bandwidth,
                      v1::GenerationReport* report) {
  const std::optional<CacheInterface> cache = FindCacheInterface(original.graph());
  if (!cache || bandwidth <= 0) return;
  report->set_memory_bandwidth_bytes_per_second(bandwidth);
  for (v1::GenerationPhase& phase : *report->mutable_phases()) {
    if (phase.phase() != "decode" || !phase.error().empty()) continue;
    const int64_t original_bytes = StepBytes(original, *cache, phase.batch(), phase.past(), phase.new_tokens());
    const int64_t optimized_bytes = StepBytes(optimized, *cache, phase.batch(), phase.past(), phase.new_tokens());
    phase.set_original_bytes_per_step(original_bytes);
    phase.set_optimized_bytes_per_step(optimized_bytes);
    // The fastest a step can be (its bytes at the bandwidth) over how fast it was.
    if (phase.original().p50_ms() > 0) {
      phase.set_original_roofline_fraction(original_bytes / bandwidth / (phase.original().p50_ms() / 1000));
    }
    if (phase.optimized().p50_ms() > 0) {
      phase.set_optimized_roofline_fraction(optimized_bytes / bandwidth / (phase.optimized().p50_ms() / 1000));
    }
  }
}

}  // namespace onnxopt
