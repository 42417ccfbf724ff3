#include "server/log.h"

#include <atomic>
#include <iostream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "optimizer/utf8.h"

namespace onnxopt::server {
namespace {

std::atomic<LogFormat> format{LogFormat::kText};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

}  // namespace

absl::Status SetLogFormat(const std::string& name) {
  if (name == "text") {
    format = LogFormat::kText;
  } else if (name == "json") {
    format = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("log-format must be text or json, not '", name, "'"));
  }
  return absl::OkStatus();
}

std::string FormatLogLine(LogFormat line_format, LogLevel level, absl::string_view message, const LogFields& fields) {
  if (line_format == LogFormat::kText) {
    // One line a message: a client's text (a model's display name) cannot forge lines of its own.
    std::string line = absl::StrCat("onnxopt-server: ", message);
    for (char& c : line) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return line;
  }
  google::protobuf::Struct object;
  auto& entries = *object.mutable_fields();
  entries["time"].set_string_value(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()));
  entries["level"].set_string_value(LevelName(level));
  entries["msg"].set_string_value(ValidUtf8(message));  // messages quote models' own names
  if (!fields.job.empty()) entries["job"].set_string_value(ValidUtf8(fields.job));
  if (!fields.tenant.empty()) entries["tenant"].set_string_value(ValidUtf8(fields.tenant));
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(object, &json);
  return json;
}

void Log(LogLevel level, absl::string_view message, const LogFields& fields) {
  static std::mutex mutex;  // one line at a time, whole
  const std::string line = FormatLogLine(format.load(), level, message, fields) + "\n";
  std::lock_guard<std::mutex> lock(mutex);
  std::ostream& out = level == LogLevel::kInfo ? std::cout : std::cerr;
  out << line << std::flush;
}

}  // namespace onnxopt::server
