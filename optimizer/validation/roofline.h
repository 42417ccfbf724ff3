// Decode speed against the memory roofline. A decode step computes little per byte it reads: every
// weight once, the key/value cache, a few embedding rows. So how fast a step can be is set by the
// machine's memory bandwidth: bytes per step over bytes per second. The generation report gives each
// decode phase's bytes per step and the share of that bound each model's p50 reaches.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_ROOFLINE_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_ROOFLINE_H_

#include <cstdint>

#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/cache_interface.h"

namespace onnxopt {

// The machine's memory read bandwidth in bytes per second: `threads` threads (0: every core) each summing
// its share of a 512 MiB buffer, far beyond the caches, best of 5 passes after one that maps the pages in.
// Measured once per process and thread count; 0 where the buffer cannot be had.
double MemoryReadBandwidth(int threads);

// The bytes one step of `model` moves at `batch` rows of `new_tokens` after a past of `past`: every
// initializer a node of the main graph reads (of a Gather's table only the rows it gathers), the past
// inputs read and the presents written (their declared dims, the cache axis at the step's lengths).
int64_t StepBytes(const onnx::ModelProto& model, const CacheInterface& cache, int64_t batch, int64_t past,
                  int64_t new_tokens);

// Fills the roofline fields of `report`'s decode phases (those that ran) and its bandwidth.
void DescribeRoofline(const onnx::ModelProto& original, const onnx::ModelProto& optimized, double bandwidth,
                      v1::GenerationReport* report);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_ROOFLINE_H_
