// LoRA adapters as ONNX Runtime serves them: a model whose adapted projections take their low-rank
// matrices as inputs (extract_adapters), and `.onnx_adapter` files holding one adapter's values, which
// ONNX Runtime (1.20+) activates per run (OrtApi::CreateLoraAdapter, RunOptionsAddActiveLoraAdapter).
//
// Names: an adapted module's matrices are the inputs "<module>.lora_A.weight" [in, lora_r] and
// "<module>.lora_B.weight" [lora_r, out] (Olive's names and layout), B holding the scale. <module> is
// the module path with the export's wrappers dropped (CanonicalModulePath), the same for a model's
// recorded scopes and a peft checkpoint's keys, so the two meet by name.
//
// No adapter active: each input's default is an empty tensor (rank 0 along lora_r), so the branch adds
// exactly zero and the model computes its base model.
#ifndef ONNXOPT_OPTIMIZER_LORA_ADAPTER_H_
#define ONNXOPT_OPTIMIZER_LORA_ADAPTER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "onnx/onnx_pb.h"

namespace onnxopt {

inline constexpr char kAdapterRankDim[] = "lora_r";
// The file a job writes beside model.onnx.
inline constexpr char kAdapterFileName[] = "model.onnx_adapter";

// "<module>.lora_A.weight" (which = 'A') or "<module>.lora_B.weight".
std::string AdapterParameterName(absl::string_view module, char which);
// Whether `name` is such a parameter; `which` and `module` receive its parts.
bool ParseAdapterParameterName(absl::string_view name, char* which = nullptr, std::string* module = nullptr);

// A module path as recorded by an exporter or a peft checkpoint ("/m/model/encoder/layer.0/...",
// "m.base_model.model.model.layers.0.self_attn.q_proj", "base_model.model.model.layers.0...") without
// its wrappers: '/' read as '.', leading segments "m", "base_model" and "model" dropped, and a
// trailing ".lora_A.<adapter>" / ".base_layer" dropped.
std::string CanonicalModulePath(absl::string_view path);

// The adapter parameters of a model: its graph inputs named as above, in input order.
std::vector<const onnx::ValueInfoProto*> AdapterInputs(const onnx::ModelProto& model);

// Moves the defaults of the model's adapter inputs out (returned, with their names) and leaves empty
// tensors in their place: the model then runs its base model unless an adapter is active.
std::vector<onnx::TensorProto> TakeAdapterDefaults(onnx::ModelProto* model);

// An `.onnx_adapter` file (ONNX Runtime's FlatBuffers format, version 1, identifier "TORT") holding
// `parameters` (raw or typed float data, rank >= 1). Each payload starts on a 16-byte offset:
// ONNX Runtime maps the file and runs on the bytes where they lie.
absl::StatusOr<std::string> SerializeAdapter(const std::vector<onnx::TensorProto>& parameters, int adapter_version = 0,
                                             int model_version = 0);
// The parameters of an `.onnx_adapter` file, every offset and size checked against the buffer:
// INVALID_ARGUMENT naming what is wrong for a truncated or inconsistent file.
absl::StatusOr<std::vector<onnx::TensorProto>> ParseAdapter(absl::string_view bytes);

// Adapters active together as one: per module, the A matrices side by side ([in, r_0 + r_1 ...]) and
// the B matrices stacked, which adds the adapters' contributions (LoRA's rank concatenation). Modules of
// one adapter only keep theirs. INVALID_ARGUMENT when a module's matrices disagree in width or type.
absl::StatusOr<std::vector<onnx::TensorProto>> ConcatenateAdapters(
    const std::vector<std::vector<onnx::TensorProto>>& adapters);

// Whether `parameters` fit the model's adapter inputs: every parameter an adapter input of the same
// element type, rank and fixed dims, and every module given both matrices with one rank.
absl::Status CheckAdapterFitsModel(const std::vector<onnx::TensorProto>& parameters, const onnx::ModelProto& model);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_LORA_ADAPTER_H_
