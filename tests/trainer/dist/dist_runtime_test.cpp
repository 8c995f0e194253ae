// The distributed runtime below the communicators: environment parsing, rendezvous over the
// real store (its failure when the master never appears, or a rank brings another job's
// token), mesh shapes and the mesh's groups.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/common/free_port.h"
#include "trainer/dist/device_mesh.h"
#include "trainer/dist/env.h"
#include "trainer/dist/rendezvous.h"

namespace meshwork::dist {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A fake environment for ReadDistEnv.
class FakeEnv {
 public:
  explicit FakeEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  std::function<const char*(const char*)> getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

// ---- ReadDistEnv -------------------------------------------------------------------------

TEST(ReadDistEnvTest, NoVariablesGiveSingleProcessDefaults) {
  FakeEnv env({});
  Result<DistEnv> r = ReadDistEnv(env.getenv());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->world_size, 1);
  EXPECT_EQ(r->local_rank, 0);
  EXPECT_EQ(r->local_world_size, 1);
  EXPECT_EQ(r->master_addr, "127.0.0.1");
  EXPECT_EQ(r->master_port, 29500);
  EXPECT_EQ(r->restart_generation, 0);
}

TEST(ReadDistEnvTest, ReadsTorchrunVariables) {
  FakeEnv env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
               {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "trainer-0.svc"},
               {"MASTER_PORT", "1234"}, {"TORCHELASTIC_RESTART_COUNT", "2"}});
  Result<DistEnv> r = ReadDistEnv(env.getenv());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->local_world_size, 4);
  EXPECT_EQ(r->master_addr, "trainer-0.svc");
  EXPECT_EQ(r->master_port, 1234);
  EXPECT_EQ(r->restart_generation, 2);
}

TEST(ReadDistEnvTest, ReadsMeshworkVariables) {
  FakeEnv env({{"MESHWORK_RANK", "3"}, {"MESHWORK_WORLD_SIZE", "4"},
               {"MESHWORK_LOCAL_RANK", "1"}, {"MESHWORK_LOCAL_WORLD_SIZE", "2"},
               {"MESHWORK_MASTER_ADDR", "10.0.0.7"}, {"MESHWORK_MASTER_PORT", "40000"},
               {"MESHWORK_RESTART_GENERATION", "7"}});
  Result<DistEnv> r = ReadDistEnv(env.getenv());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->local_world_size, 2);
  EXPECT_EQ(r->master_addr, "10.0.0.7");
  EXPECT_EQ(r->master_port, 40000);
  EXPECT_EQ(r->restart_generation, 7);
}

TEST(ReadDistEnvTest, BothSetsEqualAreAccepted) {
  FakeEnv env({{"RANK", "1"}, {"MESHWORK_RANK", "1"}, {"WORLD_SIZE", "2"},
               {"MESHWORK_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MESHWORK_MASTER_ADDR", "h"}});
  Result<DistEnv> r = ReadDistEnv(env.getenv());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->master_addr, "h");
}

TEST(ReadDistEnvTest, ConflictingSetsNameBothVariablesAndValues) {
  FakeEnv env({{"RANK", "1"}, {"MESHWORK_RANK", "2"}, {"WORLD_SIZE", "4"}});
  Result<DistEnv> r = ReadDistEnv(env.getenv());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("MESHWORK_RANK='2'"), HasSubstr("RANK='1'")));

  FakeEnv addr({{"MASTER_ADDR", "a"}, {"MESHWORK_MASTER_ADDR", "b"}});
  Result<DistEnv> r2 = ReadDistEnv(addr.getenv());
  ASSERT_FALSE(r2.ok());
  EXPECT_THAT(r2.status().message(),
              AllOf(HasSubstr("MESHWORK_MASTER_ADDR='b'"), HasSubstr("MASTER_ADDR='a'")));
}

