// Declarative pattern matching for the passes.
//
// A pattern is read upwards from the value a rewrite replaces: a Path of Steps, each naming the
// operator that must produce the value reached so far, a check on that node, and the input the path
// goes on from. kAnyInput tries every input in turn, so commuted operands are the matcher's business
// and not each pass's: Add(MatMul(x, W), b) and Add(b, MatMul(x, W)) are one declaration. Matching
// never mutates the graph.
//
// A match either holds what it found or says why the candidate does not fit (MatchResult, onnxscript's
// MatchResult.fail and MLIR's notifyMatchFailure): a reason is reported as the pass's skip; no
// reason means the candidate is not this pattern at all, which is not worth a line in the report.
// Checks are ordered cheap first, as ONNX Runtime's SatisfyCondition: op types and attributes before
// constants and shapes.
#ifndef ONNXOPT_OPTIMIZER_PASSES_MATCH_H_
#define ONNXOPT_OPTIMIZER_PASSES_MATCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "optimizer/graph.h"
#include "optimizer/pass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/shape_info.h"

namespace onnxopt {

// ---------------------------------------------------------------------------------------------------
// Results

// Why a candidate does not fit; an empty reason: it is not this pattern (nothing to report).
struct MatchFailure {
  std::string reason;
};
inline MatchFailure Fail(std::string reason = {}) { return MatchFailure{std::move(reason)}; }

// What a match found, or why it failed. Converts from a T and from Fail(...), so a matcher returns
// either; a failure passes on unchanged between results of different types (`return inner.failure()`).
template <typename T>
class [[nodiscard]] MatchResult {
 public:
  MatchResult(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  MatchResult(MatchFailure failure) : reason_(std::move(failure.reason)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  const std::string& reason() const { return reason_; }
  MatchFailure failure() const { return MatchFailure{reason_}; }

 private:
  std::optional<T> value_;
  std::string reason_;
};

// A match that finds nothing beyond "it fits".
struct Matched {};

// The greedy driver of a matcher-based pass: `match` (Node* -> MatchResult<T>) on every live node in
// order, `rewrite` (T) on what matched; a failure with a reason is reported as the pass's skip, after
// `prefix`. Nodes a rewrite removes are not matched again; nodes it adds wait for the next sweep.
template <typename MatchFn, typename RewriteFn>
void RewriteEachMatch(Graph& graph, PassContext& context, absl::string_view prefix, MatchFn&& match,
                      RewriteFn&& rewrite) {
  for (Node* node : graph.Nodes()) {
    if (node->removed()) continue;
    auto matched = match(node);
    if (matched) {
      rewrite(*std::move(matched));
    } else if (!matched.reason().empty()) {
      context.Skip(absl::StrCat(prefix, matched.reason()));
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Paths

// A path step's input to go on from: every input in turn, first match wins.
inline constexpr int kAnyInput = -1;

// A check on the node a step reached; `followed` is the input the path goes on from (for a binary
// node, the other one is the operand the step does not follow).
using NodeCheck = std::function<bool(const Graph& graph, const Node& node, int followed)>;

struct Step {
  const char* op;                // operator type, in `domain`
  int input = 0;                 // the input the path goes on from, or kAnyInput
  NodeCheck check = nullptr;     // optional
  const char* domain = "";       // "" is ONNX's own
};

struct PathMatch {
  std::vector<Node*> nodes;   // one a step: the producer of the start value first
  std::vector<int> followed;  // the input each step went on from
  std::string end;            // the value the last step went on from
  // The operand of step `step`'s binary node the path did not follow.
  const std::string& Other(size_t step) const { return nodes[step]->input(1 - followed[step]); }
};

// A whole-path check, run on each complete candidate; a rejection sends the matcher on to the next
// operand order.
using PathCheck = std::function<bool(const PathMatch& path)>;

// Follows `steps` upwards from `value`; the first complete path (in operand order, input 0 first)
// that passes every check and `accept`.
std::optional<PathMatch> MatchPath(const Graph& graph, const std::string& value, const std::vector<Step>& steps,
                                   const PathCheck& accept = nullptr);

// Step checks.
// A binary node whose operand the step does not follow is a one-element float constant within
// `tolerance` of `expected`.
NodeCheck OtherIsScalar(double expected, double tolerance);

// ---------------------------------------------------------------------------------------------------
// Single-node helpers

// The node producing `value` if it is `op` in the default domain.
Node* ProducerWithOp(const Graph& graph, const std::string& value, const char* op);

// The one node reading `value`, if exactly one does and it is no graph output.
Node* SoleConsumer(const Graph& graph, const std::string& value);

// True if `node` is Mul(a, b) in the default domain, operands in either order.
bool IsMulOf(const Node* node, const std::string& a, const std::string& b);

// The input of a binary node that is not input `index`.
inline const std::string& OtherInput(const Node& node, int index) { return node.input(1 - index); }

// The first input (input 0 first) of a binary node for which `wanted` holds: the engine's answer to
// operands in either order. nullopt for nodes with another number of inputs.
std::optional<int> FindOperand(const Node& node, const std::function<bool(const std::string& operand)>& wanted);

// A binary `op` node (default domain) with a scalar float constant operand within `tolerance` of
// `expected` (either side): the other operand.
std::optional<std::string> OperandBesideScalar(const Graph& graph, const Node* node, const char* op, double expected,
                                               double tolerance);

// A constant float holding one element (a scalar or a 1-element tensor).
std::optional<float> ConstantScalarFloat(const Graph& graph, const std::string& value);
// Whether `value` is such a constant within `tolerance` of `expected`.
bool IsScalarNear(const Graph& graph, const std::string& value, double expected, double tolerance);

// A Div or Mul (either side) by a scalar float constant: its multiplier and the scaled input.
std::optional<std::pair<float, std::string>> ScalarScale(const Graph& graph, const Node* node);

// A Transpose's perm attribute (empty when absent or for another node).
std::vector<int64_t> PermOf(const Node* node);

// A Slice's operands, with ONNX's defaults filled in: axes 0..n-1 and steps 1 when absent. Starts
// and ends may be computed (nullopt then); axes and steps must be constant, and everything given of
// one length. Opset 10 on (operands as inputs).
struct SliceSpec {
  std::optional<std::vector<int64_t>> starts, ends;
  std::vector<int64_t> axes, steps;
  // Whether it slices one axis, `axis` (negative: from the end of a rank `rank` input), with step 1.
  bool OneAxis(int64_t axis, int64_t rank) const;
};
std::optional<SliceSpec> ParseSlice(const Graph& graph, const Node& slice);

// The length of the small integer tensor `value` (a constant, or shape arithmetic the shapes track),
// and its element `index` where that is a number; nullopt where neither tells.
std::optional<size_t> ShapeValueSize(const Graph& graph, const ShapeInfo& shapes, const std::string& value);
std::optional<int64_t> ShapeValueElement(const Graph& graph, const ShapeInfo& shapes, const std::string& value,
                                         size_t index);

// (t, dim) where `read` reads one dim of Shape(t): Gather(Shape(t), i) on axis 0 with one constant index,
// or a one-element Slice(Shape(t), [i], [i + 1]) on axis 0 with step 1; negative indices count from the
// end, and Shape's start/end attributes offset them. nullopt for any other node or where t's rank is unknown.
std::optional<std::pair<std::string, int64_t>> ShapeDimRead(const Graph& graph, const ShapeInfo& shapes,
                                                            const Node& read);

// True if element `index` of the small integer tensor `value` (a constant, or shape arithmetic the
// shapes pin down) is the same number or named dim as dim `dim` of `shaped` (negative: from the end).
bool ElementIsDim(const Graph& graph, const ShapeInfo& shapes, const std::string& value, size_t index,
                  const std::string& shaped, int dim);

// True if no value a member of `pattern` computes, but `output`, is read outside the pattern or is a
// graph output: the pattern can be replaced by one node writing `output`.
bool OnlyPatternReads(const Graph& graph, const std::vector<Node*>& pattern, const std::string& output);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_MATCH_H_
