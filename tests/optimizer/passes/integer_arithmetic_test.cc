// fold_constants' native integer evaluator against ONNX Runtime: every form it evaluates must give
// ONNX Runtime's element type, dims and values.
#include <limits>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/passes/integer_arithmetic.h"
#include "optimizer/tensor_convert.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::MakeModel;
using testing::MakeNode;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

IntTensor Ints(std::vector<int64_t> dims, std::vector<int64_t> values, int32_t type = onnx::TensorProto::INT64) {
  return IntTensor{type, std::move(dims), std::move(values)};
}

struct Case {
  std::string label;
  onnx::NodeProto node;
  std::vector<IntTensor> inputs;
  int64_t opset = 17;
};

// The node run alone in ONNX Runtime, its inputs as initializers.
IntTensor RunInOnnxRuntime(const Case& c) {
  onnx::GraphProto graph;
  onnx::NodeProto node = c.node;
  node.clear_input();
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    node.add_input(name);
    *graph.add_initializer() = IntTensorToProto(c.inputs[i], name);
  }
  node.clear_output();
  node.add_output("out");
  *graph.add_node() = node;
  graph.add_output()->set_name("out");
  const onnx::ModelProto model = MakeModel(graph, c.opset);
  auto bytes = SerializeForRuntime(model);
  EXPECT_TRUE(bytes.ok()) << c.label;
  auto session = CreateSession({*bytes, {}}, SessionSettings());
  EXPECT_TRUE(session.ok()) << c.label << ": " << session.status();
  const char* output = "out";
  std::vector<Ort::Value> results = (*session)->Run(Ort::RunOptions{nullptr}, nullptr, nullptr, 0, &output, 1);
  auto tensor = OrtValueToTensorProto(results[0], "out");
  EXPECT_TRUE(tensor.ok()) << c.label;
  auto ints = IntTensorFromProto(*tensor);
  EXPECT_TRUE(ints.has_value()) << c.label;
  return *ints;
}

std::optional<IntTensor> EvaluateNatively(const Case& c) {
  std::vector<const IntTensor*> inputs;
  onnx::NodeProto node = c.node;
  node.clear_input();
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    inputs.push_back(&c.inputs[i]);
    node.add_input("in" + std::to_string(i));
  }
  node.clear_output();
  node.add_output("out");
  return EvaluateIntegerNode(node, inputs, c.opset);
}

