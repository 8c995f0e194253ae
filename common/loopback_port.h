// Ports on 127.0.0.1: one that was free a moment ago, and whether something listens on one. For
// supervisors that pick their children's ports and for tests that start servers on a known port.
//
// The pick comes from above the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999
// by default) where there is room: a port picked inside it can be taken, between the pick and the
// child's bind, by any process's outgoing connection (a kube-apiserver opens dozens to etcd before
// it binds its own port; a CI run of 900 tests opens thousands). Above the range only another
// explicit pick can collide, and a pick is checked by binding it first. Picks are also recorded
// across processes (ClaimPortPick): two picks minutes apart never return the same port, even when
// neither has bound it yet (CI saw kube-apiserver lose its picked port to another test's pick).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>

namespace meshwork {

// 127.0.0.1:port.
inline sockaddr_in LoopbackAddress(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Whether port (0: any) binds on 127.0.0.1 now; the bound port in *bound.
inline bool BindsOnLoopback(int port, int* bound) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr = LoopbackAddress(port);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (ok) *bound = ntohs(addr.sin_port);
  return ok;
}

// The last port of the kernel's ephemeral range (60999 when it cannot be read).
inline int EphemeralPortRangeEnd() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  return in >> low >> high && high > 0 ? high : 60999;
}

// Where picks are recorded: $TMPDIR (else /tmp)/meshwork-port-picks, one empty file per port, shared
// with the e2e tests' picker (tests/common/free_port.sh: free_port).
inline std::string PortPickDir() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/meshwork-port-picks";
}

// How long a recorded pick keeps the port from other pickers: far longer than any pick waits for
// its bind (after the bind, the bind check below sees the port taken).
inline constexpr int kPortPickSeconds = 600;

// Records a pick of `port`; false when another pick recorded it less than kPortPickSeconds ago.
// Best effort: where nothing can be recorded, every port may be picked.
inline bool ClaimPortPick(int port, const std::string& dir = PortPickDir()) {
  ::mkdir(dir.c_str(), 0777);
  const std::string path = dir + "/" + std::to_string(port);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  struct stat st {};
  if (errno != EEXIST || ::stat(path.c_str(), &st) != 0) return true;
  if (std::time(nullptr) - st.st_mtime < kPortPickSeconds) return false;
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // an old pick: this one's now
  return true;
}

// A port that was free a moment ago and that no other pick took in the last kPortPickSeconds:
// above the ephemeral range when at least 1000 ports lie there, else whatever bind(0) gives; -1
// when nothing binds.
inline int FreeLoopbackPort() {
  const int first = EphemeralPortRangeEnd() + 1;
  if (first <= 65535 - 1000) {
    std::random_device seed;
    std::mt19937 rng(seed());
    std::uniform_int_distribution<int> pick(first, 65535);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = pick(rng);
      int bound = 0;
      if (ClaimPortPick(port) && BindsOnLoopback(port, &bound)) return bound;
    }
  }
  int bound = -1;
  return BindsOnLoopback(0, &bound) ? bound : -1;
}

// A socket connected to 127.0.0.1:port (close-on-exec; the caller closes it), or -1.
inline int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const sockaddr_in addr = LoopbackAddress(port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  ::close(fd);
  return -1;
}

inline bool LoopbackPortListening(int port) {
  const int fd = ConnectLoopback(port);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

}  // namespace meshwork
