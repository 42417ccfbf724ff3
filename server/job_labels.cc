#include "server/job_labels.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "optimizer/failure.h"
#include "optimizer/utf8.h"

namespace onnxopt::server {
namespace {

bool IsKeyCharacter(char c) {
  return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '_' || c == '.' || c == '/';
}

absl::Status BadLabel(const std::string& what, const std::string& message) {
  return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_LABEL, absl::StrCat(what, ": ", message));
}

}  // namespace

absl::Status ValidateLabels(const Labels& labels, const std::string& what) {
  if (labels.size() > static_cast<size_t>(kMaxLabels)) {
    return BadLabel(what, absl::StrCat(labels.size(), " labels, at most ", kMaxLabels));
  }
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > kMaxLabelKeyLength) {
      return BadLabel(what, absl::StrCat("a key must be 1 to ", kMaxLabelKeyLength, " characters"));
    }
    if (!absl::ascii_islower(key[0]) && !absl::ascii_isdigit(key[0])) {
      return BadLabel(what, absl::StrCat("key '", absl::CHexEscape(key), "' must start with a-z or 0-9"));
    }
    for (char c : key) {
      if (!IsKeyCharacter(c)) {
        return BadLabel(what, absl::StrCat("key '", absl::CHexEscape(key), "' may hold only a-z 0-9 - _ . /"));
      }
    }
    if (value.size() > kMaxLabelValueLength) {
      return BadLabel(what, absl::StrCat("the value of '", key, "' is ", value.size(), " bytes, at most ",
                                         kMaxLabelValueLength));
    }
    if (!IsValidUtf8(value)) {
      return BadLabel(what, absl::StrCat("the value of '", key, "' is not UTF-8"));
    }
  }
  return absl::OkStatus();
}

bool HasLabels(const v1::Job& job, const Labels& selector) {
  for (const auto& [key, value] : selector) {
    auto found = job.labels().find(key);
    if (found == job.labels().end() || found->second != value) return false;
  }
  return true;
}

}  // namespace onnxopt::server
