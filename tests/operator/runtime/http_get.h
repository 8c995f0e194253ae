// A minimal HTTP/1.0 GET against 127.0.0.1 for the tests that scrape the operator's endpoints.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

namespace meshwork::runtime::testing {

struct HttpResponse {
  int status = 0;  // 0: no answer
  std::string body;
};

inline HttpResponse HttpGet(int port, const std::string& path) {
  HttpResponse response;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return response;
  timeval timeout{5, 0};  // a hung server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string raw;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) raw.append(buffer, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const auto space = raw.find(' ');
  if (space == std::string::npos) return response;
  response.status = std::atoi(raw.c_str() + space + 1);
  const auto header_end = raw.find("\r\n\r\n");
  if (header_end != std::string::npos) response.body = raw.substr(header_end + 4);
  return response;
}

// The value of the sample line `series` (name plus labels, as serialized), or NaN if absent.
inline double SampleValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nan("");
}

}  // namespace meshwork::runtime::testing
