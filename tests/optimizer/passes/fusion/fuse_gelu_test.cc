// fuse_gelu: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <cmath>
#include <map>
#include <tuple>

#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;
using testing::PassRun;
using testing::RandomFloats;
using testing::RunConfig;

onnx::TensorProto Scalar(const std::string& name, float value) { return FloatTensor(name, {}, {value}); }

// h[2,8] -> Add(bias) -> x -> one of the Gelu forms -> y
onnx::ModelProto GeluModel(const std::string& form, bool leak = false) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"h", "bias"}, {"x"});
  if (form == "erf") {
    *graph.add_node() = MakeNode("Div", {"x", "sqrt2"}, {"s"});
    *graph.add_node() = MakeNode("Erf", {"s"}, {"e"});
    *graph.add_node() = MakeNode("Add", {"one", "e"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"x", "a"}, {"m"});
    *graph.add_node() = MakeNode("Mul", {"m", "half"}, {"y"});
  } else if (form == "tanh") {
    *graph.add_node() = MakeNode("Pow", {"x", "three"}, {"p"});
    *graph.add_node() = MakeNode("Mul", {"c", "p"}, {"cp"});
    *graph.add_node() = MakeNode("Add", {"x", "cp"}, {"u"});
    *graph.add_node() = MakeNode("Mul", {"u", "k"}, {"s"});
    *graph.add_node() = MakeNode("Tanh", {"s"}, {"t"});
    *graph.add_node() = MakeNode("Add", {"t", "one"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"x", "half"}, {"hx"});
    *graph.add_node() = MakeNode("Mul", {"hx", "a"}, {"y"});
  } else if (form == "tanh_hf") {  // Hugging Face's FastGELUActivation
    *graph.add_node() = MakeNode("Mul", {"x", "x"}, {"xx"});
    *graph.add_node() = MakeNode("Mul", {"c", "xx"}, {"cxx"});
    *graph.add_node() = MakeNode("Add", {"one", "cxx"}, {"u"});
    *graph.add_node() = MakeNode("Mul", {"x", "k"}, {"kx"});
    *graph.add_node() = MakeNode("Mul", {"kx", "u"}, {"s"});
    *graph.add_node() = MakeNode("Tanh", {"s"}, {"t"});
    *graph.add_node() = MakeNode("Add", {"one", "t"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"half", "x"}, {"hx"});
    *graph.add_node() = MakeNode("Mul", {"hx", "a"}, {"y"});
  } else if (form == "tanh_megatron") {  // Megatron's gelu_impl: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    *graph.add_node() = MakeNode("Mul", {"k", "x"}, {"kx"});
    *graph.add_node() = MakeNode("Mul", {"c", "x"}, {"cx"});
    *graph.add_node() = MakeNode("Mul", {"cx", "x"}, {"cxx"});
    *graph.add_node() = MakeNode("Add", {"cxx", "one"}, {"u"});
    *graph.add_node() = MakeNode("Mul", {"kx", "u"}, {"s"});
    *graph.add_node() = MakeNode("Tanh", {"s"}, {"t"});
    *graph.add_node() = MakeNode("Add", {"t", "one"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"x", "half"}, {"hx"});
    *graph.add_node() = MakeNode("Mul", {"hx", "a"}, {"y"});
  } else if (form == "tanh_folded") {  // x * (0.7978845608 + 0.0356774 * x * x)
    *graph.add_node() = MakeNode("Mul", {"x", "x"}, {"xx"});
    *graph.add_node() = MakeNode("Mul", {"xx", "kc"}, {"kcxx"});
    *graph.add_node() = MakeNode("Add", {"kcxx", "k"}, {"u"});
    *graph.add_node() = MakeNode("Mul", {"x", "u"}, {"s"});
    *graph.add_node() = MakeNode("Tanh", {"s"}, {"t"});
    *graph.add_node() = MakeNode("Add", {"t", "one"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"x", "a"}, {"xa"});
    *graph.add_node() = MakeNode("Mul", {"xa", "half"}, {"y"});
  } else if (form == "erf_mul") {  // x * (1 / sqrt(2))
    *graph.add_node() = MakeNode("Mul", {"x", "inv_sqrt2"}, {"s"});
    *graph.add_node() = MakeNode("Erf", {"s"}, {"e"});
    *graph.add_node() = MakeNode("Add", {"e", "one"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"half", "a"}, {"ha"});
    *graph.add_node() = MakeNode("Mul", {"ha", "x"}, {"y"});
  } else {  // quick
    *graph.add_node() = MakeNode("Mul", {"alpha", "x"}, {"s"});
    *graph.add_node() = MakeNode("Sigmoid", {"s"}, {"g"});
    *graph.add_node() = MakeNode("Mul", {"g", "x"}, {"y"});
  }
  for (auto t : {Scalar("sqrt2", std::sqrt(2.0f)), Scalar("one", 1), Scalar("half", 0.5f), Scalar("three", 3),
                 Scalar("c", 0.044715f), Scalar("k", std::sqrt(2.0f / static_cast<float>(M_PI))), Scalar("alpha", 1.702f),
                 Scalar("kc", 0.0356774f), Scalar("inv_sqrt2", 0.70710678f)}) {
    *graph.add_initializer() = t;
  }
  *graph.add_initializer() = FloatTensor("bias", {8}, RandomFloats(8, 41));
  *graph.add_input() = FloatValue("h", {2, 8});
  *graph.add_output() = FloatValue("y", {2, 8});
  if (leak) *graph.add_output() = FloatValue(form == "quick" ? "g" : "a", {2, 8});
  onnx::ModelProto model = MakeModel(graph, 13);
  return model;
}

TEST(FuseGeluTest, FusesEachFormAndAbsorbsTheBias) {
  for (const auto& [form, op, bias_absorbed] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"erf", "BiasGelu", true}, {"erf_mul", "BiasGelu", true}, {"tanh", "FastGelu", true},
           {"tanh_hf", "FastGelu", true}, {"tanh_megatron", "FastGelu", true}, {"tanh_folded", "FastGelu", true},
           {"quick", "QuickGelu", false}}) {
    const onnx::ModelProto original = GeluModel(form);
    PassRun run = RunConfig(R"({"passes": [{"name": "fuse_gelu"}, {"name": "eliminate_unused_initializers"}]})", original);
    ASSERT_TRUE(run.status.ok()) << form;
    std::map<std::string, int> expected = {{op, 1}};
    if (!bias_absorbed) expected["Add"] = 1;
    EXPECT_EQ(OpCounts(run.model), expected) << form;
    bool imports_microsoft = false;
    for (const auto& import : run.model.opset_import()) imports_microsoft |= import.domain() == "com.microsoft";
    EXPECT_TRUE(imports_microsoft) << form;
    ExpectSameOutputs(original, run.model, 1e-4, 1e-3);
  }
}

TEST(FuseGeluTest, LeavesPatternsWithOutsideReadersAlone) {
  for (const char* form : {"erf", "tanh", "tanh_hf", "tanh_megatron", "quick"}) {
    PassRun run = RunConfig(R"({"passes": [{"name": "fuse_gelu"}]})", GeluModel(form, /*leak=*/true));
    ASSERT_TRUE(run.status.ok());
    EXPECT_EQ(run.report.rewrites(), 0) << form;
  }
}

}  // namespace
}  // namespace onnxopt
