#include "optimizer/pass_manager.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizer/branch_pipelines.h"
#include "optimizer/config_enums.h"
#include "optimizer/failure.h"
#include "optimizer/graph.h"
#include "optimizer/transformer_report.h"

namespace onnxopt {
namespace {

absl::StatusOr<ParamValue> ParamFromJsonValue(const ParamSpec& spec, const google::protobuf::Value& value) {
  const std::string where = absl::StrCat("parameter '", spec.name, "'");
  switch (value.kind_case()) {
    case google::protobuf::Value::kNumberValue: {
      const double number = value.number_value();
      if (spec.type == ParamType::kDouble) return ParamValue(number);
      if (spec.type == ParamType::kInt && std::floor(number) == number && std::fabs(number) < 9e15) {
        return ParamValue(static_cast<int64_t>(number));
      }
      break;
    }
    case google::protobuf::Value::kBoolValue:
      if (spec.type == ParamType::kBool) return ParamValue(value.bool_value());
      break;
    case google::protobuf::Value::kStringValue: {
      auto parsed = ParamValueFromText(spec.type, value.string_value());
      if (parsed.ok()) return parsed;
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", parsed.status().message()));
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(where, " must be a ", ParamTypeName(spec.type)));
}

absl::StatusOr<PassInvocation> MakeInvocation(const PassRegistry& registry, const std::string& name,
                                              const google::protobuf::Map<std::string, google::protobuf::Value>& given) {
  const Pass* pass = registry.FindPass(name);
  if (pass == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown pass '", name, "'"));
  std::map<std::string, ParamValue> values;
  std::set<std::string> declared;
  for (const ParamSpec& spec : pass->params()) {
    declared.insert(spec.name);
    auto it = given.find(spec.name);
    absl::StatusOr<ParamValue> value = it != given.end() ? ParamFromJsonValue(spec, it->second)
                                                         : ParamValueFromText(spec.type, spec.default_value);
    if (!value.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("pass '", name, "': ", value.status().message()));
    }
    values[spec.name] = *std::move(value);
  }
  for (const auto& entry : given) {
    if (declared.count(entry.first) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("pass '", name, "' has no parameter '", entry.first, "'"));
    }
  }
  PassParams params(std::move(values));
  absl::Status valid = pass->ValidateParams(params);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("pass '", name, "': ", valid.message()));
  return PassInvocation{pass, std::move(params)};
}

}  // namespace

int Pipeline::PassCount() const {
  int count = 0;
  for (const auto& step : steps) count += static_cast<int>(step.passes.size());
  return count;
}

