// GET http://127.0.0.1:port/metrics, the way Prometheus scrapes the server (server/metrics.h).
#ifndef ONNXOPT_TESTS_SCRAPE_METRICS_H_
#define ONNXOPT_TESTS_SCRAPE_METRICS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace onnxopt::testing {

// GET http://127.0.0.1:port/metrics with a plain socket; "" on failure.
inline std::string ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  return response;
}

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_SCRAPE_METRICS_H_