TEST(ReadDistEnvTest, ReadsTheStoreAddressAndToken) {
  FakeEnv pod({{"POD_IP", "10.1.2.3"}, {"MESHWORK_RENDEZVOUS_TOKEN", "s3cret"}});
  auto r = ReadDistEnv(pod.getenv());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->store_bind_addr, "10.1.2.3");
  EXPECT_EQ(r->rendezvous_token, "s3cret");
  FakeEnv named({{"POD_IP", "10.1.2.3"}, {"MESHWORK_RENDEZVOUS_BIND_ADDR", "0.0.0.0"}});
  r = ReadDistEnv(named.getenv());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->store_bind_addr, "0.0.0.0");
  EXPECT_EQ(r->rendezvous_token, "");
  FakeEnv none({});
  r = ReadDistEnv(none.getenv());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->store_bind_addr, "");  // bind what master_addr resolves to
}

TEST(ReadDistEnvTest, EmptyVariableCountsAsUnset) {
  FakeEnv env({{"RANK", ""}, {"MASTER_ADDR", ""}});
  Result<DistEnv> r = ReadDistEnv(env.getenv());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->master_addr, "127.0.0.1");
}

struct InvalidEnvCase {
  std::map<std::string, std::string> vars;
  std::vector<std::string> expected;  // substrings of the message
};

class ReadDistEnvInvalidTest : public ::testing::TestWithParam<InvalidEnvCase> {};

