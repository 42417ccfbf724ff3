// Validation of a result whose pipeline freed static dims (make_dims_dynamic): the result is run with
// each freed dim at another length, which parity at the exported shapes cannot see.
//
// Shorter (half the exported length, L): the original runs at its exported length S with every mask
// input zeroed past L, the result at L on the first L positions of the same inputs, and each output
// is compared on its first L positions. That comparison is only meaningful where the original's first
// L positions do not depend on the rest (masked encoders, causal decoders), so it is probed first: the
// original runs again with everything past L changed (ids taken from the first positions, floats
// negated), and an output that moves is reported as not compared instead of failing.
// Longer (twice S): the result runs there, and its outputs must have the new length and stay finite.
// A model that cannot run longer (a position table of S rows) is noted, not failed: that is the
// model's limit, not the rewrite's.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_LENGTH_CHECK_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_LENGTH_CHECK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "onnxruntime_cxx_api.h"

namespace onnxopt {

// A dim static in the original's inputs and named in the result's.
struct FreedDim {
  std::string name;
  int64_t exported = 0;
  std::map<std::string, int> input_axes;  // input -> the axis that carries the dim
};
std::vector<FreedDim> FreedDims(const onnx::ModelProto& original, const onnx::ModelProto& optimized);

// Appends one LengthCheck per freed dim and length to `report->lengths`. INTERNAL when the original
// cannot run on its own inputs; the result failing is a check that did not pass.
absl::Status CheckFreedLengths(Ort::Session& original, const onnx::ModelProto& original_model, Ort::Session& optimized,
                               const onnx::ModelProto& optimized_model, const std::string& precision,
                               const v1::ValidationConfig& config, v1::ParityReport* report);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_LENGTH_CHECK_H_
