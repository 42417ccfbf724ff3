#include "optimizer/precision.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "optimizer/config_enums.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_registry.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/precision/weight_products.h"
#include "optimizer/passes/rewrite.h"
#include "optimizer/validation/projection_error.h"

namespace onnxopt {
namespace {

// precision.keep_io_types, default true.
bool KeepsIoTypes(const v1::PrecisionConfig& precision) {
  return !precision.has_keep_io_types() || precision.keep_io_types();
}

constexpr size_t kMaxKeptNodesReported = 200;
// Operator types a mode may keep for want of a kernel before the search gives up on loading.
constexpr int kMaxMissingKernelRetries = 40;
constexpr int kDefaultCalibrationSamples = 16;
constexpr int kMaxCalibrationSamples = 1000;
// Generated calibration inputs are numbered from here, apart from the parity check's samples.
constexpr int kFirstCalibrationSample = 1000;

const char* PassFor(PrecisionMode mode) {
  switch (mode) {
    case v1::PrecisionConfig::fp16:
    case v1::PrecisionConfig::bf16: return "convert_float_precision";
    case v1::PrecisionConfig::int8_dynamic: return "quantize_dynamic_int8";
    case v1::PrecisionConfig::int8_static: return "quantize_static_int8";
    case v1::PrecisionConfig::int4_weight_only: return "quantize_weights_int4";
    default: return nullptr;
  }
}

bool IsFloatMode(PrecisionMode mode) { return mode == v1::PrecisionConfig::fp16 || mode == v1::PrecisionConfig::bf16; }

google::protobuf::Value StringValue(const std::string& text) {
  google::protobuf::Value value;
  value.set_string_value(text);
  return value;
}

google::protobuf::Value NumberValue(double number) {
  google::protobuf::Value value;
  value.set_number_value(number);
  return value;
}

google::protobuf::Value BoolValue(bool flag) {
  google::protobuf::Value value;
  value.set_bool_value(flag);
  return value;
}

std::string JoinSet(const std::set<std::string>& items) { return absl::StrJoin(items, ","); }

}  // namespace

bool ChangesFloatInterface(const v1::PrecisionConfig& precision, PrecisionMode mode) {
  return !KeepsIoTypes(precision) && IsFloatMode(mode);
}

bool PrecisionRequested(const v1::PrecisionConfig& precision) { return precision.mode() != v1::PrecisionConfig::fp32; }

v1::Int4Config::Storage LmHeadStorage(const v1::Int4Config& int4) {
  return int4.has_lm_head() ? int4.lm_head() : v1::Int4Config::int4;
}

v1::Int4Config::Storage EmbeddingStorage(const v1::Int4Config& int4) {
  return int4.has_embeddings() ? int4.embeddings() : v1::Int4Config::float_;
}

absl::Status CheckPrecisionConfig(const v1::PrecisionConfig& precision) {
  const v1::Int4Config& int4 = precision.int4();
  for (const auto& [type, value, what] :
       {std::tuple{v1::PrecisionConfig::Mode_descriptor(), static_cast<int>(precision.mode()), "precision.mode"},
        std::tuple{v1::CalibrationConfig::Method_descriptor(), static_cast<int>(precision.calibration().method()),
                   "precision.calibration.method"},
        std::tuple{v1::Int4Config::Method_descriptor(), static_cast<int>(int4.method()), "precision.int4.method"},
        std::tuple{v1::Int4Config::Storage_descriptor(), static_cast<int>(int4.lm_head()), "precision.int4.lm_head"},
        std::tuple{v1::Int4Config::Storage_descriptor(), static_cast<int>(int4.embeddings()),
                   "precision.int4.embeddings"}}) {
    if (absl::Status status = CheckEnumValue(type, value, what); !status.ok()) return status;
  }
  if (precision.calibration().samples() < 0 || precision.calibration().samples() > kMaxCalibrationSamples) {
    return absl::InvalidArgumentError(
        absl::StrCat("precision.calibration.samples must be 0 (default 16) to ", kMaxCalibrationSamples));
  }
  if (int4.block_size() != 0 &&
      (int4.block_size() < 16 || int4.block_size() > 256 || (int4.block_size() & (int4.block_size() - 1)) != 0)) {
    return absl::InvalidArgumentError("precision.int4.block_size must be 16, 32, 64, 128 or 256");
  }
  if (int4.accuracy_level() < 0 || int4.accuracy_level() > 4) {
    return absl::InvalidArgumentError("precision.int4.accuracy_level must be 0..4");
  }
  if (int4.method() == v1::Int4Config::hqq && int4.has_symmetric() && int4.symmetric()) {
    return absl::InvalidArgumentError(
        "precision.int4.method hqq solves a zero point per block: it cannot be combined with symmetric true");
  }
  for (const auto* names : {&precision.op_block_list(), &precision.node_block_list()}) {
    for (const auto& name : *names) {
      if (name.empty() || name.find(',') != std::string::npos) {
        return absl::InvalidArgumentError("precision block lists take one non-empty name per entry, without commas");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Pipeline> BuildPrecisionPipeline(const v1::PrecisionConfig& precision, const PassRegistry& registry,
                                                const PrecisionExtras& extras) {
  if (!PrecisionRequested(precision)) return Pipeline{};
  if (absl::Status status = CheckPrecisionConfig(precision); !status.ok()) return status;
  const PrecisionMode mode = precision.mode();
  std::set<std::string> ops(precision.op_block_list().begin(), precision.op_block_list().end());
  ops.insert(extras.keep_ops.begin(), extras.keep_ops.end());
  std::set<std::string> nodes(precision.node_block_list().begin(), precision.node_block_list().end());
  nodes.insert(extras.keep_nodes.begin(), extras.keep_nodes.end());

  v1::OptimizationConfig config;
  v1::PassSpec* spec = config.add_passes();
  spec->set_name(PassFor(mode));
  auto& params = *spec->mutable_params();
  params["node_block_list"] = StringValue(JoinSet(nodes));
  if (IsFloatMode(mode)) {
    params["to"] = StringValue(v1::PrecisionConfig::Mode_Name(mode));
    params["keep_io_types"] = BoolValue(KeepsIoTypes(precision));
    params["op_block_list"] = StringValue(JoinSet(ops));
  } else {
    std::set<std::string> forms = {"MatMul", "Gemm", "Attention"};
    for (const auto& op : ops) forms.erase(op);
    params["op_types"] = StringValue(JoinSet(forms));
    if (mode == v1::PrecisionConfig::int8_dynamic || mode == v1::PrecisionConfig::int8_static) {
      params["per_channel"] = BoolValue(!precision.has_per_channel() || precision.per_channel());
      std::set<std::string> tables = {"EmbedLayerNormalization", "Gather"};
      for (const auto& op : ops) tables.erase(op);
      if (!tables.empty()) {
        v1::PassSpec* embeddings = config.add_passes();
        embeddings->set_name("quantize_embeddings_int8");
        (*embeddings->mutable_params())["op_types"] = StringValue(JoinSet(tables));
        (*embeddings->mutable_params())["node_block_list"] = StringValue(JoinSet(nodes));
      }
    } else {
      const v1::Int4Config& int4 = precision.int4();
      const v1::Int4Config::Method method = int4.method();
      params["block_size"] = NumberValue(int4.block_size() > 0 ? int4.block_size() : 32);
      // hqq solves zero points, so it defaults to asymmetric blocks (an explicit true was refused above).
      params["symmetric"] =
          BoolValue(method == v1::Int4Config::hqq ? false : !int4.has_symmetric() || int4.symmetric());
      params["method"] = StringValue(v1::Int4Config::Method_Name(method));
      params["lm_head"] = StringValue(v1::Int4Config::Storage_Name(LmHeadStorage(int4)));
      // Unset: int8 compute (4), the fastest on the CPU (tests/bench/generation_benchmark.py: a decode step
      // 3.3x the float32 original against 1.7x with float32 compute); other devices ignore it.
      params["accuracy_level"] = NumberValue(int4.accuracy_level() > 0 ? int4.accuracy_level() : 4);
      if (EmbeddingStorage(int4) == v1::Int4Config::int8 && ops.count("Gather") == 0) {
        v1::PassSpec* embeddings = config.add_passes();
        embeddings->set_name("quantize_embeddings_int8");
        (*embeddings->mutable_params())["op_types"] = StringValue("Gather");
        (*embeddings->mutable_params())["node_block_list"] = StringValue(JoinSet(nodes));
      } else if (EmbeddingStorage(int4) == v1::Int4Config::int4 && ops.count("Gather") == 0) {
        v1::PassSpec* embeddings = config.add_passes();
        embeddings->set_name("quantize_embeddings_int4");
        (*embeddings->mutable_params())["block_size"] = params["block_size"];
        (*embeddings->mutable_params())["node_block_list"] = StringValue(JoinSet(nodes));
      }
    }
  }
  // What the rewrite leaves behind: unread weights (replaced by their converted copies), dead Casts.
  config.add_passes()->set_name("eliminate_dead_nodes");
  config.add_passes()->set_name("eliminate_unused_initializers");
  absl::StatusOr<Pipeline> pipeline = BuildPipeline(config, registry);
  if (pipeline.ok()) pipeline->activation_ranges = extras.activation_ranges;
  return pipeline;
}

absl::Status ApplyPrecision(const v1::PrecisionConfig& precision, const PrecisionExtras& extras,
                            const PassManagerOptions& options, onnx::ModelProto* model,
                            std::vector<v1::PassReport>* runs) {
  absl::StatusOr<Pipeline> pipeline = BuildPrecisionPipeline(precision, DefaultPassRegistry(), extras);
  if (!pipeline.ok()) return pipeline.status();
  return RunPipeline(*pipeline, model, options, runs);
}

absl::StatusOr<std::map<std::string, ValueRange>> CalibrateActivations(
    const onnx::ModelProto& fp32_model, const onnx::ModelProto& original, const v1::PrecisionConfig& precision,
    const v1::ValidationConfig& validation, const std::vector<SuppliedSample>& supplied,
    const SessionSettings& device, const RunContext& run, std::string* warning) {
  std::vector<std::string> values;
  {
    onnx::ModelProto copy = fp32_model;
    Graph graph(copy.mutable_graph());
    const std::set<std::string> forms = {"MatMul", "Gemm", "Attention"};
    for (const auto& value : WeightProductInputs(graph, forms)) values.push_back(value);
  }
  const int wanted = precision.calibration().samples() > 0 ? precision.calibration().samples() : kDefaultCalibrationSamples;
  const int count = supplied.empty() ? wanted : std::min<int>(wanted, static_cast<int>(supplied.size()));
  const std::vector<DimValues> shape_sets = InputShapeSets(validation, !supplied.empty(), original);
  auto make_samples = [&](Ort::Session& session) -> absl::StatusOr<std::vector<GeneratedInputs>> {
    std::vector<GeneratedInputs> samples;
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<GeneratedInputs> inputs =
          supplied.empty()
              ? GenerateInputs(session, original, validation, shape_sets[static_cast<size_t>(i) % shape_sets.size()],
                               kFirstCalibrationSample + i)
              : GenerateInputs(session, original, validation, shape_sets.front(), i, &supplied[static_cast<size_t>(i)]);
      if (!inputs.ok()) return inputs.status();
      samples.push_back(*std::move(inputs));
    }
    return samples;
  };
  if (!values.empty() && supplied.empty()) {
    *warning = absl::StrCat("int8_static was calibrated on ", count,
                            " generated input sets: generated data is a poor calibration set, so the ranges may not "
                            "match real inputs; supply real inputs with the job for a calibration you can trust");
  }
  return CalibrateRanges(fp32_model, values, make_samples,
                         v1::CalibrationConfig::Method_Name(precision.calibration().method()), device, run);
}

void DescribeInt4Errors(const onnx::ModelProto& fp32_model, const onnx::ModelProto& converted,
                        const onnx::ModelProto& original, const v1::PrecisionConfig& precision,
                        const v1::ValidationConfig& validation, const std::vector<SuppliedSample>& supplied,
                        const SessionSettings& device, const RunContext& run,
                        const std::function<absl::Status()>& activations_fit, v1::PrecisionReport* report) {
  const BlockMethod method =
      precision.int4().method() == v1::Int4Config::hqq ? BlockMethod::kHalfQuadratic : BlockMethod::kRoundToNearest;
  CaptureActivations capture = [&](const std::vector<std::string>& values,
                                   std::map<std::string, ActivationRows>* out) -> absl::Status {
    if (absl::Status fits = activations_fit(); !fits.ok()) return fits;
    const std::vector<DimValues> shape_sets = InputShapeSets(validation, !supplied.empty(), original);
    return CaptureValues(
        fp32_model, values,
        [&](Ort::Session& session) {
          return supplied.empty() ? GenerateInputs(session, original, validation, shape_sets.front(), 0)
                                  : GenerateInputs(session, original, validation, shape_sets.front(), 0, &supplied[0]);
        },
        device, run,
        [&](const std::string& name, const std::vector<int64_t>& shape, const float* data) {
          (*out)[name] = ProjectionRows(shape, data);
        });
  };
  DescribeProjectionErrors(fp32_model, converted, method, capture, report);
}

void DescribePrecision(const v1::PrecisionConfig& precision, const onnx::ModelProto& fp32_model,
                       const onnx::ModelProto& converted, const std::vector<v1::PassReport>& runs,
                       v1::PrecisionReport* report) {
  report->set_mode(v1::PrecisionConfig::Mode_Name(precision.mode()));
  report->set_size_before_bytes(ModelBytes(fp32_model));
  report->set_size_after_bytes(ModelBytes(converted));
  const char* pass = PassFor(precision.mode());
  for (const auto& run : runs) {
    if (pass == nullptr || (run.name() != pass && run.name() != "quantize_embeddings_int8" &&
                             run.name() != "quantize_embeddings_int4")) {
      continue;
    }
    auto counter = [&](const char* name) {
      auto it = run.counters().find(name);
      return it == run.counters().end() ? int64_t{0} : it->second;
    };
    report->set_converted_nodes(report->converted_nodes() + counter("converted_nodes") + counter("quantized_weights"));
    report->set_clamped_weights(report->clamped_weights() + counter("clamped_weights"));
    report->set_quantized_weights(report->quantized_weights() + counter("quantized_weights"));
    report->set_weight_bytes_before(report->weight_bytes_before() + counter("weight_bytes_before"));
    report->set_weight_bytes_after(report->weight_bytes_after() + counter("weight_bytes_after"));
    for (const auto& note : run.notes()) {
      if (static_cast<size_t>(report->kept_nodes_size()) >= kMaxKeptNodesReported) break;
      std::vector<std::string> fields = absl::StrSplit(note, absl::MaxSplits('\t', 2));
      if (fields.size() != 3) continue;
      v1::KeptNode* kept = report->add_kept_nodes();
      kept->set_node(fields[0]);
      kept->set_op_type(fields[1]);
      kept->set_reason(fields[2]);
    }
  }
}

onnx::ModelProto WithOriginalInterface(const onnx::ModelProto& candidate, const onnx::ModelProto& original) {
  std::map<std::string, int32_t> original_types;
  for (const auto* values : {&original.graph().input(), &original.graph().output()}) {
    for (const auto& value : *values) original_types[value.name()] = value.type().tensor_type().elem_type();
  }
  auto retyped = [&](const onnx::ValueInfoProto& value) {
    auto it = original_types.find(value.name());
    return it != original_types.end() && it->second == onnx::TensorProto::FLOAT &&
           value.type().tensor_type().elem_type() != onnx::TensorProto::FLOAT;
  };
  onnx::ModelProto view = candidate;
  onnx::GraphProto* graph = view.mutable_graph();
  std::map<std::string, std::string> renamed;  // interface name -> its inner (lower precision) name
  std::vector<onnx::NodeProto> input_casts, output_casts;
  auto cast = [](const std::string& from, const std::string& to, int32_t type) {
    onnx::NodeProto node = MakeNode("Cast", absl::StrCat(to, "_interface_cast"), {from}, {to});
    *node.add_attribute() = MakeIntAttribute("to", type);
    return node;
  };
  for (auto* values : {graph->mutable_input(), graph->mutable_output()}) {
    const bool inputs = values == graph->mutable_input();
    for (auto& value : *values) {
      if (!retyped(value)) continue;
      const int32_t inner_type = value.type().tensor_type().elem_type();
      const std::string inner = absl::StrCat(value.name(), "_interface_inner");
      renamed[value.name()] = inner;
      value.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
      if (inputs) input_casts.push_back(cast(value.name(), inner, inner_type));
      else output_casts.push_back(cast(inner, value.name(), onnx::TensorProto::FLOAT));
    }
  }
  if (renamed.empty()) return view;
  for (auto& node : *graph->mutable_node()) {
    for (auto& name : *node.mutable_input()) {
      auto it = renamed.find(name);
      if (it != renamed.end()) name = it->second;
    }
    for (auto& name : *node.mutable_output()) {
      auto it = renamed.find(name);
      if (it != renamed.end()) name = it->second;
    }
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (auto& node : input_casts) *nodes.Add() = std::move(node);
  for (auto& node : *graph->mutable_node()) *nodes.Add() = std::move(node);
  for (auto& node : output_casts) *nodes.Add() = std::move(node);
  graph->mutable_node()->Swap(&nodes);
  return view;
}

std::optional<std::string> MissingKernelOp(const std::string& message) {
  static const std::string kMarker = "Could not find an implementation for ";
  const size_t at = message.find(kMarker);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + kMarker.size();
  const size_t end = message.find('(', begin);
  if (end == std::string::npos || end == begin) return std::nullopt;
  return message.substr(begin, end - begin);
}

std::vector<MeasuredError> WorstProjections(const v1::PrecisionReport& measured) {
  std::vector<MeasuredError> worst;
  for (const auto& projection : measured.projections()) {
    worst.push_back({projection.node(), projection.output_error() >= 0
                                            ? absl::StrFormat("output error %.4f", projection.output_error())
                                            : absl::StrFormat("weight error %.4f", projection.weight_error())});
  }
  return worst;
}

void KeepProjectionsStillQuantized(const v1::PrecisionReport& measured, const std::vector<v1::KeptNode>& kept,
                                   v1::PrecisionReport* report) {
  if (measured.projections().empty()) return;
  std::set<std::string> float_nodes;
  for (const auto& node : kept) float_nodes.insert(node.node());
  for (const auto& projection : measured.projections()) {
    if (float_nodes.count(projection.node()) == 0) *report->add_projections() = projection;
  }
  report->set_method(measured.method());
  SetProjectionMeans(report->projections(), report);
  report->set_projections_note(absl::StrCat(
      measured.projections_note(), measured.projections_note().empty() ? "" : "; ",
      "the projections automatic mixed precision kept in float32 are left out, the means are the ",
      report->projections_size(), " still quantized"));
}

namespace {

// One search: each candidate is converted from the float32 model with some nodes kept.
class MixedPrecisionSearch {
 public:
  MixedPrecisionSearch(const onnx::ModelProto& fp32_model, const v1::PrecisionConfig& precision,
                       const PrecisionExtras& base, const ParityProbe& probe, const PassManagerOptions& options)
      : fp32_model_(fp32_model), precision_(precision), base_(base), probe_(probe), options_(options) {}

  // Whether keeping `nodes` passes; a passing candidate that still converts something is remembered.
  // Unless `nothing_converted_passes`, a candidate with nothing left to convert does not pass (it is
  // not a mixed model); the search's sanity check (keeping everything) sets it.
  absl::StatusOr<bool> Passes(const std::set<std::string>& nodes, bool nothing_converted_passes = false) {
    for (int retry = 0; retry <= kMaxMissingKernelRetries; ++retry) {
      if (absl::Status stop = options_.run.CheckNotCancelled("during automatic mixed precision"); !stop.ok()) return stop;
      PrecisionExtras extras = base_;
      extras.keep_nodes.insert(nodes.begin(), nodes.end());
      extras.keep_ops.insert(kernel_ops_.begin(), kernel_ops_.end());
      MixedPrecisionResult candidate;
      candidate.model = fp32_model_;
      PassManagerOptions quiet = options_;
      quiet.on_pass_start = nullptr;
      absl::Status applied = ApplyPrecision(precision_, extras, quiet, &candidate.model, &candidate.runs);
      if (!applied.ok()) return applied;
      ++attempts_;
      absl::StatusOr<bool> passed = probe_(candidate.model, &candidate.parity);
      if (!passed.ok()) return passed.status();
      if (*passed) {
        int64_t converted = 0;
        for (const auto& run : candidate.runs) {
          for (const char* counter : {"converted_nodes", "quantized_weights"}) {
            auto it = run.counters().find(counter);
            if (it != run.counters().end()) converted += it->second;
          }
        }
        if (converted == 0) return nothing_converted_passes;
        best_ = std::move(candidate);
        return true;
      }
      // A candidate that does not load for want of a kernel keeps that operator type and is tried again.
      std::optional<std::string> missing;
      for (const auto& output : candidate.parity.outputs()) {
        if (!missing) missing = MissingKernelOp(output.note());
      }
      if (!missing || kernel_ops_.count(*missing) > 0) return false;
      kernel_ops_.insert(*missing);
    }
    return false;
  }

  int attempts() const { return attempts_; }
  const std::set<std::string>& kernel_ops() const { return kernel_ops_; }
  std::optional<MixedPrecisionResult>& best() { return best_; }
  // The remembered candidate, handed over: the next one that passes is remembered anew.
  MixedPrecisionResult TakeBest() {
    MixedPrecisionResult taken = std::move(*best_);
    best_.reset();
    return taken;
  }

 private:
  const onnx::ModelProto& fp32_model_;
  const v1::PrecisionConfig& precision_;
  const PrecisionExtras& base_;
  const ParityProbe& probe_;
  const PassManagerOptions& options_;
  std::set<std::string> kernel_ops_;
  std::optional<MixedPrecisionResult> best_;
  int attempts_ = 0;
};

constexpr char kNothingPasses[] = "even keeping every node in float32 does not pass";

// A passing set of nodes to keep, why each, and the candidate that passed with them.
struct KeptSet {
  std::set<std::string> nodes;
  std::map<std::string, std::string> reasons;
  MixedPrecisionResult candidate;
};

// The worst `count` of `worst_first`, and the nodes always kept.
std::set<std::string> KeepWorst(const std::vector<MeasuredError>& worst_first, size_t count,
                                const std::set<std::string>& always) {
  std::set<std::string> nodes = always;
  for (size_t i = 0; i < count; ++i) nodes.insert(worst_first[i].node);
  return nodes;
}

// The fewest of the largest measured errors, at most `most`, that pass: 1, 2, 4, ... of the worst
// until a count passes, then the least count between the last failing one and it. nullopt when none
// does.
absl::StatusOr<std::optional<KeptSet>> KeepWorstMeasured(MixedPrecisionSearch& search,
                                                         const std::vector<MeasuredError>& worst_first,
                                                         const std::set<std::string>& always, size_t most) {
  most = std::min(most, worst_first.size());
  size_t failed = 0, passing = 0;
  for (size_t count = 1; passing == 0 && failed < most; count = std::min(2 * count, most)) {
    absl::StatusOr<bool> passed = search.Passes(KeepWorst(worst_first, count, always));
    if (!passed.ok()) return passed.status();
    (*passed ? passing : failed) = count;
  }
  if (passing == 0) return std::optional<KeptSet>();
  // The last candidate that passed keeps the worst `high`: the one search.best() remembers.
  size_t low = failed + 1, high = passing;
  while (low < high) {
    const size_t mid = low + (high - low) / 2;
    absl::StatusOr<bool> passed = search.Passes(KeepWorst(worst_first, mid, always));
    if (!passed.ok()) return passed.status();
    if (*passed) high = mid; else low = mid + 1;
  }
  KeptSet kept;
  kept.candidate = search.TakeBest();
  for (size_t i = 0; i < high; ++i) {
    kept.nodes.insert(worst_first[i].node);
    kept.reasons.emplace(worst_first[i].node, absl::StrCat("error: ", worst_first[i].why, ", among the ", high,
                                                           " largest measured; parity failed until they were kept"));
  }
  return std::optional<KeptSet>(std::move(kept));
}

// The shortest window of `order` (nodes in graph order) that passes when kept: its end by bisection
// from the front, then its start. nullopt with `why` when only keeping everything passes.
absl::StatusOr<std::optional<KeptSet>> BisectAlongGraph(MixedPrecisionSearch& search,
                                                        const std::vector<std::pair<std::string, std::string>>& order,
                                                        const std::set<std::string>& always, std::string* why) {
  auto keep = [&](size_t begin, size_t end) {
    std::set<std::string> nodes = always;
    for (size_t i = begin; i < end; ++i) nodes.insert(order[i].first);
    return nodes;
  };
  auto none = [&](const std::string& reason) {
    *why = reason;
    return std::optional<KeptSet>();
  };
  absl::StatusOr<bool> all = search.Passes(keep(0, order.size()), /*nothing_converted_passes=*/true);
  if (!all.ok()) return all.status();
  if (!*all) return none(kNothingPasses);
  size_t low = 0, high = order.size();  // keeping [0, high) passes; [0, low) is not known to
  while (low < high) {
    const size_t mid = low + (high - low) / 2;
    absl::StatusOr<bool> passed = search.Passes(keep(0, mid));
    if (!passed.ok()) return passed.status();
    if (*passed) high = mid; else low = mid + 1;
  }
  const size_t end = high;
  size_t begin_low = 0, begin_high = end;  // keeping [begin_low, end) passes
  while (begin_low + 1 < begin_high) {
    const size_t mid = begin_low + (begin_high - begin_low) / 2;
    absl::StatusOr<bool> passed = search.Passes(keep(mid, end));
    if (!passed.ok()) return passed.status();
    if (*passed) begin_low = mid; else begin_high = mid;
  }
  if (begin_low == 0 && end == order.size()) return none("only keeping every node in float32 passes");
  // Judge the final window once more so the remembered candidate is exactly it.
  absl::StatusOr<bool> passed = search.Passes(keep(begin_low, end));
  if (!passed.ok()) return passed.status();
  if (!*passed) return none("the bisection's window did not pass when judged again");
  KeptSet kept;
  kept.candidate = search.TakeBest();
  for (size_t i = begin_low; i < end; ++i) {
    kept.nodes.insert(order[i].first);
    kept.reasons.emplace(order[i].first, "error: parity failed until kept (bisection along the graph)");
  }
  return std::optional<KeptSet>(std::move(kept));
}

}  // namespace

absl::StatusOr<std::optional<MixedPrecisionResult>> SearchMixedPrecision(
    const onnx::ModelProto& fp32_model, const v1::PrecisionConfig& precision, const PrecisionExtras& base,
    const ParityProbe& probe, const ActivationMagnitudes& ranges, const PassManagerOptions& options,
    std::string* failure, const std::vector<MeasuredError>& worst_first) {
  MixedPrecisionSearch search(fp32_model, precision, base, probe, options);
  auto give_up = [&](const std::string& why) {
    if (failure != nullptr) {
      *failure = why;
      if (!search.kernel_ops().empty()) {
        absl::StrAppend(failure, "; ONNX Runtime on this device has no ", v1::PrecisionConfig::Mode_Name(precision.mode()),
                        " kernel for ",
                        absl::StrJoin(search.kernel_ops(), ", "));
      }
    }
    return std::optional<MixedPrecisionResult>();
  };
  std::vector<std::pair<std::string, std::string>> order;  // node key, op type, in graph order
  std::map<std::string, std::string> op_of;
  // Quantization changes only the nodes with weights; the bisection keeps (and reports) just those.
  const std::set<std::string> weighted = {"MatMul", "Gemm", "Attention", "EmbedLayerNormalization", "Gather"};
  for (const auto& node : fp32_model.graph().node()) {
    const std::string key = NodeKey(node);
    if (key.empty() || (!IsFloatMode(precision.mode()) && weighted.count(node.op_type()) == 0)) continue;
    order.push_back({key, node.op_type()});
    op_of[key] = node.op_type();
  }
  std::map<std::string, std::string> reasons;

  // (0) The plain conversion again, keeping each operator type ONNX Runtime has no kernel for here
  // (bfloat16 on the CPU) until the model loads.
  absl::StatusOr<bool> plain = search.Passes({});
  if (!plain.ok()) return plain.status();

  // (1) Float16's range: nodes making or reading values beyond it stay float32.
  std::set<std::string> overflow;
  if (precision.mode() == v1::PrecisionConfig::fp16 && ranges) {
    absl::StatusOr<std::map<std::string, double>> largest = ranges(fp32_model);
    if (!largest.ok()) return largest.status();
    std::map<std::string, double> beyond;
    for (const auto& [value, magnitude] : *largest) {
      if (magnitude > kFloat16Max) beyond[value] = magnitude;
    }
    for (const auto& node : fp32_model.graph().node()) {
      const std::string key = NodeKey(node);
      double worst = 0;
      for (const auto* names : {&node.input(), &node.output()}) {
        for (const auto& name : *names) {
          auto it = beyond.find(name);
          if (it != beyond.end()) worst = std::max(worst, it->second);
        }
      }
      if (worst > 0) {
        overflow.insert(key);
        reasons[key] = absl::StrFormat("overflow: |x| up to %.4g, beyond float16's 65504", worst);
      }
    }
    if (!overflow.empty() && !search.best()) {
      absl::StatusOr<bool> passed = search.Passes(overflow);
      if (!passed.ok()) return passed.status();
    }
  }

  // (2) A window along the graph; (3) int4: fewer of the projections whose measured error is largest,
  // if some count below the window's passes. A projection's own output error says little of how far
  // its error travels (on the trained fixture the window was the smaller set at every bound tried), so
  // the window comes first and bounds what the measured order may cost.
  std::set<std::string> window;
  if (!search.best()) {
    std::string why;
    absl::StatusOr<std::optional<KeptSet>> chosen = BisectAlongGraph(search, order, overflow, &why);
    if (!chosen.ok()) return chosen.status();
    const bool hopeless = !*chosen && why == kNothingPasses;
    if (!worst_first.empty() && !hopeless) {
      const size_t fewer = *chosen ? (*chosen)->nodes.size() - 1 : worst_first.size();
      absl::StatusOr<std::optional<KeptSet>> by_error = KeepWorstMeasured(search, worst_first, overflow, fewer);
      if (!by_error.ok()) return by_error.status();
      if (*by_error) *chosen = *std::move(by_error);
    }
    if (!*chosen) return give_up(why);
    search.best() = std::move((*chosen)->candidate);
    window = std::move((*chosen)->nodes);
    for (auto& [node, reason] : (*chosen)->reasons) reasons.emplace(node, std::move(reason));
  }
  MixedPrecisionResult result = std::move(*search.best());
  result.attempts = search.attempts();
  for (const auto& key : overflow) window.insert(key);
  for (const auto& key : window) {
    v1::KeptNode kept;
    kept.set_node(key);
    kept.set_op_type(op_of[key]);
    kept.set_reason(reasons[key]);
    result.kept.push_back(std::move(kept));
  }
  for (const auto& op : search.kernel_ops()) {
    v1::KeptNode kept;
    kept.set_node(absl::StrCat("(every ", op, ")"));
    kept.set_op_type(op);
    kept.set_reason("no kernel for the lower precision in ONNX Runtime on this device");
    result.kept.push_back(std::move(kept));
  }
  return std::optional<MixedPrecisionResult>(std::move(result));
}

}  // namespace onnxopt