TEST_P(ReadDistEnvInvalidTest, IsInvalidConfigNamingVariableAndValue) {
  FakeEnv env(GetParam().vars);
  Result<DistEnv> r = ReadDistEnv(env.getenv());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  for (const std::string& s : GetParam().expected) {
    EXPECT_THAT(r.status().message(), HasSubstr(s));
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllFields, ReadDistEnvInvalidTest,
    ::testing::Values(
        InvalidEnvCase{{{"RANK", "x"}}, {"RANK='x'", "not an integer"}},
        InvalidEnvCase{{{"RANK", "1.5"}, {"WORLD_SIZE", "4"}}, {"RANK='1.5'"}},
        InvalidEnvCase{{{"RANK", " 1"}, {"WORLD_SIZE", "4"}}, {"RANK=' 1'"}},
        InvalidEnvCase{{{"RANK", "-1"}}, {"RANK='-1'", "out of range"}},
        InvalidEnvCase{{{"MESHWORK_WORLD_SIZE", "0"}}, {"MESHWORK_WORLD_SIZE='0'"}},
        InvalidEnvCase{{{"WORLD_SIZE", "99999999999"}}, {"WORLD_SIZE='99999999999'"}},
        InvalidEnvCase{{{"RANK", "4"}, {"WORLD_SIZE", "4"}}, {"RANK=4", "WORLD_SIZE=4"}},
        InvalidEnvCase{{{"RANK", "1"}}, {"RANK=1", "world size 1 (the default"}},
        InvalidEnvCase{{{"LOCAL_RANK", "abc"}}, {"LOCAL_RANK='abc'"}},
        InvalidEnvCase{{{"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
                       {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"}},
        InvalidEnvCase{{{"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}},
                       {"LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2"}},
        InvalidEnvCase{{{"MESHWORK_LOCAL_WORLD_SIZE", "-2"}}, {"MESHWORK_LOCAL_WORLD_SIZE='-2'"}},
        InvalidEnvCase{{{"MASTER_PORT", "0"}}, {"MASTER_PORT='0'", "out of range"}},
        InvalidEnvCase{{{"MESHWORK_MASTER_PORT", "70000"}}, {"MESHWORK_MASTER_PORT='70000'"}},
        InvalidEnvCase{{{"MASTER_PORT", "http"}}, {"MASTER_PORT='http'"}},
        InvalidEnvCase{{{"MESHWORK_RESTART_GENERATION", "-1"}},
                       {"MESHWORK_RESTART_GENERATION='-1'"}}));

// ---- Rendezvous --------------------------------------------------------------------------

using meshwork::testing::FreePort;

TEST(RendezvousTest, SingleProcessUsesAnInProcessStore) {
  DistEnv env;
  env.master_addr = "no-such-host.invalid";  // never contacted
  auto r = Rendezvous(env, std::chrono::milliseconds(500));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  (*r)->set("k", std::vector<uint8_t>{'v'});
  EXPECT_EQ((*r)->get("k"), std::vector<uint8_t>{'v'});
}

TEST(RendezvousTest, FourRanksJoinOverTheStore) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  constexpr int kWorld = 4;
  std::vector<std::future<Result<c10::intrusive_ptr<c10d::Store>>>> ranks;
  for (int rank = kWorld - 1; rank >= 0; --rank) {  // clients first: they must wait for rank 0
    DistEnv env;
    env.rank = rank;
    env.world_size = kWorld;
    env.local_rank = rank;
    env.local_world_size = kWorld;
    env.master_port = port;
    env.restart_generation = 3;
    ranks.push_back(std::async(std::launch::async, [env] {
      return Rendezvous(env, std::chrono::seconds(30));
    }));
    if (rank == kWorld - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::vector<c10::intrusive_ptr<c10d::Store>> stores;
  for (auto& f : ranks) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    stores.push_back(*r);
  }
  // Every rank sees the same store: the join counter, and a key written by one rank.
  for (auto& s : stores) EXPECT_EQ(s->add("rendezvous/3/joined", 0), kWorld);
  stores[0]->set("hello", std::vector<uint8_t>{'x'});
  EXPECT_EQ(stores[2]->get("hello"), std::vector<uint8_t>{'x'});
}

TEST(RendezvousTest, UnresolvableMasterFailsAfterTimeoutNamingAddressAndWait) {
  DistEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.master_addr = "no-such-host.invalid";
  env.master_port = 29999;
  auto start = std::chrono::steady_clock::now();
  auto future = std::async(std::launch::async,
                           [env] { return Rendezvous(env, std::chrono::seconds(2)); });
  // The test itself must not hang if the timeout is not honoured.
  ASSERT_EQ(future.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "Rendezvous ignored its 2 s timeout";
  auto r = future.get();
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("no-such-host.invalid:29999"), HasSubstr("after waiting 2."),
                    HasSubstr("cannot resolve")));
  EXPECT_GE(waited, 1.9);  // it retried until the timeout rather than failing at once
  EXPECT_LT(waited, 5.0);
}

TEST(RendezvousTest, MissingRankFailsTheBarrierNamingHowManyJoined) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  // Ranks 0 and 1 of 3 come; rank 2 never does. Both time out at the same deadline; rank 0,
  // which hosts the store, lingers so rank 1 can still read the count (a loaded CI machine once
  // showed rank 1 finding the server gone: "only ? of 3").
  std::vector<std::future<Result<c10::intrusive_ptr<c10d::Store>>>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    DistEnv env;
    env.rank = rank;
    env.world_size = 3;
    env.master_port = port;
    ranks.push_back(std::async(std::launch::async, [env] {
      return Rendezvous(env, std::chrono::seconds(3));
    }));
  }
  for (auto& f : ranks) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(40)), std::future_status::ready);
    auto r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(r.status().message(),
                AllOf(HasSubstr("127.0.0.1:" + std::to_string(port)),
                      HasSubstr("2 of 3 ranks joined")));
  }
}

// Starts ranks 0..world-1 of a rendezvous on `port`, each with its DistEnv as `adjust` sets it.
std::vector<std::future<Result<c10::intrusive_ptr<c10d::Store>>>> StartRanks(
    int world, int port, std::chrono::seconds timeout, const std::function<void(DistEnv&)>& adjust) {
  std::vector<std::future<Result<c10::intrusive_ptr<c10d::Store>>>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    DistEnv env;
    env.rank = rank;
    env.world_size = world;
    env.master_port = port;
    adjust(env);
    ranks.push_back(std::async(std::launch::async, [env, timeout] { return Rendezvous(env, timeout); }));
  }
  return ranks;
}

