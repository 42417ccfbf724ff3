// What a graph pass is: a stateless object with a name, a one-line description, typed parameters and
// RunOnGraph(). The pass manager calls RunOnGraph for the main graph and every subgraph, so a pass
// never walks into subgraphs itself. Matching never mutates: a pass proves a pattern may fire, then
// rewrites, and reports each match it leaves alone through PassContext::Skip with the reason.
#ifndef ONNXOPT_OPTIMIZER_PASS_H_
#define ONNXOPT_OPTIMIZER_PASS_H_

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "optimizer/graph.h"
#include "optimizer/shape_info.h"

namespace onnxopt {

enum class ParamType { kInt, kDouble, kBool, kString };
absl::string_view ParamTypeName(ParamType type);

struct ParamSpec {
  std::string name;
  ParamType type;
  std::string default_value;  // in the text form ParamValueFromText accepts
  std::string description;
};

using ParamValue = std::variant<int64_t, double, bool, std::string>;
absl::StatusOr<ParamValue> ParamValueFromText(ParamType type, absl::string_view text);

// Parameter values of one pass invocation, complete (defaults filled in) and type-checked.
class PassParams {
 public:
  PassParams() = default;
  explicit PassParams(std::map<std::string, ParamValue> values) : values_(std::move(values)) {}
  int64_t GetInt(const std::string& name) const { return std::get<int64_t>(values_.at(name)); }
  double GetDouble(const std::string& name) const { return std::get<double>(values_.at(name)); }
  bool GetBool(const std::string& name) const { return std::get<bool>(values_.at(name)); }
  const std::string& GetString(const std::string& name) const { return std::get<std::string>(values_.at(name)); }
  const std::map<std::string, ParamValue>& values() const { return values_; }

 private:
  std::map<std::string, ParamValue> values_;
};

// What the job's config says about the model's architecture (OptimizationConfig.transformer);
// empty or 0 where it says nothing and passes work it out from the graph. And where the job runs
// the result: passes that emit device-specific operators choose by it (remove_padding).
struct ModelHints {
  std::string family;
  int64_t num_heads = 0;
  int64_t hidden_size = 0;
  v1::Device device = v1::DEVICE_CPU;
};

// The range of values a float activation took in calibration.
struct ValueRange {
  float low = 0;
  float high = 0;
};
// Calibrated ranges by value name, for the passes that quantize activations (int8_static).
using ActivationRanges = std::map<std::string, ValueRange>;

class PassContext {
 public:
  PassContext(const PassParams& params, const onnx::ModelProto& model, const ShapeInfo* shapes = nullptr,
              const ModelHints* hints = nullptr, const ActivationRanges* activation_ranges = nullptr);
  const PassParams& params() const { return params_; }
  // Types and shapes of main-graph values as the pass started, for a ShapedPass (null for others).
  const ShapeInfo* shapes() const { return shapes_; }
  const onnx::ModelProto& model() const { return model_; }
  const ModelHints& hints() const { return hints_; }
  // Calibrated activation ranges the pipeline was given (empty when none).
  const ActivationRanges& activation_ranges() const { return *activation_ranges_; }
  // Opset version the model imports for `domain` ("" and "ai.onnx" are the same); 0 if none.
  int64_t OpsetVersion(absl::string_view domain) const;

  // A pass that emits operators of another domain (com.microsoft) declares the opset it needs; the
  // pass manager adds the import to the model.
  void RequireOpset(const std::string& domain, int64_t version) { required_opsets_[domain] = version; }
  const std::map<std::string, int64_t>& required_opsets() const { return required_opsets_; }

