#include "optimizer/pass_manager.h"

#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  static const std::set<std::string> kFamilies = {"", "bert", "roberta", "gpt2", "llama", "t5", "vit"};
  if (kFamilies.count(transformer.family()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("transformer.family '", transformer.family(),
                                                   "' is unknown (known: bert, roberta, gpt2, llama, t5, vit)"));
  }
  pipeline.hints.family = transformer.family();
  pipeline.hints.num_heads = transformer.num_heads();
  pipeline.hints.hidden_size = transformer.hidden_size();
  if (config.passes_size() > 0) {
    if (!config.preset().empty()) {
      return absl::InvalidArgumentError("give either a preset or an explicit pass list, not both");
    }
    for (const auto& spec : config.passes()) {
      auto invocation = MakeInvocation(registry, spec.name(), spec.params());
      if (!invocation.ok()) return invocation.status();
      pipeline.steps.push_back(PipelineStep{{*std::move(invocation)}, 1});
    }
    pipeline.preset = "passes";
    return pipeline;
  }
  std::string preset_name = config.preset().empty() ? kDefaultPreset : config.preset();
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
  bool held() const { return graph_ != nullptr; }
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
  return absl::Status(status.code(), absl::StrCat("pass '", invocation.pass->name(), "': ", status.message()));
}

// Runs one pass over every graph of the model and records what it did. `shapes` holds the inference
// of the model as it is (or nothing); the pass runs it if it needs it and none is held, and drops it
// when it changed the model. A pass that needs shapes takes `inference_seconds` (an inference made
// before it, for it) into its time.
absl::Status RunOnePass(const PassInvocation& invocation, const ModelHints& hints, int iteration,
                        onnx::ModelProto* model, HeldGraph* held, std::optional<ShapeInfo>* shapes,
                        double* inference_seconds, std::vector<v1::PassReport>* reports, int64_t* rewrites) {
  const auto start = std::chrono::steady_clock::now();
  const bool model_pass = invocation.pass->is_model_pass();
  if (model_pass) {
    absl::Status released = held->Release();
    if (!released.ok()) return released;
  }
  if (invocation.pass->needs_shapes() && !shapes->has_value()) {
    *shapes = model_pass ? ShapeInfo::Infer(*model) : ShapeInfo::Infer(*model, held->Get());
  }
  PassContext context(invocation.params, *model, invocation.pass->needs_shapes() ? &**shapes : nullptr, &hints);
  bool edited = model_pass || invocation.pass->edits_declared_types();
  v1::PassReport report;
  std::map<std::string, int64_t> op_delta;
  std::vector<std::string> vanished;
  std::vector<const Node*> added;
  std::vector<std::string> added_initializers;
  if (model_pass) {
    const std::map<std::string, int64_t> before = OpHistogram(model->graph());
    report.set_nodes_before(CountNodes(model->graph()));
    absl::Status status = invocation.pass->RunOnModel(model, context);
    if (!status.ok()) return Named(invocation, status);
    report.set_nodes_after(CountNodes(model->graph()));
    std::map<std::string, int64_t> after = OpHistogram(model->graph());
    for (const auto& [op, count] : before) after[op] -= count;
    for (const auto& [op, count] : after) {
      if (count != 0) op_delta[op] = count;
    }
  } else {
    Graph& graph = held->Get();
    report.set_nodes_before(graph.NodeCountRecursive());
    absl::Status status = absl::OkStatus();
    graph.ForEachGraph([&](Graph& g) {
      if (status.ok()) status = invocation.pass->RunOnGraph(g, context);
    });
    graph.ForEachGraph([&](Graph& g) { edited = edited || g.changed(); });
    if (!status.ok()) return Named(invocation, status);
    absl::Status checkpoint = graph.Checkpoint();
    if (!checkpoint.ok()) return Named(invocation, checkpoint);
    op_delta = graph.TakeOpDelta();
    vanished = graph.TakeVanishedValues();
    added = graph.TakeAddedNodes();
    added_initializers = graph.TakeAddedInitializers();
    report.set_nodes_after(graph.NodeCountRecursive());
  }
  for (const auto& [domain, version] : context.required_opsets()) {
    bool present = false;
    for (const auto& import : model->opset_import()) present |= import.domain() == domain;
    if (present) continue;
    auto* import = model->add_opset_import();
    import->set_domain(domain);
    import->set_version(version);
  }
  report.set_name(std::string(invocation.pass->name()));
  report.set_iteration(iteration);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (invocation.pass->needs_shapes()) seconds += std::exchange(*inference_seconds, 0.0);
  report.set_duration_seconds(seconds);
  report.set_rewrites(context.rewrites());
  for (const auto& skip : context.skipped()) {
    auto* reason = report.add_skipped();
    reason->set_reason(skip.first);
    reason->set_count(skip.second);
  }
  for (const auto& [counter, count] : context.counters()) (*report.mutable_counters())[counter] = count;
  for (const auto& note : context.notes()) report.add_notes(note);
  for (const auto& [op, delta] : op_delta) (*report.mutable_op_delta())[op] = delta;
  const bool changed = edited || PassChangedGraph(report) || !context.required_opsets().empty();
  // A domain the pass imported first is read only by nodes it added, which Extend types.
  const bool types_kept =
      invocation.pass->keeps_value_types() && !model_pass && !invocation.pass->edits_declared_types();
  if (changed && types_kept && shapes->has_value() && !context.shapes_can_improve()) {
    (*shapes)->Forget(vanished);
    (*shapes)->Extend(*model, held->Get(), added, added_initializers);
  } else if (changed) {
    shapes->reset();
  }
  reports->push_back(std::move(report));
  *rewrites += context.rewrites();
  return absl::OkStatus();
}

