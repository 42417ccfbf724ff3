// Model inputs for validation and the benchmark, and running a session on them: supplied with the job (ONNX TensorProto files), or
// generated: seeded, dtype-aware and shaped from the config's named dimension values (one set of
// values per shape set). Integer inputs that index an embedding table (Gather indices) get ids inside
// the table, inputs named like masks get ones (with trailing zeros per row when mask_padding is set),
// other integer inputs named like positions count along each row (row r in steps of r + 1), token type ids and
// other integers zeros, floats a standard normal.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_INPUT_GENERATOR_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_INPUT_GENERATOR_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxruntime_cxx_api.h"

namespace onnxopt {

struct GeneratedInputs {
  std::vector<std::string> names;
  std::vector<Ort::Value> values;
  std::map<std::string, std::string> shapes;  // name -> "1x16"
  std::vector<std::string> padded_masks;      // generated masks that got trailing zeros
};

// ValidationConfig.mask_padding when unset: padded batches by default.
inline constexpr double kDefaultMaskPadding = 0.25;
double MaskPadding(const v1::ValidationConfig& config);

// Named dimension values of one shape set.
using DimValues = std::map<std::string, int64_t>;

// The shape sets a config asks for: each of validation.shapes over validation.dim_values, or
// dim_values alone.
std::vector<DimValues> ShapeSets(const v1::ValidationConfig& config);

// One supplied input set: model input name -> tensor.
using SuppliedSample = std::map<std::string, onnx::TensorProto>;

// Reads supplied input sets: `files[i]` maps input names to TensorProto files of set i.
// INVALID_ARGUMENT (INPUT_INVALID) for a file that is no tensor.
absl::StatusOr<std::vector<SuppliedSample>> LoadSuppliedInputs(
    const std::vector<std::map<std::string, std::filesystem::path>>& files);

// Builds one sample of inputs for `session`. `model` (the original) supplies hints such as the size
// of the embedding table an input indexes. Different `sample` values give different data. Inputs in
// `supplied` are taken from it (checked against the model's types and static dims: INVALID_ARGUMENT
// INPUT_MISMATCH otherwise); the rest are generated.
absl::StatusOr<GeneratedInputs> GenerateInputs(Ort::Session& session, const onnx::ModelProto& model,
                                               const v1::ValidationConfig& config, const DimValues& dims, int sample,
                                               const SuppliedSample* supplied = nullptr);
// The same with the config's dim_values.
absl::StatusOr<GeneratedInputs> GenerateInputs(Ort::Session& session, const onnx::ModelProto& model,
                                               const v1::ValidationConfig& config, int sample);

// The value used for a dynamic dimension; see ValidationConfig.dim_values.
int64_t DynamicDimValue(const std::string& dim_name, int position, const DimValues& dims);

// The shape sets inputs are made for: the config's, or with supplied inputs one (their own shapes;
// what a set leaves out is generated from dim_values). A decoder with a key/value cache
// (cache_interface.h) whose config names no shape sets runs as generation does: a prefill (past 0) and
// a one-token decode step, each with the config's other dim values (its past or new tokens included).
std::vector<DimValues> InputShapeSets(const v1::ValidationConfig& config, bool supplied,
                                      const onnx::ModelProto& model);

// The shape sets parity compares on: InputShapeSets, and for such a decoder also a chunk of 4 new tokens
// after a past at batch 1 (speculative decoding, a prompt fed in pieces), where a fused kernel's causal
// mask must count the past: the one shape generation loops feed that prefill and decode do not show.
// ONNX Runtime's GroupQueryAttention takes a chunk at batch 1 only.
std::vector<DimValues> ParityShapeSets(const v1::ValidationConfig& config, bool supplied,
                                       const onnx::ModelProto& model);

// The names of a session's outputs.
std::vector<std::string> OutputNames(Ort::Session& session);

// Views of `inputs`' tensors (no copies: a big model's pasts are gigabytes), valid while `inputs`
// lives: a feed that adds to a shared one.
GeneratedInputs InputViews(const GeneratedInputs& inputs);

// Runs `session` on `inputs`, fetching `output_names`; ONNX Runtime's exceptions become INTERNAL.
// `run_options`: e.g. an active LoRA adapter (default: none).
absl::StatusOr<std::vector<Ort::Value>> RunOnInputs(Ort::Session& session, const GeneratedInputs& inputs,
                                                    const std::vector<std::string>& output_names,
                                                    const Ort::RunOptions* run_options = nullptr);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_INPUT_GENERATOR_H_
