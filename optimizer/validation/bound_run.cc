#include "optimizer/validation/bound_run.h"

#include "absl/strings/str_cat.h"
#include "onnx/onnx_pb.h"

namespace onnxopt {
namespace {

// A graph passing each of `values` through an Identity node: its outputs are what a session
// on the target device allocates, where the outputs are bound.
onnx::ModelProto IdentityModel(const std::vector<std::string>& names, const std::vector<Ort::Value>& values) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(13);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("copy");
  for (size_t i = 0; i < names.size(); ++i) {
    const auto element_type = values[i].GetTensorTypeAndShapeInfo().GetElementType();
    const std::string input = absl::StrCat("in", i), output = absl::StrCat("out", i);
    for (auto [list, name] : {std::pair{graph->mutable_input(), input}, std::pair{graph->mutable_output(), output}}) {
      onnx::ValueInfoProto* info = list->Add();
      info->set_name(name);
      info->mutable_type()->mutable_tensor_type()->set_elem_type(static_cast<int32_t>(element_type));
    }
    onnx::NodeProto* node = graph->add_node();
    node->set_op_type("Identity");
    node->set_name(absl::StrCat("copy", i));
    node->add_input(input);
    node->add_output(output);
  }
  return model;
}

}  // namespace

Ort::MemoryInfo DeviceMemory(v1::Device device) {
  if (device == v1::DEVICE_CUDA) return Ort::MemoryInfo("Cuda", OrtDeviceAllocator, 0, OrtMemTypeDefault);
  return Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
}

absl::StatusOr<std::vector<Ort::Value>> CopyValues(const std::vector<std::string>& names,
                                                   const std::vector<Ort::Value>& values, v1::Device device,
                                                   const Ort::MemoryInfo& target) {
  SessionSettings settings;
  settings.device = device;
  settings.optimization_level = ORT_DISABLE_ALL;  // the Identity nodes are the point
  settings.intra_op_threads = 1;
  absl::StatusOr<std::unique_ptr<Ort::Session>> session =
      CreateSession(ModelSource{IdentityModel(names, values).SerializeAsString(), {}}, settings);
  if (!session.ok()) return session.status();
  try {
    Ort::IoBinding binding(**session);
    for (size_t i = 0; i < values.size(); ++i) {
      binding.BindInput(absl::StrCat("in", i).c_str(), values[i]);
      binding.BindOutput(absl::StrCat("out", i).c_str(), target);
    }
    (*session)->Run(Ort::RunOptions{nullptr}, binding);
    binding.SynchronizeOutputs();
    return binding.GetOutputValues();
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("cannot copy the inputs to the device: ", e.what()));
  }
}

BoundRun::BoundRun(Ort::Session& session, std::vector<std::string> output_names)
    : session_(session), binding_(session), output_names_(std::move(output_names)) {}

absl::StatusOr<std::unique_ptr<BoundRun>> BoundRun::Create(Ort::Session& session, const GeneratedInputs& inputs,
                                                           const std::vector<std::string>& output_names,
                                                           v1::Device device, Residence residence) {
  const v1::Device memory = residence == Residence::kDevice ? device : v1::DEVICE_CPU;
  std::unique_ptr<BoundRun> run;
  try {
    run.reset(new BoundRun(session, output_names));
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("cannot bind the session's inputs and outputs: ", e.what()));
  }
  const std::vector<Ort::Value>* bound = &inputs.values;
  if (residence == Residence::kDevice) {
    absl::StatusOr<std::vector<Ort::Value>> uploaded =
        CopyValues(inputs.names, inputs.values, device, DeviceMemory(device));
    if (!uploaded.ok()) return uploaded.status();
    run->inputs_ = *std::move(uploaded);
    bound = &run->inputs_;
  }
  try {
    for (size_t i = 0; i < inputs.names.size(); ++i) run->binding_.BindInput(inputs.names[i].c_str(), (*bound)[i]);
    const Ort::MemoryInfo output_memory = DeviceMemory(memory);
    for (const auto& name : output_names) run->binding_.BindOutput(name.c_str(), output_memory);
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("cannot bind the session's inputs and outputs: ", e.what()));
  }
  return run;
}

absl::Status BoundRun::Run() {
  try {
    session_.Run(Ort::RunOptions{nullptr}, binding_);
    binding_.SynchronizeOutputs();
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("ONNX Runtime failed on a bound run: ", e.what()));
  }
  ran_ = true;
  return absl::OkStatus();
}

absl::Status BoundRun::FixOutputs() {
  if (!ran_) return absl::FailedPreconditionError("outputs can be fixed after a run only");
  try {
    fixed_outputs_ = binding_.GetOutputValues();
    binding_.ClearBoundOutputs();
    for (size_t i = 0; i < output_names_.size(); ++i) binding_.BindOutput(output_names_[i].c_str(), fixed_outputs_[i]);
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("cannot bind fixed output buffers: ", e.what()));
  }
  return absl::OkStatus();
}

std::vector<Ort::Value> BoundRun::Outputs() {
  try {
    return binding_.GetOutputValues();
  } catch (const Ort::Exception&) {
    return {};
  }
}

}  // namespace onnxopt
