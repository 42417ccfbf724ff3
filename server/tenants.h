// Who is calling, and what is theirs. With --auth-tokens-file every RPC of the Optimizer service must
// carry "authorization: Bearer <token>"; the file maps the SHA-256 of each token (tokens are never
// stored in clear) to a tenant, optionally an admin:
//
//   # sha256 of the token (printf %s "$TOKEN" | sha256sum)           tenant     role
//   <64 lowercase hex digits>                                          team-nlp
//   <64 lowercase hex digits>                                          ops        admin
//
// Each tenant sees only its own jobs, uploads and blobs: another tenant's names answer NOT_FOUND
// exactly like names that do not exist, and blobs are stored per tenant, so nobody can learn whether
// someone else uploaded a file by asking for its hash. Admins may list every tenant's jobs and read
// them; only the owner cancels or deletes a job. Without the file, authentication is off and every caller is the one default tenant ("").
#ifndef ONNXOPT_SERVER_TENANTS_H_
#define ONNXOPT_SERVER_TENANTS_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/blob_store.h"

namespace onnxopt::server {

struct Caller {
  std::string tenant;  // "" is the default tenant (authentication off)
  bool admin = false;
  // Whether this caller may see a job or blob of `owner`.
  bool MaySee(const std::string& owner) const { return admin || owner == tenant; }
};

// Tenant names: 1 to 64 characters of [A-Za-z0-9_-] (they name folders).
bool IsValidTenantName(const std::string& tenant);

class TokenTable {
 public:
  // "sha256 tenant [admin]" per line; blank lines and '#' comments are skipped. INVALID_ARGUMENT
  // naming the line for anything else (a digest that is not 64 lowercase hex digits, a bad tenant
  // name, an unknown role, a digest given twice).
  static absl::StatusOr<TokenTable> Parse(absl::string_view text);
  std::optional<Caller> Find(const std::string& token_sha256) const;
  size_t size() const { return by_digest_.size(); }

 private:
  std::unordered_map<std::string, Caller> by_digest_;
};

class Authenticator {
 public:
  // An empty path turns authentication off. The file must parse (see TokenTable::Parse).
  static absl::StatusOr<std::unique_ptr<Authenticator>> Open(const std::filesystem::path& tokens_file);
  bool enabled() const { return !path_.empty(); }
  // Re-reads the file (SIGHUP); on an error the table in use stays and the error is returned.
  absl::Status Reload();
  // The caller behind an "authorization" header value ("Bearer <token>"), nullopt when the request had
  // none. UNAUTHENTICATED for a missing, malformed or unknown token; with authentication off, the
  // default tenant as admin.
  absl::StatusOr<Caller> Authenticate(const std::optional<absl::string_view>& authorization) const;
  size_t tokens() const;

 private:
  explicit Authenticator(std::filesystem::path path) : path_(std::move(path)) {}
  const std::filesystem::path path_;
  mutable std::mutex mutex_;
  std::shared_ptr<const TokenTable> table_;
};

// One blob store per tenant: the default tenant's is the data folder's own (blobs/, uploads/), any
// other tenant's lives under tenants/<name>/. Opened on first use and kept.
class TenantBlobStores {
 public:
  TenantBlobStores(std::filesystem::path data_dir, BlobStore* default_store);
  // INVALID_ARGUMENT for a malformed tenant name; INTERNAL if its folders cannot be made.
  absl::StatusOr<BlobStore*> For(const std::string& tenant);
  // Every store, the ones on disk from earlier runs included.
  void ForEach(const std::function<void(const std::string& tenant, BlobStore& store)>& visit);

 private:
  const std::filesystem::path data_dir_;
  BlobStore* const default_store_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<BlobStore>> stores_;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_TENANTS_H_
