#include "client/model_repository.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/deploy_settings.h"
#include "optimizer/cache_interface.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"
#include "optimizer/result_files.h"
#include "optimizer/runtime_requirements.h"

namespace onnxopt::client {
namespace fs = std::filesystem;
namespace {

// Triton's DataType names for ONNX element types; "" for types Triton has none for.
std::string TritonType(int32_t elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::BOOL: return "TYPE_BOOL";
    case onnx::TensorProto::UINT8: return "TYPE_UINT8";
    case onnx::TensorProto::UINT16: return "TYPE_UINT16";
    case onnx::TensorProto::UINT32: return "TYPE_UINT32";
    case onnx::TensorProto::UINT64: return "TYPE_UINT64";
    case onnx::TensorProto::INT8: return "TYPE_INT8";
    case onnx::TensorProto::INT16: return "TYPE_INT16";
    case onnx::TensorProto::INT32: return "TYPE_INT32";
    case onnx::TensorProto::INT64: return "TYPE_INT64";
    case onnx::TensorProto::FLOAT16: return "TYPE_FP16";
    case onnx::TensorProto::FLOAT: return "TYPE_FP32";
    case onnx::TensorProto::DOUBLE: return "TYPE_FP64";
    case onnx::TensorProto::STRING: return "TYPE_STRING";
    case onnx::TensorProto::BFLOAT16: return "TYPE_BF16";
    default: return "";
  }
}

bool IsDynamic(const onnx::TensorShapeProto::Dimension& dim) { return !dim.has_dim_value() || dim.dim_value() < 0; }

const onnx::TypeProto::Tensor* TensorType(const onnx::ValueInfoProto& value) {
  return value.type().has_tensor_type() ? &value.type().tensor_type() : nullptr;
}

// The graph's inputs that are fed (initializers listed as inputs are overridable weights, not requests).
std::vector<const onnx::ValueInfoProto*> FedInputs(const onnx::GraphProto& graph) {
  std::vector<std::string> initializers;
  for (const auto& tensor : graph.initializer()) initializers.push_back(tensor.name());
  std::sort(initializers.begin(), initializers.end());
  std::vector<const onnx::ValueInfoProto*> fed;
  for (const auto& input : graph.input()) {
    if (!std::binary_search(initializers.begin(), initializers.end(), input.name())) fed.push_back(&input);
  }
  return fed;
}

// Batching is Triton's when every input and output leads with a dynamic dim (the batch).
bool Batchable(const onnx::GraphProto& graph) {
  auto leads_dynamic = [](const onnx::ValueInfoProto& value) {
    const onnx::TypeProto::Tensor* tensor = TensorType(value);
    return tensor != nullptr && tensor->has_shape() && tensor->shape().dim_size() > 0 &&
           IsDynamic(tensor->shape().dim(0));
  };
  std::vector<const onnx::ValueInfoProto*> values = FedInputs(graph);
  for (const auto& output : graph.output()) values.push_back(&output);
  return !values.empty() && std::all_of(values.begin(), values.end(), [&](const auto* v) { return leads_dynamic(*v); });
}

void AppendTensor(std::string* config, const onnx::ValueInfoProto& value, bool batched) {
  const onnx::TypeProto::Tensor* tensor = TensorType(value);
  std::vector<std::string> dims;
  if (tensor != nullptr && tensor->has_shape()) {
    for (int i = batched ? 1 : 0; i < tensor->shape().dim_size(); ++i) {
      const auto& dim = tensor->shape().dim(i);
      dims.push_back(IsDynamic(dim) ? "-1" : absl::StrCat(dim.dim_value()));
    }
  } else {
    dims.push_back("-1");  // rank unknown: Triton needs some shape; one dynamic dim is the loosest it takes
  }
  if (dims.empty()) dims.push_back("1");  // a scalar: Triton's convention is dims [1]
  absl::StrAppend(config, "  {\n    name: \"", absl::CEscape(value.name()), "\"\n    data_type: ",
                  tensor != nullptr ? TritonType(tensor->elem_type()) : "TYPE_INVALID", "\n    dims: [ ",
                  absl::StrJoin(dims, ", "), " ]\n  }");
}

void AppendList(std::string* config, const std::string& field, const std::vector<const onnx::ValueInfoProto*>& values,
                bool batched) {
  absl::StrAppend(config, field, " [\n");
  for (size_t i = 0; i < values.size(); ++i) {
    AppendTensor(config, *values[i], batched);
    absl::StrAppend(config, i + 1 < values.size() ? ",\n" : "\n");
  }
  absl::StrAppend(config, "]\n");
}

void AppendParameter(std::string* config, const std::string& key, const std::string& value) {
  absl::StrAppend(config, "parameters { key: \"", absl::CEscape(key), "\" value: { string_value: \"", absl::CEscape(value),
                  "\" } }\n");
}

// Triton's onnxruntime backend spells ONNX Runtime's graph optimization level -1 basic, 1 extended
// (basic plus fusions), 2 disabled, and leaves everything on when unset.
std::string GraphLevel(const std::string& level) {
  if (level == "basic") return "-1";
  if (level == "extended") return "1";
  if (level == "disabled" || level == "none") return "2";
  return "";
}

bool ValidModelName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.'; });
}

