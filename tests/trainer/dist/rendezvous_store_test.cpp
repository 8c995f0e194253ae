// The rendezvous store: c10d::Store semantics over real sockets, the token check, the bound
// address (c10d's TCPStore, which this replaced, listened on every address and took any
// client), and shutdown that wakes every waiter.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trainer/dist/rendezvous_store.h"

namespace meshwork::dist {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::unique_ptr<StoreServer> StartServer(const std::string& host = "127.0.0.1", const std::string& token = "t0k3n") {
  auto server = StoreServer::Start(host, 0, token);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(*server) : nullptr;
}

c10::intrusive_ptr<StoreClient> ConnectTo(const StoreServer& server, const std::string& token = "t0k3n") {
  auto client = StoreClient::Connect(server.bound_host(), server.port(), token, milliseconds(5000));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? *client : c10::intrusive_ptr<StoreClient>();
}

// A raw TCP connection to the server, for clients that do not speak the protocol.
int RawConnect(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(RendezvousStoreTest, TwoClientsShareKeysWithC10dSemantics) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto a = ConnectTo(*server);
  auto b = ConnectTo(*server);
  ASSERT_TRUE(a && b);

  a->set("k", Bytes("v1"));
  EXPECT_EQ(b->get("k"), Bytes("v1"));
  EXPECT_EQ(b->add("n", 5), 5);
  EXPECT_EQ(a->add("n", -2), 3);
  EXPECT_EQ(a->get("n"), Bytes("3"));  // add keeps the count as decimal text, as TCPStore does
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_FALSE(a->check({"k", "missing"}));
  EXPECT_EQ(a->getNumKeys(), 2);

  // compareSet: a missing key with an empty expected value is set; a match replaces; a
  // mismatch answers the current value and changes nothing.
  EXPECT_EQ(a->compareSet("c", {}, Bytes("first")), Bytes("first"));
  EXPECT_EQ(b->compareSet("c", Bytes("wrong"), Bytes("x")), Bytes("first"));
  EXPECT_EQ(b->compareSet("c", Bytes("first"), Bytes("second")), Bytes("second"));
  EXPECT_EQ(a->compareSet("absent", Bytes("e"), Bytes("d")), Bytes("e"));
  EXPECT_FALSE(a->check({"absent"}));

  EXPECT_TRUE(b->deleteKey("k"));
  EXPECT_FALSE(b->deleteKey("k"));
  EXPECT_FALSE(a->check({"k"}));

  // Binary values survive the wire as they are.
  std::vector<uint8_t> binary = {0, 255, 10, 13, 0, 'M', 'W'};
  a->set("bin", binary);
  EXPECT_EQ(b->get("bin"), binary);
}

TEST(RendezvousStoreTest, AddOnANonIntegerValueNamesTheKey) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto a = ConnectTo(*server);
  a->set("text", Bytes("hello"));
  try {
    a->add("text", 1);
    FAIL() << "add on a non-integer value succeeded";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("add 'text'"), HasSubstr("does not hold an integer")));
  }
  EXPECT_EQ(a->get("text"), Bytes("hello"));  // the connection still works
}

TEST(RendezvousStoreTest, GetAndWaitBlockUntilAnotherClientSets) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto a = ConnectTo(*server);
  auto b = ConnectTo(*server);
  a->setTimeout(milliseconds(20000));
  auto got = std::async(std::launch::async, [&] { return a->get("late"); });
  auto waited = std::async(std::launch::async, [&] {
    auto c = ConnectTo(*server);
    c->wait({"late", "later"}, milliseconds(20000));
    return true;
  });
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(got.wait_for(milliseconds(0)), std::future_status::timeout) << "get returned before the key was set";
  b->set("late", Bytes("here"));
  ASSERT_EQ(got.wait_for(milliseconds(10000)), std::future_status::ready);
  EXPECT_EQ(got.get(), Bytes("here"));
  EXPECT_EQ(waited.wait_for(milliseconds(200)), std::future_status::timeout) << "wait returned with one key of two";
  b->set("later", Bytes("x"));
  ASSERT_EQ(waited.wait_for(milliseconds(10000)), std::future_status::ready);
  EXPECT_TRUE(waited.get());
}

TEST(RendezvousStoreTest, WaitTimesOutNamingAddressKeysAndBound) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto a = ConnectTo(*server);
  const auto start = std::chrono::steady_clock::now();
  try {
    a->wait({"never"}, milliseconds(300));
    FAIL() << "wait for a key nobody sets returned";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(a->where()), HasSubstr("wait for 'never'"), HasSubstr("timed out after 0.3 s")));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
  a->setTimeout(milliseconds(200));
  EXPECT_THROW(a->get("never"), StoreError);
  a->set("after", Bytes("ok"));  // a timed-out request leaves the connection usable
  EXPECT_EQ(a->get("after"), Bytes("ok"));
}

