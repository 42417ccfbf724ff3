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
// empty or 0 where it says nothing and passes work it out from the graph.
struct ModelHints {
  std::string family;
  int64_t num_heads = 0;
  int64_t hidden_size = 0;
};

class PassContext {
 public:
  PassContext(const PassParams& params, const onnx::ModelProto& model, const ShapeInfo* shapes = nullptr,
              const ModelHints* hints = nullptr);
  const PassParams& params() const { return params_; }
  // Types and shapes of main-graph values as the pass started; null unless the pass needs_shapes().
  const ShapeInfo* shapes() const { return shapes_; }
  const onnx::ModelProto& model() const { return model_; }
  const ModelHints& hints() const { return hints_; }
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
  std::map<std::string, int64_t> opsets_;
  int64_t rewrites_ = 0;
  bool shapes_can_improve_ = false;
  std::map<std::string, int64_t> skipped_;
  std::map<std::string, int64_t> required_opsets_;
  std::map<std::string, int64_t> counters_;
  std::vector<std::string> notes_;
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::string_view description() const = 0;
  virtual std::vector<ParamSpec> params() const { return {}; }
  // Checks parameter values beyond their type (e.g. the syntax of a string); INVALID_ARGUMENT.
  virtual absl::Status ValidateParams(const PassParams& params) const { return absl::OkStatus(); }
  // Whether the pass manager should run shape inference before this pass. Inference is shared: it
  // is run again only after a pass changed the graph.
  virtual bool needs_shapes() const { return false; }
  // A pass whose rewrites leave every value that survives them with the type it had (it removes
  // nodes, points readers at same-typed values, or replaces a subgraph by nodes that write the same
  // values) says so: shapes inferred before it stay true after it. The pass manager then forgets the
  // values it removed and types the nodes it added from their inputs, instead of inferring the whole
  // graph again. Those shapes may be less precise than a new inference would find (a reader pointed at
  // a better-typed twin); the next pass that does not keep types infers again. A run that made
  // values known that the shapes did not know says so (PassContext::ShapesCanImprove).
  virtual bool keeps_value_types() const { return false; }
  // A pass that edits declared types or shapes (graph inputs, outputs, value_info) directly says so:
  // shapes inferred before it are stale after it even when it reports no rewrite.
  virtual bool edits_declared_types() const { return false; }
  // Called for the main graph and every subgraph. The model (PassContext::model) must not be read
  // for nodes while the pass runs: they live in the Graph until it is committed.
  virtual absl::Status RunOnGraph(Graph& graph, PassContext& context) const = 0;
  // A pass that works on the model as a whole (opset conversion) says so; the manager then calls
  // RunOnModel instead of RunOnGraph.
  virtual bool is_model_pass() const { return false; }
  virtual absl::Status RunOnModel(onnx::ModelProto* model, PassContext& context) const {
    return absl::UnimplementedError("not a model pass");
  }
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASS_H_