// A YAML double-quoted scalar: backslash, quote and control characters escaped, UTF-8 kept.
std::string YamlQuoted(const std::string& text) {
  std::string quoted = "\"";
  for (unsigned char c : text) {
    if (c == '\\' || c == '"') {
      quoted.push_back('\\');
      quoted.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&quoted, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      quoted.push_back(static_cast<char>(c));
    }
  }
  return quoted + "\"";
}

// A Kubernetes object name (DNS-1035 label: a-z first, then a-z 0-9 -, at most 63) for `name`.
std::string KubernetesName(const std::string& name) {
  std::string label;
  for (char c : absl::AsciiStrToLower(name)) label.push_back(absl::ascii_isalnum(c) ? c : '-');
  if (label.empty() || !absl::ascii_isalpha(label[0])) label = "m-" + label;
  if (label.size() > 63) label.resize(63);
  while (!label.empty() && label.back() == '-') label.pop_back();
  return label;
}

// Triton has a type for every input and output.
absl::Status InterfaceFitsTriton(const onnx::ModelProto& model) {
  std::vector<const onnx::ValueInfoProto*> interface = FedInputs(model.graph());
  for (const auto& output : model.graph().output()) interface.push_back(&output);
  for (const onnx::ValueInfoProto* value : interface) {
    const onnx::TypeProto::Tensor* tensor = TensorType(*value);
    if (tensor == nullptr || TritonType(tensor->elem_type()).empty()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::REPOSITORY_UNSUPPORTED,
                     absl::StrCat("'", value->name(),
                                  "' is no tensor of a type Triton has (sequences, maps, "
                                  "8- and 4-bit types have none)"));
    }
  }
  return absl::OkStatus();
}

// Moves the result's files into the new version folder `version_dir` (the report into `model_dir`, beside the
// versions); returns the paths written.
absl::StatusOr<std::vector<fs::path>> FillVersionFolder(const std::vector<ResultFile>& files, const fs::path& repo,
                                                        const fs::path& model_dir, const fs::path& version_dir) {
  std::error_code error;
  // The version folder appears whole: filled beside it, then renamed into place.
  const fs::path staging = model_dir / absl::StrCat(".onnxopt-", ::getpid());
  fs::remove_all(staging, error);
  fs::create_directories(staging, error);
  std::vector<fs::path> written;
  for (const ResultFile& file : files) {
    // Triton and KServe look for the model as model.onnx; the report goes beside the versions.
    const bool report_file = file.role == v1::ARTIFACT_REPORT;
    const fs::path to = report_file                       ? model_dir / "onnxopt_report.json"
                        : file.role == v1::ARTIFACT_MODEL ? staging / kModelFileName
                                                          : staging / file.path.filename();
    fs::rename(file.path, to, error);
    if (error) {
      fs::remove_all(staging, error);
      return absl::InternalError(absl::StrCat("cannot move ", file.path.string(), " into ", repo.string()));
    }
    if (report_file) written.push_back(model_dir / "onnxopt_report.json");
  }
  fs::rename(staging, version_dir, error);
  if (error) {
    const std::string why = error.message();  // before the cleanup reuses `error`
    fs::remove_all(staging, error);
    return absl::InternalError(absl::StrCat("cannot create ", version_dir.string(), ": ", why));
  }
  for (const auto& entry : fs::directory_iterator(version_dir, error)) written.push_back(entry.path());
  return written;
}

