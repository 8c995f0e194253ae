// common/loopback_port.h: a picked port binds, lies above the kernel's ephemeral range (where no
// outgoing connection can take it), and shows as listening only while something listens.
#include "common/loopback_port.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "common/file.h"

namespace meshwork {
namespace {

TEST(LoopbackPort, APickedPortIsAboveTheEphemeralRangeAndBinds) {
  const int end = EphemeralPortRangeEnd();
  ASSERT_GT(end, 1024);
  for (int i = 0; i < 20; ++i) {
    const int port = FreeLoopbackPort();
    ASSERT_GT(port, 0);
    ASSERT_LE(port, 65535);
    if (end <= 65535 - 1000) {
      EXPECT_GT(port, end) << "picked inside the ephemeral range ending at " << end;
    }
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

// A recorded pick keeps the port from other pickers for kPortPickSeconds, then frees it.
TEST(LoopbackPort, ARecordedPickKeepsThePortFromOtherPicksUntilItIsOld) {
  char tmpl[] = "/tmp/port-picks-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/picks";  // made by the first claim
  EXPECT_TRUE(ClaimPortPick(62001, dir));
  EXPECT_FALSE(ClaimPortPick(62001, dir)) << "the same port picked twice within minutes";
  EXPECT_TRUE(ClaimPortPick(62002, dir));
  const std::string path = dir + "/62001";
  const time_t then = std::time(nullptr) - kPortPickSeconds - 5;
  const timespec old[2] = {{then, 0}, {then, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), old, 0), 0);
  EXPECT_TRUE(ClaimPortPick(62001, dir)) << "an old pick still held the port";
  EXPECT_FALSE(ClaimPortPick(62001, dir)) << "the new claim was not recorded";
  // Where nothing can be recorded, picks are not blocked.
  EXPECT_TRUE(ClaimPortPick(62003, "/proc/no-such-dir"));
  EXPECT_TRUE(RemoveTree(tmpl).ok());
}

}  // namespace
}  // namespace meshwork
