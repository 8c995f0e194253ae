// common/loopback_port.h: a picked port binds, lies above the kernel's ephemeral range (where no
// outgoing connection can take it), and shows as listening only while something listens.
#include "common/loopback_port.h"

#include <gtest/gtest.h>

namespace meshwork {
namespace {

TEST(LoopbackPort, APickedPortIsAboveTheEphemeralRangeAndBinds) {
  const int end = EphemeralPortRangeEnd();
  ASSERT_GT(end, 1024);
  for (int i = 0; i < 20; ++i) {
    const int port = FreeLoopbackPort();
    ASSERT_GT(port, 0);
    ASSERT_LE(port, 65535);
    if (end <= 65535 - 1000) EXPECT_GT(port, end) << "picked inside the ephemeral range ending at " << end;
    int bound = 0;
    EXPECT_TRUE(BindsOnLoopback(port, &bound)) << port;
    EXPECT_EQ(bound, port);
  }
}

TEST(LoopbackPort, ListeningOnlyWhileAServerListens) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  EXPECT_FALSE(LoopbackPortListening(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  EXPECT_TRUE(LoopbackPortListening(port));
  int bound = 0;
  EXPECT_FALSE(BindsOnLoopback(port, &bound)) << "a listening port must not look free";
  ::close(fd);
}

}  // namespace
}  // namespace meshwork