TEST(IntegerArithmeticTest, EveryFormGivesWhatOnnxRuntimeGives) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const IntTensor m23 = Ints({2, 3}, {1, 2, 3, 4, 5, 6});
  const IntTensor v5 = Ints({5}, {10, 11, 12, 13, 14});
  const std::vector<Case> cases = {
      {"unsqueeze axes input", MakeNode("Unsqueeze", {}, {}), {m23, Ints({2}, {0, -1})}},
      {"unsqueeze axes attribute", WithIntsAttribute(MakeNode("Unsqueeze", {}, {}), "axes", {1}), {v5}, 11},
      {"unsqueeze scalar", MakeNode("Unsqueeze", {}, {}), {Ints({}, {7}), Ints({1}, {0})}},
      {"squeeze all ones", MakeNode("Squeeze", {}, {}), {Ints({1, 3, 1}, {1, 2, 3})}},
      {"squeeze axis", MakeNode("Squeeze", {}, {}), {Ints({2, 1}, {4, 5}), Ints({1}, {-1})}},
      {"concat 1-D", WithIntAttribute(MakeNode("Concat", {}, {}), "axis", 0),
       {Ints({2}, {1, 2}), Ints({3}, {3, 4, 5}), Ints({1}, {-1})}},
      {"concat axis 1", WithIntAttribute(MakeNode("Concat", {}, {}), "axis", 1), {Ints({2, 2}, {1, 2, 3, 4}), m23}},
      {"concat int32 axis -1", WithIntAttribute(MakeNode("Concat", {}, {}), "axis", -1),
       {Ints({1}, {1}, onnx::TensorProto::INT32), Ints({2}, {2, 3}, onnx::TensorProto::INT32)}},
      {"gather scalar negative", MakeNode("Gather", {}, {}), {v5, Ints({}, {-1})}},
      {"gather axis 1 matrix indices", WithIntAttribute(MakeNode("Gather", {}, {}), "axis", 1),
       {m23, Ints({2, 2}, {0, 2, 1, 1})}},
      {"slice to the end", MakeNode("Slice", {}, {}), {v5, Ints({1}, {1}), Ints({1}, {kMax})}},
      {"slice reversed", MakeNode("Slice", {}, {}),
       {v5, Ints({1}, {-1}), Ints({1}, {kMin}), Ints({1}, {0}), Ints({1}, {-1})}},
      {"slice every other column", MakeNode("Slice", {}, {}),
       {m23, Ints({1}, {0}), Ints({1}, {3}), Ints({1}, {1}), Ints({1}, {2})}},
      {"slice negative step stops early", MakeNode("Slice", {}, {}),
       {v5, Ints({1}, {4}), Ints({1}, {1}), Ints({1}, {0}), Ints({1}, {-2})}},
      {"slice empty", MakeNode("Slice", {}, {}), {v5, Ints({1}, {3}), Ints({1}, {1})}},
      {"slice reversed to an INT64_MAX end", MakeNode("Slice", {}, {}),
       {v5, Ints({1}, {-1}), Ints({1}, {kMax}), Ints({1}, {0}), Ints({1}, {-1})}},
      {"slice of an empty axis, reversed", MakeNode("Slice", {}, {}),
       {Ints({0}, {}), Ints({1}, {-1}), Ints({1}, {kMin}), Ints({1}, {0}), Ints({1}, {-1})}},
      {"slice with a huge step", MakeNode("Slice", {}, {}),
       {v5, Ints({1}, {1}), Ints({1}, {kMax}), Ints({1}, {0}), Ints({1}, {kMax})}},
      {"slice attributes", WithIntsAttribute(WithIntsAttribute(MakeNode("Slice", {}, {}), "starts", {-2}), "ends", {kMax}),
       {v5}, 9},
      {"reshape 0 and -1", MakeNode("Reshape", {}, {}), {m23, Ints({2}, {0, -1})}},
      {"reshape flat", MakeNode("Reshape", {}, {}), {m23, Ints({1}, {-1})}},
      {"cast narrows", WithIntAttribute(MakeNode("Cast", {}, {}), "to", onnx::TensorProto::INT32),
       {Ints({3}, {(int64_t{1} << 33) + 5, -1, 70000})}},
      {"cast widens", WithIntAttribute(MakeNode("Cast", {}, {}), "to", onnx::TensorProto::INT64),
       {Ints({2}, {-3, 9}, onnx::TensorProto::INT32)}},
      {"add broadcast", MakeNode("Add", {}, {}), {m23, Ints({3}, {100, 200, 300})}},
      {"sub int32 wraps", MakeNode("Sub", {}, {}),
       {Ints({1}, {-2147483647 - 1}, onnx::TensorProto::INT32), Ints({}, {1}, onnx::TensorProto::INT32)}},
      {"mul outer", MakeNode("Mul", {}, {}), {Ints({2, 1}, {2, 3}), Ints({1, 3}, {5, 7, -1})}},
      {"div truncates", MakeNode("Div", {}, {}), {Ints({4}, {-7, 7, -7, 7}), Ints({4}, {2, -2, -2, 2})}},
      {"range up", MakeNode("Range", {}, {}), {Ints({}, {2}), Ints({}, {11}), Ints({}, {3})}},
      {"range down", MakeNode("Range", {}, {}), {Ints({}, {10}), Ints({}, {0}), Ints({}, {-3})}},
      {"range empty", MakeNode("Range", {}, {}), {Ints({}, {0}), Ints({}, {0}), Ints({}, {1})}},
      {"identity", MakeNode("Identity", {}, {}), {m23}},
  };
  for (const Case& c : cases) {
    std::optional<IntTensor> native = EvaluateNatively(c);
    EXPECT_TRUE(native.has_value()) << c.label;
    if (!native) continue;
    const IntTensor expected = RunInOnnxRuntime(c);
    EXPECT_EQ(native->data_type, expected.data_type) << c.label;
    EXPECT_EQ(native->dims, expected.dims) << c.label;
    EXPECT_EQ(native->values, expected.values) << c.label;
  }

  onnx::NodeProto fill = MakeNode("ConstantOfShape", {}, {});
  auto* value = fill.add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  *value->mutable_t() = IntTensorToProto(Ints({1}, {7}), "");
  const Case constant_of_shape{"constant of shape", fill, {Ints({2}, {2, 3})}};
  ASSERT_TRUE(EvaluateNatively(constant_of_shape).has_value());
  const IntTensor expected = RunInOnnxRuntime(constant_of_shape);
  EXPECT_EQ(EvaluateNatively(constant_of_shape)->dims, expected.dims);
  EXPECT_EQ(EvaluateNatively(constant_of_shape)->values, expected.values);
}

// What is not evaluated natively is left to ONNX Runtime, never guessed.
TEST(IntegerArithmeticTest, LeavesEverythingElseToOnnxRuntime) {
  const IntTensor v2 = Ints({2}, {4, 6});
  const std::vector<Case> cases = {
      {"division by zero", MakeNode("Div", {}, {}), {v2, Ints({2}, {2, 0})}},
      {"float zeros (no value)", MakeNode("ConstantOfShape", {}, {}), {Ints({1}, {3})}},
      {"a boolean result", MakeNode("Equal", {}, {}), {v2, v2}},
      {"mixed element types", MakeNode("Add", {}, {}), {v2, Ints({2}, {1, 1}, onnx::TensorProto::INT32)}},
      {"cast to float", WithIntAttribute(MakeNode("Cast", {}, {}), "to", onnx::TensorProto::FLOAT), {v2}},
      {"gather out of range", MakeNode("Gather", {}, {}), {v2, Ints({}, {2})}},
      {"reshape to a wrong size", MakeNode("Reshape", {}, {}), {v2, Ints({1}, {3})}},
      {"too big", MakeNode("Range", {}, {}), {Ints({}, {0}), Ints({}, {1000000}), Ints({}, {1})}},
      {"squeeze with empty axes", MakeNode("Squeeze", {}, {}), {Ints({1, 2}, {4, 6}), Ints({0}, {})}},
      {"int32 overflowing division", MakeNode("Div", {}, {}),
       {Ints({1}, {-2147483647 - 1}, onnx::TensorProto::INT32), Ints({1}, {-1}, onnx::TensorProto::INT32)}},
  };
  for (const Case& c : cases) EXPECT_FALSE(EvaluateNatively(c).has_value()) << c.label;
}

}  // namespace
}  // namespace onnxopt