TEST(RendezvousTest, ARankWithAnotherJobsTokenIsRefusedNamingTheToken) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto ranks = StartRanks(2, port, std::chrono::seconds(2),
                          [](DistEnv& env) { env.rendezvous_token = env.rank == 0 ? "job-a" : "job-b"; });
  auto host = ranks[0].get();
  auto stranger = ranks[1].get();
  ASSERT_FALSE(host.ok());
  ASSERT_FALSE(stranger.ok());
  EXPECT_THAT(host.status().message(), HasSubstr("only 1 of 2 ranks joined"));
  EXPECT_EQ(stranger.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(stranger.status().message(),
              AllOf(HasSubstr("rank 1 could not join the rendezvous at 127.0.0.1:" + std::to_string(port)),
                    HasSubstr("refused this rank's token (MESHWORK_RENDEZVOUS_TOKEN)")));
}

TEST(RendezvousTest, RankZeroBindsThePodAddressNotEveryAddress) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto ranks = StartRanks(2, port, std::chrono::seconds(20), [](DistEnv& env) {
    env.master_addr = "127.0.0.2";                        // rank 0's Pod address, as its DNS name resolves
    if (env.rank == 0) env.store_bind_addr = "127.0.0.2";  // POD_IP
    env.rendezvous_token = "job-a";
  });
  auto store = ranks[0].get();
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE(ranks[1].get().ok());
  // Another of this machine's addresses does not answer.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in other{};
  other.sin_family = AF_INET;
  other.sin_port = htons(static_cast<uint16_t>(port));
  other.sin_addr.s_addr = htonl(0x7f000003);  // 127.0.0.3
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&other), sizeof(other)), 0)
      << "rank 0's store answered on 127.0.0.3";
  ::close(fd);
}

// ---- ResolveMeshShape --------------------------------------------------------------------

struct MeshCase {
  int world, replicate, shard, tp;
  int want_replicate, want_shard;  // 0: expect an error
  std::vector<std::string> expected;  // substrings of the error
};

class ResolveMeshShapeTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ResolveMeshShapeTest, ResolvesOrNamesTheProblem) {
  const MeshCase& c = GetParam();
  Result<MeshShape> r = ResolveMeshShape(c.world, c.replicate, c.shard, c.tp);
  if (c.want_replicate == 0) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
    for (const auto& s : c.expected) EXPECT_THAT(r.status().message(), HasSubstr(s));
    return;
  }
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->dp_replicate, c.want_replicate);
  EXPECT_EQ(r->dp_shard, c.want_shard);
  EXPECT_EQ(r->tp, c.tp);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ResolveMeshShapeTest,
    ::testing::Values(
        MeshCase{1, 0, 0, 1, 1, 1, {}},
        MeshCase{8, 0, 0, 1, 1, 8, {}},   // both auto: pure FSDP
        MeshCase{8, 2, 0, 1, 2, 4, {}},   // shard auto
        MeshCase{8, 0, 4, 1, 2, 4, {}},   // replicate auto
        MeshCase{8, 2, 4, 1, 2, 4, {}},   // explicit
        MeshCase{8, 8, 1, 1, 8, 1, {}},   // pure DDP
        MeshCase{8, 3, 0, 1, 0, 0, {"dp_replicate=3", "world size 8"}},
        MeshCase{8, 0, 3, 1, 0, 0, {"dp_shard=3", "world size 8"}},
        MeshCase{8, 2, 2, 1, 0, 0, {"dp_replicate=2", "dp_shard=2", "4 ranks", "world size is 8"}},
        MeshCase{8, 1, 0, 2, 1, 4, {}},   // FSDP over what tp leaves
        MeshCase{8, 0, 0, 8, 1, 1, {}},   // tensor parallel only
        MeshCase{8, 2, 0, 2, 2, 2, {}},   // HSDP x tp
        MeshCase{8, 1, 8, 2, 0, 0, {"tp=2", "16 ranks", "world size is 8"}},
        MeshCase{8, 0, 0, 3, 0, 0, {"tp=3", "does not divide the world size 8"}},
        MeshCase{8, 3, 0, 2, 0, 0, {"dp_replicate=3", "8 / tp=2 = 4"}},
        MeshCase{8, 1, 0, 0, 0, 0, {"tp=0"}},
        MeshCase{8, -1, 0, 1, 0, 0, {"dp_replicate=-1"}},
        MeshCase{0, 0, 0, 1, 0, 0, {"world size"}}));