  void CountRewrite(int64_t n = 1) { rewrites_ += n; }
  // Figures a pass reports beyond rewrites (PassReport.counters), e.g. "clamped_weights".
  void Count(const std::string& counter, int64_t n = 1) {
    if (n != 0) counters_[counter] += n;
  }
  // A line for the report about one node (PassReport.notes, at most kMaxPassNotes kept).
  void Note(std::string line) {
    if (notes_.size() < kMaxPassNotes) notes_.push_back(std::move(line));
  }
  static constexpr size_t kMaxPassNotes = 1000;
  const std::map<std::string, int64_t>& counters() const { return counters_; }
  const std::vector<std::string>& notes() const { return notes_; }
  void Skip(absl::string_view reason) { ++skipped_[std::string(reason)]; }
  int64_t rewrites() const { return rewrites_; }
  const std::map<std::string, int64_t>& skipped() const { return skipped_; }
  // A pass that keeps value types but made values known that the shapes did not know (an inference
  // would now find more downstream) says so: the pass manager then infers again.
  void ShapesCanImprove() { shapes_can_improve_ = true; }
  bool shapes_can_improve() const { return shapes_can_improve_; }

 private:
  const PassParams& params_;
  const onnx::ModelProto& model_;
  const ShapeInfo* shapes_;
  ModelHints hints_;
  const ActivationRanges* activation_ranges_;
  std::map<std::string, int64_t> opsets_;
  int64_t rewrites_ = 0;
  bool shapes_can_improve_ = false;
  std::map<std::string, int64_t> skipped_;
  std::map<std::string, int64_t> required_opsets_;
  std::map<std::string, int64_t> counters_;
  std::vector<std::string> notes_;
};

// What a pass does to the types and shapes inferred before it, declared once per pass and read by the
// pass manager in one place (pass_manager.cc).
enum class ShapeEffect {
  // Every value that survives its rewrites keeps its type, and what it adds writes values typed from
  // their inputs (it removes nodes, points readers at same-typed values, or replaces a subgraph by
  // nodes that write the same values): the shapes carry over, the removed values forgotten and the
  // added ones typed from their inputs, instead of a new inference. Those shapes may be less precise
  // than a new inference would find (a reader pointed at a better-typed twin); the next pass that does
  // not keep types infers again. A run that made values known that the shapes did not know says so
  // (PassContext::ShapesCanImprove).
  kKeepsValueTypes,
  // A rewrite may change value types: shapes are inferred again after a run that changed the graph.
  kInvalidatesOnChange,
  // It edits declared types or shapes (graph inputs, outputs, value_info) directly, or works on the
  // model as a whole: shapes inferred before it are stale after every run, rewrites or not.
  kInvalidatesAlways,
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::string_view description() const = 0;
  virtual std::vector<ParamSpec> params() const { return {}; }
  // Checks parameter values beyond their type (e.g. the syntax of a string); INVALID_ARGUMENT.
  virtual absl::Status ValidateParams(const PassParams& params) const { return absl::OkStatus(); }
  virtual ShapeEffect shape_effect() const { return ShapeEffect::kInvalidatesOnChange; }
  // Whether the pass reads inferred shapes (ShapedPass). Inference is shared: it runs again only after
  // a pass changed what the shapes describe.
  virtual bool needs_shapes() const { return false; }
  // Called for the main graph and every subgraph. The model (PassContext::model) must not be read
  // for nodes while the pass runs: they live in the Graph until it is committed.
  virtual absl::Status RunOnGraph(Graph& graph, PassContext& context) const = 0;
  // A pass that works on the model as a whole (opset conversion) says so; the manager then calls
  // RunOnModel instead of RunOnGraph, and takes its shape effect as kInvalidatesAlways.
  virtual bool is_model_pass() const { return false; }
  virtual absl::Status RunOnModel(onnx::ModelProto* model, PassContext& context) const {
    return absl::UnimplementedError("not a model pass");
  }
};

// A pass that reads the types and shapes of main-graph values as they were when it started: the pass
// manager infers them first, and the pass receives them.
class ShapedPass : public Pass {
 public:
  bool needs_shapes() const final { return true; }
  absl::Status RunOnGraph(Graph& graph, PassContext& context) const final;

 protected:
  virtual absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const = 0;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASS_H_
