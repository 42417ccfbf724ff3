// peft LoRA checkpoints (adapter_config.json + adapter_model.safetensors) as ONNX Runtime adapters
// for a model extract_adapters prepared: `onnxopt adapters convert`.
//
// Both files come from users, so every size and offset is checked before it is used, and every
// mismatch with the model (module, rank, shape, dtype) is an INVALID_ARGUMENT that names it.
#ifndef ONNXOPT_OPTIMIZER_PEFT_ADAPTER_H_
#define ONNXOPT_OPTIMIZER_PEFT_ADAPTER_H_

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "onnx/onnx_pb.h"

namespace onnxopt {

// One tensor of a safetensors file: its dtype ("F32", "F16", "BF16", ...), shape and bytes.
struct SafeTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;
};

// A safetensors file (8-byte little-endian header size, a JSON header, the data): the tensors by name.
// INVALID_ARGUMENT (SAFETENSORS_INVALID: why) for a header that is too large, is not JSON, lies about
// sizes or offsets, overlaps, leaves holes or does not cover the file.
absl::StatusOr<std::map<std::string, SafeTensor>> ParseSafetensors(absl::string_view bytes);

// The adapter of the peft checkpoint in `folder` for `model`: A [r, in] and B [out, r] transposed to
// the model's [in, r] and [r, out], B scaled by lora_alpha / r (/ sqrt(r) with use_rslora; per module
// by rank_pattern and alpha_pattern), in the element type of the model's inputs. `notes` receives what
// the caller should know (modules of the model the checkpoint leaves at the base model).
absl::StatusOr<std::vector<onnx::TensorProto>> ConvertPeftCheckpoint(const std::filesystem::path& folder,
                                                                     const onnx::ModelProto& model,
                                                                     std::vector<std::string>* notes);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PEFT_ADAPTER_H_