// inferenceservice.yaml at the repository's root: a KServe InferenceService that serves the model from storageUri
// (--storage-uri, else a PVC named after the repository's folder) with the Triton runtime; returns its path.
absl::StatusOr<fs::path> WriteKServeManifest(const v1::Report& report, const RepositoryOptions& options,
                                             const fs::path& repo) {
  std::error_code error;
  fs::path folder = fs::absolute(repo, error).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();  // "models/" names "models"
  const std::string uri = options.storage_uri.empty()
                              ? absl::StrCat("pvc://onnxopt-models/", KubernetesName(folder.filename().string()))
                              : options.storage_uri;
  std::string service = absl::StrCat(
      "# KServe: serves ", options.model_name, " from the model repository at storageUri with the Triton runtime.\n",
      "# Copy the folder there (the repository root, holding ", options.model_name,
      "/config.pbtxt), then kubectl apply.\n",
      "apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata:\n  name: ",
      YamlQuoted(KubernetesName(options.model_name)),
      "\n  annotations:\n    onnxopt.dev/job: ", YamlQuoted(report.job()),
      "\nspec:\n  predictor:\n    model:\n      modelFormat:\n        name: onnx\n"
      "      runtime: kserve-tritonserver\n",
      "      storageUri: ", YamlQuoted(uri), "\n      args:\n        - --strict-model-config=true\n");
  const fs::path manifest = repo / "inferenceservice.yaml";
  absl::Status status = WriteFileAtomically(manifest, service);
  if (!status.ok()) return status;
  return manifest;
}

}  // namespace

absl::Status CheckModelFitsLayout(const fs::path& model_path, const RepositoryOptions& options) {
  // The optimizer keeps a model's inputs and outputs, so the original's interface is the result's.
  // A model whose weights are inside its .onnx is read only when small; a large one is checked when
  // its result is delivered (the client would hold it all).
  constexpr uintmax_t kLargestReadBytes = uintmax_t{256} << 20;
  std::error_code error;
  const uintmax_t bytes = fs::file_size(model_path, error);
  if (error || bytes > kLargestReadBytes) return absl::OkStatus();
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(model_path);
  if (!model.ok()) return absl::OkStatus();  // the job reports a model it cannot read, with its reason
  if (options.layout == RepositoryLayout::kGenai) return GenaiConfigFor(*model, v1::Report(), options.genai).status();
  return InterfaceFitsTriton(*model);
}

absl::StatusOr<RepositoryLayout> ParseRepositoryLayout(const std::string& name) {
  if (name == "triton") return RepositoryLayout::kTriton;
  if (name == "kserve") return RepositoryLayout::kKServe;
  if (name == "genai") return RepositoryLayout::kGenai;
  return absl::InvalidArgumentError(absl::StrCat("--layout ", name, ": use triton, kserve or genai"));
}

absl::Status CheckRepositoryOptions(const RepositoryOptions& options) {
  if (options.layout == RepositoryLayout::kGenai) return CheckGenaiOptions(options.genai);
  if (!ValidModelName(options.model_name)) {
    return absl::InvalidArgumentError("--model-name must be 1 to 128 characters of A-Z a-z 0-9 - _ . (not . or ..)");
  }
  if (options.version < 1) return absl::InvalidArgumentError("--version must be 1 or more");
  if (options.max_batch_size < 1) return absl::InvalidArgumentError("--max-batch-size must be 1 or more");
  return absl::OkStatus();
}

absl::Status CheckVersionFree(const RepositoryOptions& options, const fs::path& repo) {
  if (options.layout == RepositoryLayout::kGenai) return CheckGenaiFolderFree(repo);
  const fs::path version_dir = repo / options.model_name / absl::StrCat(options.version);
  std::error_code error;
  if (!fs::exists(version_dir, error)) return absl::OkStatus();
  return Failure(absl::StatusCode::kAlreadyExists, v1::ErrorReason::REPOSITORY_VERSION_EXISTS,
                 absl::StrCat(version_dir.string(), " exists; a served version is never overwritten: pass --version ",
                              options.version + 1, " or another repository"));
}