// ---- DeviceMesh --------------------------------------------------------------------------

// What the fake factory was asked to build.
struct GroupRecord {
  std::string name;
  int rank, size;
  c10::intrusive_ptr<c10d::Store> store;
};

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "fake"; }
  torch::Device device() const override { return torch::Device(torch::kCPU); }
  const std::string& group_name() const override { return name_; }
  Result<std::unique_ptr<Work>> AllGatherInto(torch::Tensor, torch::Tensor) override {
    return Internal("fake");
  }
  Result<std::unique_ptr<Work>> ReduceScatter(torch::Tensor, torch::Tensor, ReduceOp) override {
    return Internal("fake");
  }
  Result<std::unique_ptr<Work>> AllReduce(torch::Tensor, ReduceOp) override {
    return Internal("fake");
  }
  Result<std::unique_ptr<Work>> Broadcast(torch::Tensor, int) override { return Internal("fake"); }
  Result<std::unique_ptr<Work>> Barrier() override { return Internal("fake"); }
  CommStats stats() const override { return {}; }

 private:
  int rank_, size_;
  std::string name_;
};

CommunicatorFactory RecordingFactory(std::vector<GroupRecord>* records) {
  return [records](c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                   const CommunicatorOptions& options) -> Result<std::unique_ptr<Communicator>> {
    records->push_back({options.group_name, rank, size, store});
    return std::unique_ptr<Communicator>(
        std::make_unique<FakeCommunicator>(rank, size, options.group_name));
  };
}

