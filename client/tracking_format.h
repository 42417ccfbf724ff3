// A job's figures as experiment trackers and pipelines take them.
//
// `onnxopt report JOB --format mlflow`: what an MLflow run logs for the job, as one JSON object
//   {"params": {...}, "metrics": {...}, "tags": {...}}
// params are the settings that made the model (strings, as mlflow.log_params takes them), metrics the
// measured figures (numbers, mlflow.log_metrics), tags the lineage (job, source model digest, labels,
// verdict; mlflow.set_tags). A pipeline logs them with three calls and links the run to the job.
#ifndef ONNXOPT_CLIENT_TRACKING_FORMAT_H_
#define ONNXOPT_CLIENT_TRACKING_FORMAT_H_

#include <string>

#include "onnxopt/v1/report.pb.h"
#include "onnxopt/v1/service.pb.h"

namespace onnxopt::client {

// `job` may be null (a local optimize's report): then only the report's own lineage is tagged.
std::string FormatMlflow(const v1::Report& report, const v1::Job* job);

// `--format kfp`: Kubeflow Pipelines' metrics file (mlpipeline-metrics), the figures a pipeline run
// compares: speedup, the optimized model's p50 and the largest parity error, where measured.
//   {"metrics": [{"name": "speedup", "numberValue": 1.8, "format": "RAW"}, ...]}
std::string FormatKfpMetrics(const v1::Report& report);

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_TRACKING_FORMAT_H_
