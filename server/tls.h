// Credentials for the gRPC port: plaintext when no certificate is given (the loopback quick start), TLS
// with a certificate chain and its key, mutual TLS when a client CA is given (every client must then
// present a certificate that chains to it).
#ifndef ONNXOPT_SERVER_TLS_H_
#define ONNXOPT_SERVER_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"

namespace onnxopt::server {

// INVALID_ARGUMENT for a certificate without its key (or the reverse) or a client CA without a
// certificate; NOT_FOUND (naming the file) for a PEM file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(const std::string& cert_file,
                                                                                    const std::string& key_file,
                                                                                    const std::string& client_ca_file);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_TLS_H_
