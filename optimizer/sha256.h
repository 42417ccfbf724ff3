// SHA-256 (OpenSSL) as lowercase hex: blobs are addressed by it on both ends of an upload.
#ifndef ONNXOPT_OPTIMIZER_SHA256_H_
#define ONNXOPT_OPTIMIZER_SHA256_H_

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"

typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace onnxopt {

// A digest computed as bytes go by (a download streamed in chunks).
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();
  void Update(const char* data, size_t size);
  // Lowercase hex; call once, at the end.
  std::string HexDigest();

 private:
  EVP_MD_CTX* context_;
};

bool IsValidSha256(const std::string& hex);
absl::StatusOr<std::string> Sha256OfFile(const std::filesystem::path& path);
std::string Sha256OfBytes(const std::string& bytes);
// The message's deterministic serialization (map entries in key order): equal messages give equal bytes,
// which is what a digest of a config or a request needs.
std::string DeterministicBytes(const google::protobuf::MessageLite& message);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_SHA256_H_
