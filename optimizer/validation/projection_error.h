// Where a weight-only quantized model's error comes from: for every MatMulNBits that replaced a
// float product of the pipeline's float32 model, the relative error of its weight and of its output
// on real activations, under the method used and under round-to-nearest, so that a failed parity
// check says which layer and which projection lost the accuracy, and a method's gain is measured on
// the same weights.
//
//   weight error  ||W' - W||_F / ||W||_F
//   output error  ||X (W' - W)||_F / ||X W||_F, X: up to kProjectionRows rows of the product's input as
//                 the float32 model computes it (every product judged on the same, unquantized input,
//                 so the figures do not compound along the layers)
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_PROJECTION_ERROR_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_PROJECTION_ERROR_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/passes/precision/weight_blocks.h"

namespace onnxopt {

inline constexpr int kProjectionRows = 16;
inline constexpr int kMaxProjectionsReported = 1000;

// Rows of activations per value name: [rows, k] row-major.
struct ActivationRows {
  std::vector<float> values;
  int64_t rows = 0;
  int64_t k = 0;
};

// Fills `report`'s method, projections and means. `capture(values, out)` runs the float32 model and
// keeps up to kProjectionRows rows of each named value (ProjectionRows does that from a tensor); when
// it is null or fails, output errors are -1 and projections_note says why.
using CaptureActivations =
    std::function<absl::Status(const std::vector<std::string>& values, std::map<std::string, ActivationRows>* out)>;
void DescribeProjectionErrors(const onnx::ModelProto& fp32_model, const onnx::ModelProto& quantized,
                              BlockMethod method, const CaptureActivations& capture, v1::PrecisionReport* report);

// Up to kProjectionRows rows of a [..., k] tensor, evenly spaced over all of its rows.
ActivationRows ProjectionRows(const std::vector<int64_t>& shape, const float* data);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_PROJECTION_ERROR_H_
