// Human-readable renderings of jobs and reports for the CLI; --json bypasses these.
#ifndef ONNXOPT_CLIENT_REPORT_FORMAT_H_
#define ONNXOPT_CLIENT_REPORT_FORMAT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "onnxopt/v1/report.pb.h"
#include "onnxopt/v1/service.pb.h"

namespace onnxopt::client {

// "1.50 MiB", "12 B": binary units, as the CLI and the HTML report print sizes.
std::string FormatBytes(int64_t bytes);
std::string FormatReport(const v1::Report& report);
std::string FormatJob(const v1::Job& job);
// One line, e.g. "RUNNING  optimizing  pass 2/4 eliminate_dropout".
std::string FormatProgressLine(const v1::Job& job);
std::string ToJson(const google::protobuf::Message& message);
// {"key": "value", ...} with JSON escaping, for commands whose output is not one message.
std::string JsonObject(const std::vector<std::pair<std::string, std::string>>& fields);
// {"job": <job>, "report": <report>}: what `submit --json --wait` prints once the job ends.
std::string JobAndReportJson(const v1::Job& job, const v1::Report* report);
// ", attention_mask padded 25%" when generated masks had trailing zeros, else "".
std::string PaddedMasks(const v1::ParityReport& parity);

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_REPORT_FORMAT_H_
