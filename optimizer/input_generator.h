// Generated model inputs: seeded, dtype-aware and shaped from the config's named dimension values.
// Integer inputs that index an embedding table (Gather indices) get ids inside the table, inputs
// named like masks get ones, other integers zeros, floats a standard normal.
#ifndef ONNXOPT_OPTIMIZER_INPUT_GENERATOR_H_
#define ONNXOPT_OPTIMIZER_INPUT_GENERATOR_H_

#include <cstdint>
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
};

// Builds one sample of inputs for `session`. `model` (the original) supplies hints such as the size
// of the embedding table an input indexes. Different `sample` values give different data.
absl::StatusOr<GeneratedInputs> GenerateInputs(Ort::Session& session, const onnx::ModelProto& model,
                                               const v1::ValidationConfig& config, int sample);

// The value used for a dynamic dimension; see ValidationConfig.dim_values.
int64_t DynamicDimValue(const std::string& dim_name, int position, const v1::ValidationConfig& config);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_INPUT_GENERATOR_H_