TEST(DeviceMeshTest, TwoByTwoCoordinatesGroupsAndLayout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const MeshShape shape{2, 2, 1};
  // For each rank, (dim -> coordinate), and for each group a key written through its store.
  std::map<std::pair<std::string, int>, std::set<int>> members;  // (dim, group) -> ranks
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<GroupRecord> records;
    auto mesh = DeviceMesh::Create(store, rank, shape, RecordingFactory(&records), {});
    ASSERT_TRUE(mesh.ok()) << mesh.status().ToString();
    DeviceMesh& m = **mesh;
    EXPECT_EQ(m.rank(), rank);
    // Shard innermost: rank = replicate_index * dp_shard + shard_index.
    EXPECT_EQ(m.coordinate("dp_replicate"), rank / 2);
    EXPECT_EQ(m.coordinate("dp_shard"), rank % 2);
    EXPECT_EQ(m.coordinate("world"), rank);
    EXPECT_EQ(m.coordinate("dp_replicate") * 2 + m.coordinate("dp_shard"), rank);
    EXPECT_EQ(m.group("world").size(), 4);
    EXPECT_EQ(m.group("world").rank(), rank);
    EXPECT_EQ(m.group("dp_shard").size(), 2);
    EXPECT_EQ(m.group("dp_shard").rank(), rank % 2);
    EXPECT_EQ(m.group("dp_replicate").size(), 2);
    EXPECT_EQ(m.group("dp_replicate").rank(), rank / 2);
    EXPECT_STREQ(m.group("dp_shard").group_name().c_str(), "dp_shard");

    // dp_shard's reduce-scatter lane: the same ranks, a communicator of its own.
    EXPECT_EQ(m.group("dp_shard_reduce").size(), 2);
    EXPECT_EQ(m.group("dp_shard_reduce").rank(), rank % 2);
    EXPECT_NE(&m.group("dp_shard_reduce"), &m.group("dp_shard"));

    // One group per dim, created in the same order on every rank; tp 1: no tp group.
    ASSERT_EQ(records.size(), 4u);
    EXPECT_EQ(records[0].name, "world");
    EXPECT_EQ(records[1].name, "dp_replicate");
    EXPECT_EQ(records[2].name, "dp_shard");
    EXPECT_EQ(records[3].name, "dp_shard_reduce");
    EXPECT_EQ(m.size("tp"), 1);
    EXPECT_EQ(m.coordinate("tp"), 0);
    EXPECT_THAT(m.find_group("tp").status().message(), HasSubstr("'tp' has no group"));
    EXPECT_EQ(m.groups().size(), 4u);
    // Tag each group's scoped store: ranks of one group share keys, other groups do not.
    for (const GroupRecord& g : records) {
      g.store->add("members", 1);
      g.store->set("member/" + std::to_string(rank), std::vector<uint8_t>{'1'});
    }
  }
  // Groups by prefix, read back from the shared store.
  auto count = [&](const std::string& prefix) { return store->add(prefix + "/members", 0); };
  EXPECT_EQ(count("mesh/world/0"), 4);
  EXPECT_EQ(count("mesh/dp_shard/0"), 2);  // replicate index 0: ranks 0, 1
  EXPECT_EQ(count("mesh/dp_shard/1"), 2);  // ranks 2, 3
  EXPECT_EQ(count("mesh/dp_replicate/0"), 2);  // shard index 0: ranks 0, 2
  EXPECT_EQ(count("mesh/dp_replicate/1"), 2);  // ranks 1, 3
  EXPECT_TRUE(store->check({"mesh/dp_shard/0/member/0", "mesh/dp_shard/0/member/1"}));
  EXPECT_TRUE(store->check({"mesh/dp_shard/1/member/2", "mesh/dp_shard/1/member/3"}));
  EXPECT_EQ(count("mesh/dp_shard_reduce/0"), 2);
  EXPECT_TRUE(store->check({"mesh/dp_shard_reduce/1/member/2", "mesh/dp_shard_reduce/1/member/3"}));
  EXPECT_TRUE(store->check({"mesh/dp_replicate/0/member/0", "mesh/dp_replicate/0/member/2"}));
  EXPECT_TRUE(store->check({"mesh/dp_replicate/1/member/1", "mesh/dp_replicate/1/member/3"}));
  EXPECT_FALSE(store->check({"mesh/dp_shard/0/member/2"}));
  EXPECT_FALSE(store->check({"mesh/dp_replicate/0/member/1"}));
}

