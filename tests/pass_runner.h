// Running passes in tests: a config (as JSON) or one pass by name over a model.
#ifndef ONNXOPT_TESTS_PASS_RUNNER_H_
#define ONNXOPT_TESTS_PASS_RUNNER_H_

#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "optimizer/pass_manager.h"

namespace onnxopt::testing {

struct PassRun {
  onnx::ModelProto model;
  v1::PassReport report;  // the last pass run
  absl::Status status;
  std::vector<v1::PassReport> reports;  // every pass run
};

// Runs the pipeline a JSON config describes; a config that does not build is returned as status.
inline PassRun RunConfig(const std::string& config_json, onnx::ModelProto model) {
  v1::OptimizationConfig config;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(config_json, &config).ok()) << config_json;
  auto pipeline = BuildPipeline(config, DefaultPassRegistry());
  if (!pipeline.ok()) return {std::move(model), {}, pipeline.status(), {}};
  std::vector<v1::PassReport> reports;
  absl::Status status = RunPipeline(*pipeline, &model, {}, &reports);
  v1::PassReport last = reports.empty() ? v1::PassReport() : reports.back();
  return {std::move(model), std::move(last), status, std::move(reports)};
}

// Runs one pass once; it must succeed.
inline PassRun RunPass(const std::string& pass, onnx::ModelProto model) {
  PassRun run = RunConfig(R"({"passes": [{"name": ")" + pass + R"("}]})", std::move(model));
  EXPECT_TRUE(run.status.ok()) << run.status;
  return run;
}

// How often the pass skipped with a reason that contains `reason_part`.
inline int64_t SkipCount(const v1::PassReport& report, const std::string& reason_part) {
  int64_t count = 0;
  for (const auto& skip : report.skipped()) {
    if (skip.reason().find(reason_part) != std::string::npos) count += skip.count();
  }
  return count;
}

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_PASS_RUNNER_H_
