#include "server/tenants.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"
#include "optimizer/sha256.h"

namespace onnxopt::server {
namespace fs = std::filesystem;

bool IsValidTenantName(const std::string& tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  for (char c : tenant) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_') return false;
  }
  return true;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text) {
  TokenTable table;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<std::string> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::AUTH_TOKENS_INVALID,
                     absl::StrCat("line ", number, ": ", why));
    };
    if (fields.size() < 2 || fields.size() > 3) return bad("expected 'sha256 tenant [admin]'");
    if (!IsValidSha256(fields[0])) return bad("the token digest must be 64 lowercase hexadecimal digits");
    if (!IsValidTenantName(fields[1])) return bad("tenant names are 1 to 64 characters of A-Z, a-z, 0-9, '-', '_'");
    if (fields.size() == 3 && fields[2] != "admin") return bad("the only role is 'admin'");
    Caller caller{fields[1], fields.size() == 3};
    if (!table.by_digest_.emplace(fields[0], std::move(caller)).second) return bad("this digest is listed before");
  }
  return table;
}

std::optional<Caller> TokenTable::Find(const std::string& token_sha256) const {
  auto it = by_digest_.find(token_sha256);
  if (it == by_digest_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Open(const fs::path& tokens_file) {
  std::unique_ptr<Authenticator> authenticator(new Authenticator(tokens_file));
  if (!authenticator->enabled()) return authenticator;
  absl::Status loaded = authenticator->Reload();
  if (!loaded.ok()) return loaded;
  return authenticator;
}

absl::Status Authenticator::Reload() {
  if (!enabled()) return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadFile(path_);
  if (!text.ok()) {
    return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::AUTH_TOKENS_UNREADABLE,
                   absl::StrCat("cannot read ", path_.string(), ": ", text.status().message()));
  }
  absl::StatusOr<TokenTable> table = TokenTable::Parse(*text);
  if (!table.ok()) return table.status();
  auto shared = std::make_shared<const TokenTable>(*std::move(table));
  std::lock_guard<std::mutex> lock(mutex_);
  table_ = std::move(shared);
  return absl::OkStatus();
}

size_t Authenticator::tokens() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_ == nullptr ? 0 : table_->size();
}

absl::StatusOr<Caller> Authenticator::Authenticate(const std::optional<absl::string_view>& authorization) const {
  if (!enabled()) return Caller{"", true};
  if (!authorization) {
    return Failure(absl::StatusCode::kUnauthenticated, v1::ErrorReason::UNAUTHENTICATED,
                   "this server requires 'authorization: Bearer <token>'");
  }
  absl::string_view token = *authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return Failure(absl::StatusCode::kUnauthenticated, v1::ErrorReason::UNAUTHENTICATED,
                   "the authorization header must be 'Bearer <token>'");
  }
  const std::string digest = Sha256OfBytes(std::string(token));
  std::shared_ptr<const TokenTable> table;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    table = table_;
  }
  std::optional<Caller> caller = table == nullptr ? std::nullopt : table->Find(digest);
  if (!caller) {
    return Failure(absl::StatusCode::kUnauthenticated, v1::ErrorReason::UNAUTHENTICATED, "the token is not valid");
  }
  return *caller;
}

TenantBlobStores::TenantBlobStores(fs::path data_dir, BlobStore* default_store)
    : data_dir_(std::move(data_dir)), default_store_(default_store) {}

absl::StatusOr<BlobStore*> TenantBlobStores::For(const std::string& tenant) {
  if (tenant.empty()) return default_store_;
  if (!IsValidTenantName(tenant)) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_TENANT, "malformed tenant name");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = stores_.find(tenant);
  if (it != stores_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<BlobStore>> opened =
      BlobStore::Open(data_dir_ / "tenants" / tenant, default_store_->max_blob_bytes(),
                      default_store_->max_stored_bytes());
  if (!opened.ok()) return opened.status();
  BlobStore* store = opened->get();
  stores_.emplace(tenant, *std::move(opened));
  return store;
}

void TenantBlobStores::ForEach(const std::function<void(const std::string& tenant, BlobStore& store)>& visit) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(data_dir_ / "tenants", error)) {
    const std::string name = entry.path().filename().string();
    if (IsValidTenantName(name)) (void)For(name);
  }
  visit("", *default_store_);
  std::vector<std::pair<std::string, BlobStore*>> stores;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // not held while visiting: For() must not wait on a sweep
    for (auto& [tenant, store] : stores_) stores.push_back({tenant, store.get()});
  }
  for (auto& [tenant, store] : stores) visit(tenant, *store);
}

}  // namespace onnxopt::server
