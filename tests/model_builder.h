// Small helpers to write ONNX models by hand in tests, in the spirit of onnx.helper.
#ifndef ONNXOPT_TESTS_MODEL_BUILDER_H_
#define ONNXOPT_TESTS_MODEL_BUILDER_H_

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "onnx/onnx_pb.h"
#include "optimizer/passes/constants.h"

namespace onnxopt::testing {

inline onnx::NodeProto MakeNode(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
                                const std::string& name = "") {
  onnx::NodeProto node;
  node.set_op_type(op);
  node.set_name(name.empty() ? op + "_" + (outputs.empty() ? std::string("x") : outputs[0]) : name);
  for (auto& input : inputs) node.add_input(input);
  for (auto& output : outputs) node.add_output(output);
  return node;
}

inline onnx::ValueInfoProto MakeValue(const std::string& name, int32_t element_type, std::vector<int64_t> dims) {
  onnx::ValueInfoProto value;
  value.set_name(name);
  auto* tensor = value.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(element_type);
  auto* shape = tensor->mutable_shape();
  for (int64_t dim : dims) {
    if (dim < 0) {
      shape->add_dim()->set_dim_param("batch");
    } else {
      shape->add_dim()->set_dim_value(dim);
    }
  }
  return value;
}

inline onnx::ValueInfoProto FloatValue(const std::string& name, std::vector<int64_t> dims) {
  return MakeValue(name, onnx::TensorProto::FLOAT, std::move(dims));
}

inline onnx::TensorProto FloatTensor(const std::string& name, std::vector<int64_t> dims, std::vector<float> values) {
  return MakeFloatTensor(name, dims, values);
}

inline onnx::TensorProto BoolScalar(const std::string& name, bool value) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(onnx::TensorProto::BOOL);
  tensor.add_int32_data(value ? 1 : 0);
  return tensor;
}

inline onnx::ModelProto MakeModel(onnx::GraphProto graph, int64_t opset = 14) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("onnxopt-tests");
  auto* import = model.add_opset_import();
  import->set_domain("");
  import->set_version(opset);
  *model.mutable_graph() = std::move(graph);
  if (model.graph().name().empty()) model.mutable_graph()->set_name("test");
  return model;
}

inline onnx::NodeProto WithIntAttribute(onnx::NodeProto node, const std::string& name, int64_t value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INT);
  attribute->set_i(value);
  return node;
}

inline onnx::NodeProto WithIntsAttribute(onnx::NodeProto node, const std::string& name, std::vector<int64_t> values) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INTS);
  for (int64_t value : values) attribute->add_ints(value);
  return node;
}

inline onnx::NodeProto WithGraphAttribute(onnx::NodeProto node, const std::string& name, onnx::GraphProto graph) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::GRAPH);
  *attribute->mutable_g() = std::move(graph);
  return node;
}

// Seeded standard-normal floats.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(n);
  for (auto& value : values) value = normal(random);
  return values;
}

// Op type -> count over the main graph.
inline std::map<std::string, int> OpCounts(const onnx::ModelProto& model) {
  std::map<std::string, int> ops;
  for (const auto& node : model.graph().node()) ++ops[node.op_type()];
  return ops;
}

// The folders TempDir made, removed when the test binary exits normally (one that crashed leaves them
// to look at); only by the process that made them, not by a forked child that exits.
class TempDirsRemovedAtExit {
 public:
  static TempDirsRemovedAtExit& Get() {
    static TempDirsRemovedAtExit dirs;
    return dirs;
  }
  void Add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(dir);
  }
  ~TempDirsRemovedAtExit() {
    if (::getpid() != owner_) return;
    std::error_code ignored;
    for (const auto& dir : dirs_) std::filesystem::remove_all(dir, ignored);
  }

 private:
  TempDirsRemovedAtExit() = default;
  const pid_t owner_ = ::getpid();
  std::mutex mutex_;
  std::vector<std::filesystem::path> dirs_;
};

// An empty folder /tmp/onnxopt_<name>_<pid> for one test's files, removed when the test binary exits.
inline std::filesystem::path TempDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("onnxopt_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  TempDirsRemovedAtExit::Get().Add(dir);
  return dir;
}

// A tmpfs of `size` (mount's form: "64k", "4m") mounted on `dir` (made if missing) for as long as the
// object lives, to fill a disk for real; nullptr, with the reason in `why`, where mounting is not
// allowed (not root).
class SmallDisk {
 public:
  explicit SmallDisk(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~SmallDisk() { ::umount2(dir_.c_str(), MNT_DETACH); }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;

 private:
  std::filesystem::path dir_;
};
inline std::unique_ptr<SmallDisk> MountSmallDisk(const std::filesystem::path& dir, const std::string& size,
                                                 std::string* why) {
  std::filesystem::create_directories(dir);
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) {
    *why = std::string("cannot mount a tmpfs here (") + std::strerror(errno) + "); run as root to test a full disk";
    return nullptr;
  }
  return std::make_unique<SmallDisk>(dir);
}

// Where the fixtures live; CMake passes the source folder in ONNXOPT_SOURCE_DIR.
inline std::filesystem::path FixturePath(const std::string& name) {
  return std::filesystem::path(ONNXOPT_SOURCE_DIR) / "tests" / "fixtures" / name;
}

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_MODEL_BUILDER_H_
