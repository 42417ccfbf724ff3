// ListJobs page tokens, sealed: one AES-128 block over where the next page starts and whose listing it
// is, so a token tells a tenant nothing about how many jobs others made, and works only for the
// listing it came from. The key is kept with the jobs, so tokens outlive restarts and work on every
// replica of a shared store.
#ifndef ONNXOPT_SERVER_PAGE_TOKENS_H_
#define ONNXOPT_SERVER_PAGE_TOKENS_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace onnxopt::server {

class PageTokens {
 public:
  // 16 random bytes for a new key.
  static absl::StatusOr<std::string> NewKey();
  // `key`: 16 bytes (see NewKey).
  explicit PageTokens(std::string key) : key_(std::move(key)) {}

  // The token of the page that starts below sequence `before`.
  std::string Seal(int64_t before, const std::optional<std::string>& tenant) const;
  // ListJobs' page_size as served: 50 when unset, at most 500.
  static int PageSize(int requested) { return requested <= 0 ? 50 : std::min(requested, 500); }
  // The sequence a token says the page starts below (INT64_MAX for ""); INVALID_ARGUMENT
  // (BAD_PAGE_TOKEN) for a token that is not one this store sealed for this listing.
  absl::StatusOr<int64_t> Open(const std::string& token, const std::optional<std::string>& tenant) const;

 private:
  std::string key_;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_PAGE_TOKENS_H_