TEST(RendezvousStoreTest, AWrongTokenIsRefusedAndNamesTheVariable) {
  auto server = StartServer("127.0.0.1", "job-a-secret");
  ASSERT_NE(server, nullptr);
  for (const std::string token : {"job-b-secret", "", "job-a-secre", "job-a-secret!"}) {
    auto client = StoreClient::Connect(server->bound_host(), server->port(), token, milliseconds(5000));
    ASSERT_FALSE(client.ok()) << "token '" << token << "' was admitted";
    EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(client.status().message(),
                AllOf(HasSubstr("refused this rank's token"), HasSubstr("MESHWORK_RENDEZVOUS_TOKEN")));
  }
  auto right = StoreClient::Connect(server->bound_host(), server->port(), "job-a-secret", milliseconds(5000));
  EXPECT_TRUE(right.ok()) << right.status().ToString();
}

TEST(RendezvousStoreTest, BindsOnlyTheNamedAddress) {
  // Every 127/8 address is this machine's: a server bound to 127.0.0.2 must not answer on
  // 127.0.0.3 (TCPStore, bound to 0.0.0.0, did).
  auto server = StartServer("127.0.0.2");
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->bound_host(), "127.0.0.2");
  int other = RawConnect("127.0.0.3", server->port());
  EXPECT_LT(other, 0) << "the store answered on an address it was not bound to";
  if (other >= 0) ::close(other);
  auto refused = StoreClient::Connect("127.0.0.3", server->port(), "t0k3n", milliseconds(2000));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("refused"));
  EXPECT_TRUE(ConnectTo(*server));
}

TEST(RendezvousStoreTest, AnAddressInUseIsUnavailableNamingIt) {
  auto first = StartServer("127.0.0.1");
  ASSERT_NE(first, nullptr);
  auto second = StoreServer::Start("127.0.0.1", first->port(), "t0k3n");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr("127.0.0.1:" + std::to_string(first->port())), HasSubstr("in use")));
}

TEST(RendezvousStoreTest, AForeignOrSilentClientDoesNotBlockTheStore) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  // One connection says nothing; another speaks HTTP. Neither holds up a real client.
  int silent = RawConnect(server->bound_host(), server->port());
  int http = RawConnect(server->bound_host(), server->port());
  ASSERT_GE(silent, 0);
  ASSERT_GE(http, 0);
  const std::string request = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(http, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  char reply[256];
  ssize_t n = ::recv(http, reply, sizeof(reply), 0);
  ASSERT_GT(n, 0);
  EXPECT_THAT(std::string(reply, static_cast<size_t>(n)), HasSubstr("not a Meshwork rendezvous client"));
  EXPECT_EQ(::recv(http, reply, sizeof(reply), 0), 0) << "the server kept a foreign connection open";
  auto a = ConnectTo(*server);
  a->set("k", Bytes("v"));
  EXPECT_EQ(a->get("k"), Bytes("v"));
  ::close(silent);
  ::close(http);
}

TEST(RendezvousStoreTest, StoppingTheServerWakesAWaiterWithAClearError) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto a = ConnectTo(*server);
  a->setTimeout(c10d::Store::kNoTimeout);  // waits for ever, unless the server goes
  auto got = std::async(std::launch::async, [&]() -> std::string {
    try {
      a->get("never");
      return "returned";
    } catch (const StoreError& e) {
      return e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(200));
  server.reset();  // must not hang on the waiting connection
  ASSERT_EQ(got.wait_for(milliseconds(10000)), std::future_status::ready);
  EXPECT_THAT(got.get(), AllOf(HasSubstr("get 'never'"), HasSubstr("closed the connection")));
}

TEST(RendezvousStoreTest, ManyClientsCountTogether) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  constexpr int kClients = 16;
  constexpr int kAdds = 50;
  std::vector<std::future<void>> done;
  for (int i = 0; i < kClients; ++i) {
    done.push_back(std::async(std::launch::async, [&] {
      auto c = ConnectTo(*server);
      for (int j = 0; j < kAdds; ++j) c->add("count", 1);
    }));
  }
  for (auto& f : done) f.get();
  EXPECT_EQ(ConnectTo(*server)->add("count", 0), kClients * kAdds);
}

}  // namespace
}  // namespace meshwork::dist
