// TimeCudaGraph (benchmark.h): the optimized model captured once as a CUDA graph and replayed, timed
// in turns with its plain device-resident runs. ONNX Runtime captures after a few runs of its own;
// from the capture on, inputs and outputs must stay at the addresses it recorded, so the outputs of
// the first run become fixed buffers (BoundRun::FixOutputs).
#include "absl/strings/str_cat.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/parity.h"

namespace onnxopt {
namespace {

// Untimed pairs first: ONNX Runtime runs a session a few times before it captures.
constexpr int kWarmupPairs = 5;
constexpr int kMinPairs = 20;

// Whether the replayed outputs are the plain runs' (copied to the host to compare): a capture that
// recorded the wrong buffers shows here.
absl::Status SameOutputs(BoundRun& plain, BoundRun& replayed) {
  const Ort::MemoryInfo host = DeviceMemory(v1::DEVICE_CPU);
  absl::StatusOr<std::vector<Ort::Value>> want =
      CopyValues(plain.output_names(), plain.Outputs(), v1::DEVICE_CUDA, host);
  if (!want.ok()) return want.status();
  absl::StatusOr<std::vector<Ort::Value>> got =
      CopyValues(replayed.output_names(), replayed.Outputs(), v1::DEVICE_CUDA, host);
  if (!got.ok()) return got.status();
  for (size_t i = 0; i < want->size() && i < got->size(); ++i) {
    v1::OutputParity compared;
    CompareOutput((*want)[i], (*got)[i], kDefaultAtol, kDefaultRtol, &compared);
    if (!compared.passed()) {
      return absl::InternalError(absl::StrCat("the replay's output '", plain.output_names()[i],
                                              "' differs from a plain run's (max abs error ",
                                              compared.max_abs_error(), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::CudaGraphTiming> TimeCudaGraph(const ModelSource& optimized, Ort::Session& plain,
                                                  const SessionSettings& settings, const GeneratedInputs& inputs,
                                                  double budget_seconds, const RunContext& run) {
  v1::CudaGraphTiming timing;
  if (settings.device != v1::DEVICE_CUDA) {
    timing.set_reason("CUDA graphs need the CUDA execution provider");
    return timing;
  }
  timing.set_tried(true);
  auto not_qualified = [&timing](absl::string_view why, const absl::Status& status) {
    timing.set_reason(absl::StrCat(why, status.message()));
    return timing;
  };
  SessionSettings graph_settings = settings;
  graph_settings.cuda_graph = true;
  absl::StatusOr<std::unique_ptr<Ort::Session>> session = CreateSession(optimized, graph_settings);
  if (!session.ok()) return not_qualified("ONNX Runtime refuses enable_cuda_graph for it: ", session.status());
  const std::vector<std::string> outputs = OutputNames(plain);
  absl::StatusOr<std::unique_ptr<BoundRun>> replayed =
      BoundRun::Create(**session, inputs, outputs, v1::DEVICE_CUDA, Residence::kDevice);
  if (!replayed.ok()) return not_qualified("", replayed.status());
  if (absl::Status ran = (*replayed)->Run(); !ran.ok()) return not_qualified("its first run failed: ", ran);
  if (absl::Status fixed = (*replayed)->FixOutputs(); !fixed.ok()) return not_qualified("", fixed);
  absl::StatusOr<std::unique_ptr<BoundRun>> direct =
      BoundRun::Create(plain, inputs, outputs, v1::DEVICE_CUDA, Residence::kDevice);
  if (!direct.ok()) return direct.status();
  const TimedRunner runners[2] = {BoundRunner(**direct), BoundRunner(**replayed)};
  absl::StatusOr<std::array<std::vector<double>, 2>> latencies =
      TimeInTurns(runners, kWarmupPairs, kMinPairs, budget_seconds, run);
  if (!latencies.ok()) {
    if (latencies.status().code() == absl::StatusCode::kCancelled) return latencies.status();
    return not_qualified("a captured run failed: ", latencies.status());
  }
  if (absl::Status same = SameOutputs(**direct, **replayed); !same.ok()) return not_qualified("", same);
  timing.set_qualified(true);
  *timing.mutable_optimized() = Summarize((*latencies)[1]);
  const double plain_p50 = Summarize((*latencies)[0]).p50_ms();
  if (timing.optimized().p50_ms() > 0) timing.set_gain(plain_p50 / timing.optimized().p50_ms());
  return timing;
}

}  // namespace onnxopt