std::string TritonModelConfig(const onnx::ModelProto& model, const v1::Report& report, const std::string& name,
                              int max_batch_size) {
  const onnx::GraphProto& graph = model.graph();
  const bool batched = Batchable(graph);
  // Where and how the benchmark ran it: the tuning's best settings when it tuned, else its own.
  const DeploySettings deploy = DeploySettingsOf(report.benchmark());
  const bool gpu = deploy.gpu;
  const RuntimeRequirement needs = MinimumOnnxRuntime(model, gpu);
  std::string config = absl::StrCat("# Written by onnxopt ", report.optimizer_version(), " for ", report.job(), ".\n",
                                    needs.version.empty() ? absl::StrCat("# Warning: ", needs.reason)
                                                          : absl::StrCat("# Needs ONNX Runtime >= ", needs.version,
                                                                         " (", needs.reason, ")"),
                                    "\n");
  absl::StrAppend(&config, "name: \"", absl::CEscape(name), "\"\nbackend: \"onnxruntime\"\nmax_batch_size: ",
                  batched ? max_batch_size : 0, "\n");
  std::vector<const onnx::ValueInfoProto*> outputs;
  for (const auto& output : graph.output()) outputs.push_back(&output);
  AppendList(&config, "input", FedInputs(graph), batched);
  AppendList(&config, "output", outputs, batched);
  absl::StrAppend(&config, "instance_group [ { kind: ", gpu ? "KIND_GPU" : "KIND_CPU", " count: 1 } ]\n");
  if (batched && FindCacheInterface(graph)) {
    // Each request of a decoder carries its own key/value cache (past inputs) at its own length: the
    // dynamic batcher would join requests whose pasts differ, which the model cannot take as one batch.
    absl::StrAppend(&config,
                    "# No dynamic batching: the model takes a key/value cache (past inputs) per request, and\n"
                    "# requests whose past lengths differ cannot be batched together; batch on the client.\n");
  } else if (batched) {
    absl::StrAppend(&config, "dynamic_batching { }\n");
  }
  const std::string level = GraphLevel(deploy.optimization_level);
  const auto& cuda_options = deploy.cuda_options;
  if (!level.empty() || (gpu && !cuda_options.empty())) {
    absl::StrAppend(&config, "optimization {\n");
    if (!level.empty()) absl::StrAppend(&config, "  graph { level: ", level, " }\n");
    if (gpu && !cuda_options.empty()) {
      absl::StrAppend(&config, "  execution_accelerators {\n    gpu_execution_accelerator [ {\n      name: \"cuda\"\n");
      for (const auto& [key, value] : cuda_options) {
        absl::StrAppend(&config, "      parameters { key: \"", absl::CEscape(key), "\" value: \"", absl::CEscape(value),
                        "\" }\n");
      }
      absl::StrAppend(&config, "    } ]\n  }\n");
    }
    absl::StrAppend(&config, "}\n");
  }
  if (deploy.measured) {
    AppendParameter(&config, "intra_op_thread_count", absl::StrCat(deploy.intra_op_threads));
    AppendParameter(&config, "execution_mode", deploy.execution_mode == "parallel" ? "1" : "0");
  }
  if (!needs.version.empty()) AppendParameter(&config, "onnxopt_min_onnxruntime_version", needs.version);
  return config;
}

absl::StatusOr<std::vector<fs::path>> WriteModelRepository(const std::vector<ResultFile>& files, const v1::Report& report,
                                                           const RepositoryOptions& options, const fs::path& repo,
                                                           std::vector<std::string>* notes) {
  if (absl::Status valid = CheckRepositoryOptions(options); !valid.ok()) return valid;
  if (options.layout == RepositoryLayout::kGenai) return WriteGenaiFolder(files, report, options.genai, repo, notes);
  const ResultFile* model_file = FindRole(files, v1::ARTIFACT_MODEL);
  if (model_file == nullptr) return absl::NotFoundError("the result has no model");
  // The graph only: config.pbtxt needs its inputs and outputs, not its weights.
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(model_file->path);
  if (!model.ok()) return model.status();
  if (absl::Status fits = InterfaceFitsTriton(*model); !fits.ok()) return fits;
  if (absl::Status free = CheckVersionFree(options, repo); !free.ok()) return free;
  const fs::path model_dir = repo / options.model_name;
  const fs::path version_dir = model_dir / absl::StrCat(options.version);
  std::error_code error;
  fs::create_directories(model_dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", model_dir.string(), ": ", error.message()));
  absl::StatusOr<std::vector<fs::path>> written = FillVersionFolder(files, repo, model_dir, version_dir);
  if (!written.ok()) return written.status();
  const fs::path config_path = model_dir / "config.pbtxt";
  absl::Status status = WriteFileAtomically(
      config_path, TritonModelConfig(*model, report, options.model_name, options.max_batch_size));
  if (!status.ok()) return status;
  written->push_back(config_path);
  if (options.layout == RepositoryLayout::kKServe) {
    absl::StatusOr<fs::path> manifest = WriteKServeManifest(report, options, repo);
    if (!manifest.ok()) return manifest.status();
    written->push_back(*manifest);
  }
  return written;
}

}  // namespace onnxopt::client
