#include "optimizer/runtime_requirements.h"

#include <iterator>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace onnxopt {
namespace {

constexpr char kFloor[] = "1.10";
constexpr char kNone[] = "";  // no kernel on this provider in any release

// The first release implementing each default-domain opset (compatibility.md's matrix to 1.20; later
// ones measured: the newest opset each release's checker accepts).
struct OpsetSupport {
  int opset;
  const char* release;
};
constexpr OpsetSupport kOpsetSupport[] = {
    {16, "1.11"}, {17, "1.12"}, {18, "1.14"}, {19, "1.15"}, {20, "1.17"}, {21, "1.18"},
    {22, "1.21"}, {23, "1.23"}, {24, "1.24.3"}, {25, "1.24.3"}, {26, "1.25.1"},
};

struct Kernels {
  const char* cpu;
  const char* cuda;
};

const std::map<std::string, Kernels>& ContribKernels() {
  static const auto* kernels = new std::map<std::string, Kernels>{
      {"com.microsoft::Attention", {kFloor, kFloor}},
      {"com.microsoft::EmbedLayerNormalization", {kFloor, kFloor}},
      {"com.microsoft::SkipLayerNormalization", {kFloor, kFloor}},
      {"com.microsoft::FastGelu", {kFloor, kFloor}},
      {"com.microsoft::BiasGelu", {kFloor, kFloor}},
      {"com.microsoft::Gelu", {kFloor, kFloor}},
      {"com.microsoft::QAttention", {kFloor, kFloor}},
      {"com.microsoft::DynamicQuantizeMatMul", {kFloor, kNone}},
      {"com.microsoft::MatMulIntegerToFloat", {kFloor, kNone}},
      {"SimplifiedLayerNormalization", {kFloor, kFloor}},  // ONNX Runtime registers it in the default domain
      {"com.microsoft::QuickGelu", {"1.14", "1.14"}},
      {"com.microsoft::GroupNorm", {kNone, "1.14"}},
      {"com.microsoft::MultiHeadAttention", {"1.15", "1.14"}},
      {"com.microsoft::SkipSimplifiedLayerNormalization", {"1.16.2", "1.14"}},
      {"com.microsoft::PackedAttention", {kNone, "1.15"}},
      {"com.microsoft::BiasAdd", {kNone, "1.15"}},
      {"com.microsoft::RotaryEmbedding", {"1.16.2", "1.16.2"}},
      {"com.microsoft::MatMulNBits", {"1.16.2", "1.16.2"}},
      {"com.microsoft::GroupQueryAttention", {"1.18", "1.16.2"}},  // float on the CPU from 1.18
  };
  return *kernels;
}

// GroupQueryAttention grew attributes and inputs over releases (same on every provider).
std::vector<std::pair<const char*, const char*>> GroupQueryAttentionNeeds(const onnx::NodeProto& node) {
  std::vector<std::pair<const char*, const char*>> needs;
  for (const onnx::AttributeProto& attribute : node.attribute()) {
    const std::string& name = attribute.name();
    if (name == "do_rotary" || name == "rotary_interleaved" || name == "local_window_size") {
      needs.push_back({"1.17", "GroupQueryAttention's rotary and local-window attributes"});
    } else if (name == "smooth_softmax") {
      needs.push_back({"1.19.2", "GroupQueryAttention's smooth_softmax"});
    } else if (name == "softcap") {
      needs.push_back({"1.20", "GroupQueryAttention's softcap"});
    } else if (name == "qk_output") {
      needs.push_back({"1.23", "GroupQueryAttention's qk_output"});
    }
  }
  if (node.input_size() > 7) needs.push_back({"1.17", "GroupQueryAttention's cos/sin cache inputs"});
  if (node.input_size() > 9) needs.push_back({"1.22", "GroupQueryAttention's position_ids/attention_bias inputs"});
  if (node.input_size() > 11) needs.push_back({"1.23", "GroupQueryAttention's head_sink input"});
  return needs;
}

std::tuple<int, int, int> Parse(const std::string& release) {
  std::vector<std::string> parts = absl::StrSplit(release, '.');
  int numbers[3] = {0, 0, 0};
  for (size_t i = 0; i < parts.size() && i < 3; ++i) {
    if (!absl::SimpleAtoi(parts[i], &numbers[i])) return {0, 0, 0};
  }
  return {numbers[0], numbers[1], numbers[2]};
}

class Requirements {
 public:
  explicit Requirements(bool cuda) : cuda_(cuda) {}

  void Raise(const std::string& release, const std::string& reason) {
    if (unavailable_) return;
    if (release.empty()) {  // no kernel on this provider: nothing to pin
      unavailable_ = true;
      result_.version.clear();
      result_.reason = absl::StrCat(reason, " has no ", cuda_ ? "CUDA" : "CPU", " kernel in any ONNX Runtime release");
      return;
    }
    if (Parse(release) > Parse(result_.version)) {
      result_.version = release;
      result_.reason = reason;
    }
  }

  // Nothing onnxopt knows dates it: no version is claimed.
  void Unknown(const std::string& reason) {
    unavailable_ = true;
    result_.version.clear();
    result_.reason = reason;
  }

  void Visit(const onnx::GraphProto& graph) {
    for (const onnx::NodeProto& node : graph.node()) {
      const bool microsoft = node.domain() == "com.microsoft";
      const std::string key = microsoft ? absl::StrCat("com.microsoft::", node.op_type()) : node.op_type();
      auto kernels = ContribKernels().find(key);
      if (kernels != ContribKernels().end()) {
        result_.contrib = true;
        Raise(cuda_ ? kernels->second.cuda : kernels->second.cpu, key);
      } else if (microsoft) {
        result_.contrib = true;  // not one onnxopt emits: whatever made it knows its release
      }
      if (microsoft && node.op_type() == "GroupQueryAttention") {
        for (const auto& [release, reason] : GroupQueryAttentionNeeds(node)) Raise(release, reason);
      }
      for (const onnx::AttributeProto& attribute : node.attribute()) {
        if (attribute.has_g()) Visit(attribute.g());
        for (const onnx::GraphProto& subgraph : attribute.graphs()) Visit(subgraph);
      }
    }
  }

  RuntimeRequirement result() const { return result_; }

 private:
  const bool cuda_;
  bool unavailable_ = false;
  RuntimeRequirement result_{kFloor, "onnxopt's floor: what ONNX Runtime 1.10 had is not dated further", false};
};

}  // namespace

RuntimeRequirement MinimumOnnxRuntime(const onnx::ModelProto& model, bool cuda) {
  Requirements requirements(cuda);
  for (const onnx::OperatorSetIdProto& opset : model.opset_import()) {
    if (!opset.domain().empty() && opset.domain() != "ai.onnx") continue;
    for (const OpsetSupport& support : kOpsetSupport) {
      if (support.opset == opset.version()) requirements.Raise(support.release, absl::StrCat("opset ", opset.version()));
    }
    if (opset.version() > std::end(kOpsetSupport)[-1].opset) {
      requirements.Unknown(absl::StrCat("opset ", opset.version(), " is newer than onnxopt's table of releases"));
    }
  }
  requirements.Visit(model.graph());
  return requirements.result();
}

}  // namespace onnxopt
