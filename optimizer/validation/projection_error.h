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

// `report`'s mean weight and output errors (and round-to-nearest's) over `rows`: output errors over the
// rows that have one (>= 0), -1 where none does.
template <typename Rows>
void SetProjectionMeans(const Rows& rows, v1::PrecisionReport* report) {
  double weight = 0, rtn_weight = 0, output = 0, rtn_output = 0;
  int count = 0, with_output = 0;
  for (const v1::ProjectionError& row : rows) {
    weight += row.weight_error();
    rtn_weight += row.rtn_weight_error();
    ++count;
    if (row.output_error() >= 0) {
      output += row.output_error();
      rtn_output += row.rtn_output_error();
      ++with_output;
    }
  }
  report->set_mean_weight_error(count > 0 ? weight / count : 0);
  report->set_rtn_mean_weight_error(count > 0 ? rtn_weight / count : 0);
  report->set_mean_output_error(with_output > 0 ? output / with_output : -1);
  report->set_rtn_mean_output_error(with_output > 0 ? rtn_output / with_output : -1);
}

// Up to kProjectionRows rows of a [..., k] tensor, evenly spaced over all of its rows.
ActivationRows ProjectionRows(const std::vector<int64_t>& shape, const float* data);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_PROJECTION_ERROR_H_