absl::Status RunSteps(const Pipeline& pipeline, onnx::ModelProto* model, HeldGraph* held,
                      const PassManagerOptions& options, std::vector<v1::PassReport>* reports,
                      std::optional<InitialShapes> initial_shapes) {
  const int total = pipeline.PassCount();
  int done = 0;
  int64_t changes = 0;
  std::optional<ShapeInfo> shapes;  // shared by the passes that need it until one changes the model
  double inference_seconds = 0;     // of `shapes`, until the first pass that reads them
  if (InfersShapesFirst(pipeline, options)) {
    if (!initial_shapes) initial_shapes = InferInitialShapes(*model);
    shapes = std::move(initial_shapes->shapes);
    inference_seconds = initial_shapes->seconds;
  }
  for (const auto& step : pipeline.steps) {
    for (int iteration = 1; iteration <= step.max_iterations; ++iteration) {
      int64_t sweep_rewrites = 0;
      int index_in_sweep = 0;
      for (const auto& invocation : step.passes) {
        if (options.stop_after_changes >= 0 && changes >= options.stop_after_changes) return absl::OkStatus();
        if (options.cancelled != nullptr && options.cancelled->load()) {
          return absl::CancelledError("cancelled between passes");
        }
        if (options.excluded_passes.count(std::string(invocation.pass->name())) > 0) {
          ++index_in_sweep;
          continue;
        }
        if (options.on_pass_start) options.on_pass_start(std::string(invocation.pass->name()), done + index_in_sweep, total);
        absl::Status status =
            RunOnePass(invocation, pipeline.hints, iteration, model, held, &shapes, &inference_seconds, reports,
                       &sweep_rewrites);
        if (!status.ok()) return status;
        if (PassChangedGraph(reports->back())) ++changes;
        ++index_in_sweep;
      }
      if (sweep_rewrites == 0) break;  // fixed point reached (or a single run done)
    }
    done += static_cast<int>(step.passes.size());
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
      if (pass.is_model_pass() || !pass.keeps_value_types() || pass.edits_declared_types()) return false;
    }
  }
  return false;
}

absl::Status RunPipeline(const Pipeline& pipeline, onnx::ModelProto* model, const PassManagerOptions& options,
                         std::vector<v1::PassReport>* reports, std::optional<InitialShapes> initial_shapes) {
  HeldGraph held(model);
  absl::Status status = RunSteps(pipeline, model, &held, options, reports, std::move(initial_shapes));
  // The model is whole again whatever happened; a failure to write it back outranks the run's status.
  absl::Status released = held.Release();
  return released.ok() ? status : released;
}

}  // namespace onnxopt