// tp innermost: a tp group is a run of consecutive ranks (one node's GPUs), the dp groups stride
// over it. Mesh dp_replicate 2 x dp_shard 2 x tp 2 of 8 ranks.
TEST(DeviceMeshTest, TensorParallelGroupsAreConsecutiveRanks) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const MeshShape shape{2, 2, 2};
  for (int rank = 0; rank < 8; ++rank) {
    std::vector<GroupRecord> records;
    auto mesh = DeviceMesh::Create(store, rank, shape, RecordingFactory(&records), {});
    ASSERT_TRUE(mesh.ok()) << mesh.status().ToString();
    DeviceMesh& m = **mesh;
    EXPECT_EQ(m.coordinate("tp"), rank % 2);
    EXPECT_EQ(m.coordinate("dp_shard"), rank / 2 % 2);
    EXPECT_EQ(m.coordinate("dp_replicate"), rank / 4);
    EXPECT_EQ((m.coordinate("dp_replicate") * 2 + m.coordinate("dp_shard")) * 2 + m.coordinate("tp"), rank);
    EXPECT_EQ(m.group("tp").size(), 2);
    EXPECT_EQ(m.group("tp").rank(), rank % 2);
    EXPECT_EQ(m.group("dp_shard").size(), 2);
    EXPECT_EQ(m.group("dp_replicate").size(), 2);
    ASSERT_EQ(records.size(), 5u);
    EXPECT_EQ(records[4].name, "tp");
    for (const GroupRecord& g : records) g.store->set("member/" + std::to_string(rank), std::vector<uint8_t>{'1'});
  }
  // tp groups: {0, 1}, {2, 3}, ...; dp_shard groups: {0, 2}, {1, 3}, {4, 6}, {5, 7};
  // dp_replicate groups: {0, 4}, {1, 5}, {2, 6}, {3, 7}.
  EXPECT_TRUE(store->check({"mesh/tp/0/member/0", "mesh/tp/0/member/1", "mesh/tp/3/member/6", "mesh/tp/3/member/7"}));
  EXPECT_FALSE(store->check({"mesh/tp/0/member/2"}));
  EXPECT_TRUE(store->check({"mesh/dp_shard/0/member/0", "mesh/dp_shard/0/member/2", "mesh/dp_shard/1/member/1",
                            "mesh/dp_shard/1/member/3", "mesh/dp_shard/2/member/4", "mesh/dp_shard/3/member/7"}));
  EXPECT_FALSE(store->check({"mesh/dp_shard/0/member/1"}));
  EXPECT_TRUE(store->check({"mesh/dp_replicate/0/member/0", "mesh/dp_replicate/0/member/4",
                            "mesh/dp_replicate/3/member/3", "mesh/dp_replicate/3/member/7"}));
}

TEST(DeviceMeshTest, UnknownDimListsTheKnownOnes) {
  std::vector<GroupRecord> records;
  auto mesh = DeviceMesh::Create(c10::make_intrusive<c10d::HashStore>(), 0, MeshShape{1, 2, 1},
                                 RecordingFactory(&records), {});
  ASSERT_TRUE(mesh.ok()) << mesh.status().ToString();
  auto g = (*mesh)->find_group("pp");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(),
              AllOf(HasSubstr("'pp'"), HasSubstr("world, dp_replicate, dp_shard, dp_shard_reduce, tp")));
  EXPECT_THROW((*mesh)->group("dp"), std::invalid_argument);
  EXPECT_THROW((*mesh)->coordinate("dp"), std::invalid_argument);
}

TEST(DeviceMeshTest, FactoryFailureNamesTheGroup) {
  CommunicatorFactory failing = [](c10::intrusive_ptr<c10d::Store>, int, int,
                                   const CommunicatorOptions& o)
      -> Result<std::unique_ptr<Communicator>> {
    if (o.group_name == "dp_shard") return Status(StatusCode::kUnavailable, "peer gone");
    return std::unique_ptr<Communicator>(std::make_unique<FakeCommunicator>(0, 1, o.group_name));
  };
  auto mesh = DeviceMesh::Create(c10::make_intrusive<c10d::HashStore>(), 3, MeshShape{2, 2, 1},
                                 failing, {});
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(mesh.status().message(),
              AllOf(HasSubstr("dp_shard group 1"), HasSubstr("rank 3"), HasSubstr("peer gone")));
}

TEST(DeviceMeshTest, RankOutsideTheMeshIsRejected) {
  std::vector<GroupRecord> records;
  auto mesh = DeviceMesh::Create(c10::make_intrusive<c10d::HashStore>(), 4, MeshShape{2, 2, 1},
                                 RecordingFactory(&records), {});
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kInvalidConfig);
  EXPECT_TRUE(records.empty());
}

}  // namespace
}  // namespace meshwork::dist
