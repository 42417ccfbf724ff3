#include "server/page_tokens.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <climits>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "optimizer/failure.h"
#include "optimizer/sha256.h"

namespace onnxopt::server {
namespace {

// One AES-128 block, in either direction (a 16-byte token is one block: ECB is a plain permutation).
std::optional<std::string> AesBlock(const std::string& key, const std::string& block, bool encrypt) {
  EVP_CIPHER_CTX* context = EVP_CIPHER_CTX_new();
  std::string out(32, '\0');
  int length = 0, final_length = 0;
  const bool ok = context != nullptr && key.size() == 16 &&
                  EVP_CipherInit_ex(context, EVP_aes_128_ecb(), nullptr,
                                    reinterpret_cast<const unsigned char*>(key.data()), nullptr, encrypt ? 1 : 0) == 1 &&
                  EVP_CIPHER_CTX_set_padding(context, 0) == 1 &&
                  EVP_CipherUpdate(context, reinterpret_cast<unsigned char*>(out.data()), &length,
                                   reinterpret_cast<const unsigned char*>(block.data()), 16) == 1 &&
                  EVP_CipherFinal_ex(context, reinterpret_cast<unsigned char*>(out.data()) + length, &final_length) == 1;
  EVP_CIPHER_CTX_free(context);
  if (!ok || length + final_length != 16) return std::nullopt;
  out.resize(16);
  return out;
}

// What a page token seals besides the position: whose listing it belongs to.
std::string PageScope(const std::optional<std::string>& tenant) {
  return Sha256OfBytes(tenant ? "tenant:" + *tenant : std::string("all")).substr(0, 16);
}

}  // namespace

absl::StatusOr<std::string> PageTokens::NewKey() {
  std::string key(16, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), 16) != 1) {
    return absl::InternalError("cannot draw a random page token key");
  }
  return key;
}

std::string PageTokens::Seal(int64_t before, const std::optional<std::string>& tenant) const {
  std::string block(reinterpret_cast<const char*>(&before), 8);
  block += absl::HexStringToBytes(PageScope(tenant));
  std::optional<std::string> sealed = AesBlock(key_, block, /*encrypt=*/true);
  return sealed ? absl::BytesToHexString(*sealed) : "";
}

absl::StatusOr<int64_t> PageTokens::Open(const std::string& token, const std::optional<std::string>& tenant) const {
  if (token.empty()) return INT64_MAX;
  std::string sealed;
  std::optional<std::string> block;
  if (token.size() == 32 && absl::ascii_isxdigit(token[0])) sealed = absl::HexStringToBytes(token);
  if (sealed.size() == 16) block = AesBlock(key_, sealed, /*encrypt=*/false);
  int64_t before = 0;
  if (!block || absl::BytesToHexString(block->substr(8)) != PageScope(tenant) ||
      (std::memcpy(&before, block->data(), 8), before <= 0)) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_PAGE_TOKEN,
                   "page_token is not one this server handed out for this listing");
  }
  return before;
}

}  // namespace onnxopt::server
