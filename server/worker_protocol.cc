#include "server/worker_protocol.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "optimizer/failure.h"
#include "optimizer/sha256.h"
#include "optimizer/utf8.h"

namespace onnxopt::server {

std::string FormatProgress(Phase phase, int done, int total, const std::string& pass) {
  return absl::StrCat("progress ", static_cast<int>(phase), " ", done, " ", total, " ", pass, "\n");
}

std::string FormatStatus(const absl::Status& status) {
  std::string message = absl::StrReplaceAll(ValidUtf8(status.message()), {{"\n", " "}, {"\r", " "}});
  // A message quotes the model's own names, which may be megabytes long; a job's error must stay small
  // enough for every client's ListJobs page.
  if (message.size() > kMaxStatusMessageBytes) {
    message.resize(kMaxStatusMessageBytes);
    while (!message.empty() && !IsValidUtf8(message)) message.pop_back();  // not in the middle of a character
    message += " [...]";
  }
  return absl::StrCat("status ", static_cast<int>(status.code()), " ", static_cast<int>(ReasonOf(status)), " ", message,
                      "\n");
}

std::string FormatExternalData(const std::string& location) {
  return absl::StrCat("external ", absl::CEscape(location), "\n");
}

WorkerLine ParseWorkerLine(const std::string& line) {
  WorkerLine parsed;
  std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 4));
  int numbers[3] = {0, 0, 0};
  if (parts.size() >= 4 && parts[0] == "progress" && absl::SimpleAtoi(parts[1], &numbers[0]) &&
      absl::SimpleAtoi(parts[2], &numbers[1]) && absl::SimpleAtoi(parts[3], &numbers[2]) && numbers[0] >= 0 &&
      numbers[0] <= static_cast<int>(Phase::kBenchmarking)) {
    parsed.kind = WorkerLine::Kind::kProgress;
    parsed.phase = static_cast<Phase>(numbers[0]);
    parsed.done = numbers[1];
    parsed.total = numbers[2];
    parsed.pass = parts.size() > 4 ? parts[4] : "";
    return parsed;
  }
  std::vector<std::string> status_parts = absl::StrSplit(line, absl::MaxSplits(' ', 3));
  int code = 0;
  int reason = 0;
  if (status_parts.size() >= 3 && status_parts[0] == "status" && absl::SimpleAtoi(status_parts[1], &code) &&
      code >= 0 && code <= 16 && absl::SimpleAtoi(status_parts[2], &reason) &&
      v1::ErrorReason::Reason_IsValid(reason)) {
    parsed.kind = WorkerLine::Kind::kStatus;
    const absl::Status status(static_cast<absl::StatusCode>(code),
                              ValidUtf8(status_parts.size() > 3 ? status_parts[3] : ""));
    parsed.status =
        reason == v1::ErrorReason::REASON_UNSPECIFIED ? status : WithReason(status, static_cast<Reason>(reason));
    return parsed;
  }
  if (absl::StartsWith(line, "external ") && absl::CUnescape(line.substr(9), &parsed.text)) {
    parsed.kind = WorkerLine::Kind::kExternalData;
  }
  return parsed;
}

std::string FormatInputManifest(const std::vector<SuppliedInputFile>& files) {
  std::string text;
  for (const auto& file : files) absl::StrAppend(&text, file.sample, "\t", file.name, "\t", file.file, "\n");
  return text;
}

absl::StatusOr<std::vector<std::map<std::string, std::filesystem::path>>> ParseInputManifest(
    const std::string& text, const std::filesystem::path& folder) {
  std::vector<std::map<std::string, std::filesystem::path>> sets;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    int sample = 0;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[0], &sample) || sample < 0 || sample > 10000 ||
        fields[1].empty() || fields[2].empty() || fields[2].find("..") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("malformed input manifest line '", line, "'"));
    }
    if (static_cast<size_t>(sample) >= sets.size()) sets.resize(static_cast<size_t>(sample) + 1);
    sets[static_cast<size_t>(sample)][fields[1]] = folder / fields[2];
  }
  return sets;
}

std::string FormatDigestManifest(const std::vector<FileDigest>& files) {
  std::string text;
  for (const auto& file : files) absl::StrAppend(&text, file.sha256, "\t", file.file, "\n");
  return text;
}

absl::StatusOr<std::vector<FileDigest>> ParseDigestManifest(const std::string& text) {
  std::vector<FileDigest> files;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits('\t', 1));
    if (fields.size() != 2 || !IsValidSha256(fields[0]) || fields[1].empty() ||
        std::filesystem::path(fields[1]).is_absolute() || fields[1].find("..") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("malformed digest manifest line '", line, "'"));
    }
    files.push_back({fields[0], fields[1]});
  }
  return files;
}

absl::Status VerifyDigests(const std::vector<FileDigest>& files, const std::filesystem::path& folder) {
  for (const FileDigest& file : files) {
    absl::StatusOr<std::string> actual = Sha256OfFile(folder / file.file);
    if (!actual.ok()) return actual.status();
    if (*actual != file.sha256) {
      return Failure(absl::StatusCode::kDataLoss, v1::ErrorReason::BLOB_CORRUPT,
                     absl::StrCat("the server's stored copy of ", file.file, " (blob ", file.sha256,
                                  ") no longer matches its SHA-256; it was removed, so "
                                  "submitting again uploads it anew"));
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxopt::server
