// ONNX Runtime GenAI's deliverable: a folder its `Model(folder)` loads as it is, holding the decoder
// (model.onnx and its data), genai_config.json and, when given, the tokenizer's files.
//
// genai_config.json is read from the optimized graph first: the cache's past/present names as
// printf patterns over the layer index, layers, key/value heads and head size from the past tensors
// [B, N_kv, P, D], query heads from the fused attention's num_heads, vocabulary from the logits (or
// the embedding table), hidden size from the embedding table. What a graph does not say (the context
// length, token ids, the family name GenAI knows it by) comes from the Hugging Face files beside the
// tokenizer (config.json, generation_config.json) or from the flags; every figure taken from there,
// or left out, is named in `notes`. A model GenAI cannot drive (an input it does not feed, a cache
// laid out otherwise than [B, N_kv, P, D]) is refused with the reason.
#ifndef ONNXOPT_CLIENT_GENAI_CONFIG_H_
#define ONNXOPT_CLIENT_GENAI_CONFIG_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "client/result_file.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"

namespace onnxopt::client {

struct GenaiOptions {
  // A Hugging Face model folder (or just its tokenizer): tokenizer.json, tokenizer_config.json, ...
  // are copied beside the model; config.json and generation_config.json give what the graph does not.
  std::filesystem::path tokenizer_dir;
  int64_t context_length = 0;  // 0: config.json's max_position_embeddings, else a stored rotary table's rows
  std::string model_type;      // GenAI's model.type; "": config.json's model_type where GenAI knows it, else "decoder"
};

// Checks the flags before anything runs: the tokenizer folder holds a tokenizer, the type is one
// GenAI drives as a decoder-only model, the context length is positive.
absl::Status CheckGenaiOptions(const GenaiOptions& options);

// ALREADY_EXISTS (GENAI_FOLDER_EXISTS) unless `folder` is absent or empty: a delivered model folder
// is never written into.
absl::Status CheckGenaiFolderFree(const std::filesystem::path& folder);

struct GenaiConfig {
  std::string json;                // genai_config.json, keys sorted
  std::vector<std::string> notes;  // figures not read from the graph: where they came from, or why left out
};

// genai_config.json for `model` (the graph is enough: initializers' dims, not their data).
// FAILED_PRECONDITION (GENAI_UNSUPPORTED) for a model GenAI cannot drive; INVALID_ARGUMENT
// (GENAI_CONTEXT_LENGTH) where no context length is known.
absl::StatusOr<GenaiConfig> GenaiConfigFor(const onnx::ModelProto& model, const v1::Report& report,
                                           const GenaiOptions& options);

// The GenAI model folder at `folder` from a job's downloaded `files` (model.onnx, model.onnx.data,
// report.json as onnxopt_report.json, ...), moved, with genai_config.json and the tokenizer's files.
// The folder is filled beside it and renamed into place, so it appears whole. Returns the paths
// written; `notes` receives GenaiConfig's.
absl::StatusOr<std::vector<std::filesystem::path>> WriteGenaiFolder(const std::vector<ResultFile>& files,
                                                                    const v1::Report& report,
                                                                    const GenaiOptions& options,
                                                                    const std::filesystem::path& folder,
                                                                    std::vector<std::string>* notes);

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_GENAI_CONFIG_H_