std::string Pipeline::ToString() const {
  std::vector<std::string> parts;
  for (const auto& step : steps) {
    std::vector<std::string> names;
    for (const auto& invocation : step.passes) names.emplace_back(invocation.pass->name());
    if (step.max_iterations > 1) {
      parts.push_back(absl::StrCat("fixed_point(", absl::StrJoin(names, ","), ")<=", step.max_iterations));
    } else {
      parts.push_back(absl::StrJoin(names, ","));
    }
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<std::vector<PipelineStep>> PassListSteps(const google::protobuf::RepeatedPtrField<v1::PassSpec>& specs,
                                                        const PassRegistry& registry) {
  std::vector<PipelineStep> steps;
  for (const auto& spec : specs) {
    auto invocation = MakeInvocation(registry, spec.name(), spec.params());
    if (!invocation.ok()) return invocation.status();
    steps.push_back(PipelineStep{{*std::move(invocation)}, 1});
  }
  return steps;
}

absl::StatusOr<Pipeline> BuildPipeline(const v1::OptimizationConfig& config, const PassRegistry& registry,
                                       const onnx::ModelProto* model) {
  if (config.max_iterations() < 0 || config.max_iterations() > 100) {
    return absl::InvalidArgumentError("max_iterations must be between 1 and 100 (0 for the default)");
  }
  const int max_iterations = config.max_iterations() > 0 ? config.max_iterations() : kDefaultMaxIterations;
  Pipeline pipeline;
  const auto& transformer = config.transformer();
  if (transformer.num_heads() < 0 || transformer.hidden_size() < 0 ||
      (transformer.num_heads() > 0 && transformer.hidden_size() > 0 && transformer.hidden_size() % transformer.num_heads() != 0)) {
    return absl::InvalidArgumentError("transformer.num_heads and transformer.hidden_size must be >= 0, and "
                                      "hidden_size a multiple of num_heads");
  }
  if (!transformer.family().empty() && FamilyKind(transformer.family()).empty()) {
    std::vector<std::string> known;
    for (const auto& family : KnownFamilies()) known.push_back(family.first);
    return absl::InvalidArgumentError(absl::StrCat("transformer.family '", transformer.family(),
                                                   "' is unknown (known: ", absl::StrJoin(known, ", "), ")"));
  }
  pipeline.hints.family = transformer.family();
  pipeline.hints.num_heads = transformer.num_heads();
  pipeline.hints.hidden_size = transformer.hidden_size();
  pipeline.hints.device = config.benchmark().device() == v1::DEVICE_CUDA ? v1::DEVICE_CUDA : v1::DEVICE_CPU;
  absl::StatusOr<std::vector<PipelineStep>> before = PassListSteps(config.passes_before(), registry);
  if (!before.ok()) return before.status();
  pipeline.steps = *std::move(before);
  // Run by the job after validation (optimize_deliver.cc); checked here with the rest of the config.
  if (absl::StatusOr<std::vector<PipelineStep>> after = PassListSteps(config.passes_after(), registry); !after.ok()) {
    return after.status();
  }
  if (config.passes_size() > 0) {
    if (config.has_preset()) {
      return absl::InvalidArgumentError("give either a preset or an explicit pass list, not both");
    }
    absl::StatusOr<std::vector<PipelineStep>> listed = PassListSteps(config.passes(), registry);
    if (!listed.ok()) return listed.status();
    pipeline.steps.insert(pipeline.steps.end(), listed->begin(), listed->end());
    pipeline.preset = "passes";
    return pipeline;
  }
  if (absl::Status known = CheckEnumValue(v1::Pipelines::Preset_descriptor(), config.preset(), "preset");
      !known.ok()) {
    return known;
  }
  std::string preset_name = v1::Pipelines::Preset_Name(config.preset());
  pipeline.preset = preset_name;
  std::set<std::string> left_out;
  if (preset_name == kAutoPreset) {
    // A family the config names counts as detected.
    const std::string family =
        !config.transformer().family().empty() ? config.transformer().family()
        : model != nullptr                     ? DetectTransformer(*model).family
                                               : "config check";
    preset_name = family.empty() ? "extended" : "transformer";
    pipeline.preset = family.empty() ? "auto: extended (no transformer found)"
                                     : absl::StrCat("auto: transformer (", family, ")");
    left_out = kInterfaceChangingPasses;
  }
  const Preset* preset = registry.FindPreset(preset_name);
  if (preset == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown preset '", preset_name, "'"));
  const google::protobuf::Map<std::string, google::protobuf::Value> no_params;
  for (const PresetGroup& group : preset->groups) {
    PipelineStep step;
    step.max_iterations = group.fixed_point ? max_iterations : 1;
    for (const std::string& name : group.passes) {
      if (left_out.count(name) > 0) continue;
      auto invocation = MakeInvocation(registry, name, no_params);
      if (!invocation.ok()) return invocation.status();
      step.passes.push_back(*std::move(invocation));
    }
    if (!step.passes.empty()) pipeline.steps.push_back(std::move(step));
  }
  return pipeline;
}

std::map<std::string, int64_t> OpHistogram(const onnx::GraphProto& graph) {
  std::map<std::string, int64_t> histogram;
  std::function<void(const onnx::GraphProto&)> visit = [&](const onnx::GraphProto& g) {
    for (const auto& node : g.node()) {
      ++histogram[OpKey(node)];
      for (const auto& attribute : node.attribute()) {
        if (attribute.has_g()) visit(attribute.g());
        for (const auto& subgraph : attribute.graphs()) visit(subgraph);
      }
    }
  };
  visit(graph);
  return histogram;
}

namespace {

// The model's main graph as one Graph across consecutive graph passes, checkpointed between them;
// written back into the model for a model pass and at the end. Building the Graph and committing it
// for every pass cost about 1.5 us a node a pass, 4 s of a 100k-node transformer pipeline.
class HeldGraph {
 public:
  explicit HeldGraph(onnx::ModelProto* model) : model_(model) {}
  HeldGraph(const HeldGraph&) = delete;
  HeldGraph& operator=(const HeldGraph&) = delete;
  ~HeldGraph() { Release().IgnoreError(); }

  Graph& Get() {
    if (graph_ == nullptr) graph_ = std::make_unique<Graph>(model_->mutable_graph());
    return *graph_;
  }
  // Gives the nodes back to the model.
  absl::Status Release() {
    if (graph_ == nullptr) return absl::OkStatus();
    absl::Status status = graph_->Commit();
    graph_.reset();
    return status;
  }

 private:
  onnx::ModelProto* model_;
  std::unique_ptr<Graph> graph_;
};

absl::Status Named(const PassInvocation& invocation, const absl::Status& status) {
  // The reason stays with the status (the job's error names it), the pass before the text.
  return WithReason(
      absl::Status(status.code(), absl::StrCat("pass '", invocation.pass->name(), "': ", status.message())),
      ReasonOf(status));
}

// The one place a pass's declared shape effect is read: a model pass invalidates, whatever it says.
ShapeEffect EffectOf(const Pass& pass) {
  return pass.is_model_pass() ? ShapeEffect::kInvalidatesAlways : pass.shape_effect();
}

// What one run of a pass did to the graph, beyond its report.
struct PassEdits {
  std::vector<std::string> vanished;  // values gone
  std::vector<const Node*> added;     // nodes added, in order
  std::vector<std::string> added_initializers;
  bool graph_edited = false;  // a rewrite touched a graph (even one that left its counts as they were)
};

// One run of a pipeline over a model: the Graph held across graph passes, and the shapes the passes
// that read them share until one changes what they describe.
class PipelineRunner {
 public:
  PipelineRunner(const Pipeline& pipeline, onnx::ModelProto* model, const PassManagerOptions& options,
                 std::vector<v1::PassReport>* reports)
      : pipeline_(pipeline), model_(model), options_(options), reports_(reports), held_(model) {}

  absl::Status Run(std::optional<InitialShapes> initial_shapes);
  absl::Status Release() { return held_.Release(); }

 private:
  // Runs one pass over every graph of the model, records what it did, and keeps or drops the shapes.
  absl::Status RunPass(const PassInvocation& invocation, int iteration, int64_t* rewrites);
  absl::Status RunOnGraphs(const PassInvocation& invocation, PassContext& context, v1::PassReport* report,
                           PassEdits* edits);
  absl::Status RunOnModel(const PassInvocation& invocation, PassContext& context, v1::PassReport* report);
  void ImportRequiredOpsets(const PassContext& context);
  // Shapes inferred before a run that changed the graph: carried over (kKeepsValueTypes) or dropped.
  void UpdateShapes(const Pass& pass, const PassContext& context, const PassEdits& edits);

  const Pipeline& pipeline_;
  onnx::ModelProto* model_;
  const PassManagerOptions& options_;
  std::vector<v1::PassReport>* reports_;
  HeldGraph held_;
  std::optional<ShapeInfo> shapes_;  // of the model as it is, or nothing
  double inference_seconds_ = 0;     // of `shapes_`, until the first pass that reads them takes it
  // What the last inference found declared dims to name (ShapeInfo::dim_aliases): facts of the
  // model's interface, which the passes keep, handed to the next inference.
  DimAliases dim_aliases_;
};

absl::Status PipelineRunner::RunOnModel(const PassInvocation& invocation, PassContext& context,
                                        v1::PassReport* report) {
  const std::map<std::string, int64_t> before = OpHistogram(model_->graph());
  report->set_nodes_before(CountNodes(model_->graph()));
  absl::Status status = invocation.pass->RunOnModel(model_, context);
  if (!status.ok()) return Named(invocation, status);
  report->set_nodes_after(CountNodes(model_->graph()));
  std::map<std::string, int64_t> after = OpHistogram(model_->graph());
  for (const auto& [op, count] : before) after[op] -= count;
  for (const auto& [op, count] : after) {
    if (count != 0) (*report->mutable_op_delta())[op] = count;
  }
  return absl::OkStatus();
}

absl::Status PipelineRunner::RunOnGraphs(const PassInvocation& invocation, PassContext& context,
                                         v1::PassReport* report, PassEdits* edits) {
  Graph& graph = held_.Get();
  report->set_nodes_before(graph.NodeCountRecursive());
  absl::Status status = absl::OkStatus();
  graph.ForEachGraph([&](Graph& g) {
    if (status.ok()) status = invocation.pass->RunOnGraph(g, context);
  });
  bool changed = false;
  graph.ForEachGraph([&](Graph& g) { changed = changed || g.changed(); });
  edits->graph_edited = changed;
  if (!status.ok()) return Named(invocation, status);
  absl::Status checkpoint = graph.Checkpoint();
  if (!checkpoint.ok()) return Named(invocation, checkpoint);
  for (const auto& [op, delta] : graph.TakeOpDelta()) (*report->mutable_op_delta())[op] = delta;
  edits->vanished = graph.TakeVanishedValues();
  edits->added = graph.TakeAddedNodes();
  edits->added_initializers = graph.TakeAddedInitializers();
  report->set_nodes_after(graph.NodeCountRecursive());
  return absl::OkStatus();
}

void PipelineRunner::ImportRequiredOpsets(const PassContext& context) {
  for (const auto& [domain, version] : context.required_opsets()) {
    bool present = false;
    for (const auto& import : model_->opset_import()) present |= import.domain() == domain;
    if (present) continue;
    auto* import = model_->add_opset_import();
    import->set_domain(domain);
    import->set_version(version);
  }
}

void PipelineRunner::UpdateShapes(const Pass& pass, const PassContext& context, const PassEdits& edits) {
  // A domain the pass imported first is read only by nodes it added, which Extend types.
  if (EffectOf(pass) == ShapeEffect::kKeepsValueTypes && shapes_.has_value() && !context.shapes_can_improve()) {
    shapes_->Forget(edits.vanished);
    shapes_->Extend(*model_, held_.Get(), edits.added, edits.added_initializers);
  } else {
    shapes_.reset();
  }
}

absl::Status PipelineRunner::RunPass(const PassInvocation& invocation, int iteration, int64_t* rewrites) {
  const auto start = std::chrono::steady_clock::now();
  const Pass& pass = *invocation.pass;
  const bool model_pass = pass.is_model_pass();
  if (model_pass) {
    absl::Status released = held_.Release();
    if (!released.ok()) return released;
  }
  if (pass.needs_shapes() && !shapes_.has_value()) {
    shapes_ = model_pass ? ShapeInfo::Infer(*model_, dim_aliases_) : ShapeInfo::Infer(*model_, held_.Get(), dim_aliases_);
    dim_aliases_ = shapes_->dim_aliases();
  }
  PassContext context(invocation.params, *model_, pass.needs_shapes() ? &*shapes_ : nullptr, &pipeline_.hints,
                      &pipeline_.activation_ranges);
  v1::PassReport report;
  PassEdits edits;
  absl::Status status = model_pass ? RunOnModel(invocation, context, &report)
                                   : RunOnGraphs(invocation, context, &report, &edits);
  if (!status.ok()) return status;
  ImportRequiredOpsets(context);
  report.set_name(std::string(pass.name()));
  report.set_iteration(iteration);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (pass.needs_shapes()) seconds += std::exchange(inference_seconds_, 0.0);
  report.set_duration_seconds(seconds);
  report.set_rewrites(context.rewrites());
  for (const auto& skip : context.skipped()) {
    auto* reason = report.add_skipped();
    reason->set_reason(skip.first);
    reason->set_count(skip.second);
  }
  for (const auto& [counter, count] : context.counters()) (*report.mutable_counters())[counter] = count;
  for (const auto& note : context.notes()) report.add_notes(note);
  const bool changed = EffectOf(pass) == ShapeEffect::kInvalidatesAlways || edits.graph_edited ||
                       PassChangedGraph(report) || !context.required_opsets().empty();
  if (changed) UpdateShapes(pass, context, edits);
  reports_->push_back(std::move(report));
  *rewrites += context.rewrites();
  return absl::OkStatus();
}

absl::Status PipelineRunner::Run(std::optional<InitialShapes> initial_shapes) {
  // Progress counts pass runs: a fixed-point group's next sweep adds its passes to the total, so the
  // count only grows (it never restarts at 1 with a sweep).
  int total = pipeline_.PassCount();
  int runs = 0;
  int64_t changes = 0;
  if (InfersShapesFirst(pipeline_, options_)) {
    if (!initial_shapes) initial_shapes = InferInitialShapes(*model_);
    shapes_ = std::move(initial_shapes->shapes);
    inference_seconds_ = initial_shapes->seconds;
    dim_aliases_ = shapes_->dim_aliases();
  }
  for (const auto& step : pipeline_.steps) {
    for (int iteration = 1; iteration <= step.max_iterations; ++iteration) {
      int64_t sweep_rewrites = 0;
      if (iteration > 1) total += static_cast<int>(step.passes.size());
      for (const auto& invocation : step.passes) {
        if (options_.stop_after_changes >= 0 && changes >= options_.stop_after_changes) return absl::OkStatus();
        if (absl::Status stop = options_.run.CheckNotCancelled("between passes"); !stop.ok()) return stop;
        const std::string name(invocation.pass->name());
        if (options_.excluded_passes.count(name) > 0) {
          --total;
          continue;
        }
        if (options_.on_pass_start) options_.on_pass_start(name, runs++, total);
        if (absl::Status status = RunPass(invocation, iteration, &sweep_rewrites); !status.ok()) return status;
        if (PassChangedGraph(reports_->back())) ++changes;
      }
      if (sweep_rewrites == 0) break;  // fixed point reached (or a single run done)
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool PassChangedGraph(const v1::PassReport& report) {
  return report.rewrites() > 0 || report.nodes_before() != report.nodes_after() || report.op_delta_size() > 0;
}

InitialShapes InferInitialShapes(const onnx::ModelProto& model) {
  const auto start = std::chrono::steady_clock::now();
  ShapeInfo shapes = ShapeInfo::Infer(model);
  return {std::move(shapes), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

bool InfersShapesFirst(const Pipeline& pipeline, const PassManagerOptions& options) {
  for (const auto& step : pipeline.steps) {
    for (const auto& invocation : step.passes) {
      const Pass& pass = *invocation.pass;
      if (options.excluded_passes.count(std::string(pass.name())) > 0) continue;
      if (pass.needs_shapes()) return true;
      if (EffectOf(pass) != ShapeEffect::kKeepsValueTypes) return false;
    }
  }
  return false;
}

absl::Status RunPipeline(const Pipeline& pipeline, onnx::ModelProto* model, const PassManagerOptions& options,
                         std::vector<v1::PassReport>* reports, std::optional<InitialShapes> initial_shapes) {
  // The branches that hold attention first, each as a model of its own (branch_pipelines.h), without
  // the passes that rewrite a whole model (its opset, its interface), which are the main graph's.
  PassManagerOptions branch_options = options;
  for (const auto& step : pipeline.steps) {
    for (const auto& invocation : step.passes) {
      if (invocation.pass->is_model_pass()) branch_options.excluded_passes.insert(std::string(invocation.pass->name()));
    }
  }
  const ModelPipeline run_branch = [&](onnx::ModelProto* branch, int64_t stop_after_changes,
                                       std::vector<v1::PassReport>* branch_reports) {
    PassManagerOptions budgeted = branch_options;
    budgeted.stop_after_changes = stop_after_changes;
    return RunPipeline(pipeline, branch, budgeted, branch_reports);
  };
  int64_t branch_changes = 0;
  if (absl::Status branches =
          RunPipelineOnBranches(model, run_branch, options.stop_after_changes, reports, &branch_changes);
      !branches.ok()) {
    return branches;
  }
  PassManagerOptions rest = options;
  if (rest.stop_after_changes >= 0) rest.stop_after_changes = std::max<int64_t>(0, rest.stop_after_changes - branch_changes);
  if (branch_changes > 0) initial_shapes.reset();  // of the model before its branches changed
  PipelineRunner runner(pipeline, model, rest, reports);
  absl::Status status = runner.Run(std::move(initial_shapes));
  // The model is whole again whatever happened; a failure to write it back outranks the run's status.
  absl::Status released = runner.Release();
  return released.ok() ? status : released;
}

}  // namespace onnxopt
