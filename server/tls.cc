#include "server/tls.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "optimizer/model_io.h"

namespace onnxopt::server {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(const std::string& cert_file,
                                                                                    const std::string& key_file,
                                                                                    const std::string& client_ca_file) {
  if (cert_file.empty() && key_file.empty() && client_ca_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key (and --tls-client-ca only with them)");
  }
  auto read = [](const std::string& what, const std::string& path) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> pem = ReadFile(path);
    if (!pem.ok() || pem->empty()) {
      return absl::NotFoundError(absl::StrCat(what, " ", path, " cannot be read",
                                              pem.ok() ? " (empty)" : absl::StrCat(": ", pem.status().message())));
    }
    return pem;
  };
  absl::StatusOr<std::string> cert = read("--tls-cert", cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = read("--tls-key", key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!client_ca_file.empty()) {
    absl::StatusOr<std::string> client_ca = read("--tls-client-ca", client_ca_file);
    if (!client_ca.ok()) return client_ca.status();
    options.pem_root_certs = *client_ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace onnxopt::server
