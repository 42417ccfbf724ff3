// The server's log lines. Text (the default): "onnxopt-server: <message>", info on stdout, warnings
// and errors on stderr, as before. JSON (--log-format=json): one object a line with time (RFC 3339,
// UTC, milliseconds), level, msg and, where a line is about one job, job and tenant, for log
// pipelines (Loki, Cloud Logging, Elasticsearch) to index without parsing prose.
#ifndef ONNXOPT_SERVER_LOG_H_
#define ONNXOPT_SERVER_LOG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace onnxopt::server {

enum class LogFormat { kText, kJson };
enum class LogLevel { kInfo, kWarning, kError };

// "text" or "json"; INVALID_ARGUMENT otherwise. Set once at start, before other threads log.
absl::Status SetLogFormat(const std::string& name);

struct LogFields {
  std::string job;     // "jobs/<id>"
  std::string tenant;
};

void Log(LogLevel level, absl::string_view message, const LogFields& fields = {});

// One line as Log writes it (without the newline): for tests.
std::string FormatLogLine(LogFormat format, LogLevel level, absl::string_view message, const LogFields& fields);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_LOG_H_
