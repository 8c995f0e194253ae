// Tests for the control plane's object store: CRUD semantics, revisions, lists, watches and
// their history, restart, and recovery from torn or corrupt WAL files.
#include "controlplane/store/store.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "controlplane/store/wal.h"

namespace meshwork::controlplane {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/meshwork-store-XXXXXX";
  char* dir = ::mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

json Pod(const std::string& name, const std::string& image = "busybox") {
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", name}}}, {"spec", {{"image", image}}}};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  StoreOptions Options() {
    StoreOptions o;
    o.fsync = false;
    o.log = [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(log_mu_);
      logs_.push_back(m);
    };
    return o;
  }

  void Open(StoreOptions o) {
    store_.reset();
    auto r = Store::Open(dir_, std::move(o));
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    store_ = std::move(r).value();
  }
  void Open() { Open(Options()); }

  std::string Logs() {
    std::lock_guard<std::mutex> lock(log_mu_);
    std::string all;
    for (const auto& l : logs_) all += l + "\n";
    return all;
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  std::mutex log_mu_;
  std::vector<std::string> logs_;
};

TEST_F(StoreTest, CreateGetUpdateDeleteWithRevisions) {
  Open();
  EXPECT_EQ(store_->Revision(), 0u);
  auto created = store_->Create("pods/default/web-0", Pod("web-0"));
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  EXPECT_EQ(created.value()["metadata"]["resourceVersion"], "1");
  EXPECT_EQ(created.value()["metadata"]["name"], "web-0");
  EXPECT_EQ(store_->Revision(), 1u);
  auto got = store_->Get("pods/default/web-0");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, created.value());

  auto dup = store_->Create("pods/default/web-0", Pod("web-0"));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.code(), StoreErrorCode::kAlreadyExists);

  json changed = created.value();
  changed["spec"]["image"] = "nginx";
  auto updated = store_->Update("pods/default/web-0", changed, 1);
  ASSERT_TRUE(updated.ok()) << updated.error().ToString();
  EXPECT_EQ(updated.value()["metadata"]["resourceVersion"], "2");
  EXPECT_EQ(updated.value()["spec"]["image"], "nginx");
  EXPECT_EQ(ObjectRevision(updated.value()), 2u);

  auto stale = store_->Update("pods/default/web-0", changed, 1);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.code(), StoreErrorCode::kConflict);
  EXPECT_NE(stale.error().message.find("revision 2"), std::string::npos) << stale.error().message;
  EXPECT_EQ(store_->Revision(), 2u) << "a refused write must not use a revision";

  auto unconditional = store_->Update("pods/default/web-0", changed, 0);
  ASSERT_TRUE(unconditional.ok());
  EXPECT_EQ(unconditional.value()["metadata"]["resourceVersion"], "3");

  auto missing = store_->Update("pods/default/nope", changed, 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.code(), StoreErrorCode::kNotFound);

  auto bad_delete = store_->Delete("pods/default/web-0", 2);
  ASSERT_FALSE(bad_delete.ok());
  EXPECT_EQ(bad_delete.code(), StoreErrorCode::kConflict);
  auto deleted = store_->Delete("pods/default/web-0", 3);
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(deleted.value()["metadata"]["resourceVersion"], "4") << "a deletion carries its own revision";
  EXPECT_EQ(deleted.value()["spec"]["image"], "nginx");
  EXPECT_FALSE(store_->Get("pods/default/web-0").has_value());
  auto again = store_->Delete("pods/default/web-0", 0);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.code(), StoreErrorCode::kNotFound);
  EXPECT_TRUE(store_->Create("pods/default/web-0", Pod("web-0")).ok());
  EXPECT_EQ(store_->Revision(), 5u);
}

TEST_F(StoreTest, InvalidKeysAndObjectsAreRefusedByName) {
  Open();
  for (const char* key : {"", "pods", "pods/default", "/default/x", "pods/default/", "pods/a/b/c"}) {
    auto r = store_->Create(key, Pod("x"));
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.code(), StoreErrorCode::kInvalid);
    EXPECT_NE(r.error().message.find(std::string("\"") + key + "\""), std::string::npos);
  }
  EXPECT_TRUE(store_->Create("namespaces//default", json{{"kind", "Namespace"}}).ok());
  auto arr = store_->Create("pods/default/a", json::array());
  ASSERT_FALSE(arr.ok());
  EXPECT_EQ(arr.code(), StoreErrorCode::kInvalid);
  auto meta = store_->Create("pods/default/a", json{{"metadata", 5}});
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.error().message.find("metadata"), std::string::npos);
  EXPECT_EQ(store_->Revision(), 1u);
}

TEST_F(StoreTest, RevisionsAreMonotonicAcrossKeys) {
  Open();
  uint64_t last = 0;
  for (int i = 0; i < 50; ++i) {
    std::string key = "configmaps/ns" + std::to_string(i % 3) + "/c" + std::to_string(i % 7);
    auto r = store_->Get(key) ? store_->Update(key, Pod("c"), 0) : store_->Create(key, Pod("c"));
    ASSERT_TRUE(r.ok());
    uint64_t rev = ObjectRevision(r.value());
    EXPECT_EQ(rev, last + 1);
    last = rev;
  }
  EXPECT_EQ(store_->Revision(), last);
}

TEST_F(StoreTest, ListByPrefixIsSortedAndPaged) {
  Open();
  for (const char* key : {"pods/default/b", "pods/default/a", "pods/other/c", "podsx/default/z",
                          "services/default/a", "pods/default/c"}) {
    ASSERT_TRUE(store_->Create(key, Pod(key)).ok());
  }
  auto ns = store_->List("pods/default/");
  ASSERT_EQ(ns.items.size(), 3u);
  EXPECT_EQ(ns.keys, (std::vector<std::string>{"pods/default/a", "pods/default/b", "pods/default/c"}));
  EXPECT_EQ(ns.items[0]["metadata"]["name"], "pods/default/a");
  EXPECT_EQ(ns.revision, 6u);
  auto all = store_->List("pods/");
  EXPECT_EQ(all.keys, (std::vector<std::string>{"pods/default/a", "pods/default/b", "pods/default/c", "pods/other/c"}));
  EXPECT_EQ(store_->List("").items.size(), 6u);
  EXPECT_TRUE(store_->List("nodes/").items.empty());

  auto p1 = store_->ListPage("pods/", "", 3);
  EXPECT_EQ(p1.keys.size(), 3u);
  EXPECT_TRUE(p1.more);
  auto p2 = store_->ListPage("pods/", p1.keys.back(), 3);
  EXPECT_EQ(p2.keys, (std::vector<std::string>{"pods/other/c"}));
  EXPECT_FALSE(p2.more);
  auto exact = store_->ListPage("pods/", "", 4);
  EXPECT_FALSE(exact.more);
}

std::vector<StoreEvent> Drain(WatchStream* w, size_t want, std::chrono::milliseconds each = 2000ms) {
  std::vector<StoreEvent> out;
  StoreEvent e;
  while (out.size() < want && w->Next(&e, each)) out.push_back(e);
  return out;
}

TEST_F(StoreTest, WatchFromARevisionReplaysExactlyTheLaterEvents) {
  Open();
  ASSERT_TRUE(store_->Create("pods/default/a", Pod("a")).ok());          // 1
  ASSERT_TRUE(store_->Create("pods/other/b", Pod("b")).ok());            // 2
  ASSERT_TRUE(store_->Update("pods/default/a", Pod("a", "v2"), 1).ok());  // 3
  ASSERT_TRUE(store_->Create("services/default/a", Pod("s")).ok());       // 4
  ASSERT_TRUE(store_->Delete("pods/default/a", 0).ok());                  // 5

  auto w = store_->Watch("pods/", 1);
  ASSERT_TRUE(w.ok()) << w.error().ToString();
  auto events = Drain(w.value().get(), 10, 200ms);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].revision, 2u);
  EXPECT_EQ(events[0].type, EventType::kAdded);
  EXPECT_EQ(events[0].key, "pods/other/b");
  EXPECT_EQ(events[1].revision, 3u);
  EXPECT_EQ(events[1].type, EventType::kModified);
  EXPECT_EQ(events[1].object["spec"]["image"], "v2");
  EXPECT_EQ(events[2].revision, 5u);
  EXPECT_EQ(events[2].type, EventType::kDeleted);
  EXPECT_EQ(events[2].object["metadata"]["resourceVersion"], "5");
  EXPECT_EQ(events[2].object["spec"]["image"], "v2");
  EXPECT_EQ(w.value()->ProgressRevision(), 5u);

  // Then follows live writes, and only under its prefix.
  ASSERT_TRUE(store_->Create("services/default/b", Pod("s")).ok());  // 6
  ASSERT_TRUE(store_->Create("pods/default/c", Pod("c")).ok());      // 7
  events = Drain(w.value().get(), 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].key, "pods/default/c");
  EXPECT_EQ(events[0].revision, 7u);
  EXPECT_EQ(std::string(EventTypeName(events[0].type)), "ADDED");
  StoreEvent e;
  EXPECT_FALSE(w.value()->Next(&e, 50ms)) << "nothing more under pods/";
  EXPECT_FALSE(w.value()->Done());
  EXPECT_EQ(w.value()->ProgressRevision(), 7u);
}

TEST_F(StoreTest, WatchFromZeroSeesOnlyFutureEvents) {
  Open();
  ASSERT_TRUE(store_->Create("pods/default/a", Pod("a")).ok());
  auto w = store_->Watch("pods/default/", 0);
  ASSERT_TRUE(w.ok());
  StoreEvent e;
  EXPECT_FALSE(w.value()->Next(&e, 50ms));
  EXPECT_EQ(w.value()->ProgressRevision(), 1u);
  ASSERT_TRUE(store_->Update("pods/default/a", Pod("a", "v2"), 0).ok());
  ASSERT_TRUE(w.value()->Next(&e, 2000ms));
  EXPECT_EQ(e.type, EventType::kModified);
  EXPECT_EQ(e.revision, 2u);
}

TEST_F(StoreTest, WatchFromCompactedHistoryIsGone) {
  StoreOptions o = Options();
  o.history_events = 5;
  Open(o);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(store_->Create("pods/default/p" + std::to_string(i), Pod("p")).ok());
  EXPECT_EQ(store_->CompactedRevision(), 5u);
  auto gone = store_->Watch("pods/", 3);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.code(), StoreErrorCode::kGone);
  EXPECT_NE(gone.error().message.find("too old resource version"), std::string::npos);
  auto ok = store_->Watch("pods/", 5);
  ASSERT_TRUE(ok.ok());
  auto events = Drain(ok.value().get(), 10, 100ms);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events.front().revision, 6u);
  EXPECT_EQ(events.back().revision, 10u);
}

TEST_F(StoreTest, SlowWatcherIsEndedWithoutBlockingWriters) {
  StoreOptions o = Options();
  o.watch_queue_events = 3;
  Open(o);
  auto slow = store_->Watch("pods/", 0);
  auto fast = store_->Watch("pods/", 0);
  ASSERT_TRUE(slow.ok());
  ASSERT_TRUE(fast.ok());
  std::atomic<int> fast_seen{0};
  std::thread reader([&] {
    StoreEvent e;
    while (fast_seen < 20 && fast.value()->Next(&e, 5000ms)) ++fast_seen;
  });
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(store_->Create("pods/default/p" + std::to_string(i), Pod("p")).ok());
    // Give the fast reader a moment so it keeps up (it may still lag; that's allowed up to 3).
    for (int k = 0; k < 200 && fast_seen < i + 1; ++k) std::this_thread::sleep_for(1ms);
  }
  reader.join();
  EXPECT_EQ(fast_seen.load(), 20);
  EXPECT_FALSE(fast.value()->Done());
  auto events = Drain(slow.value().get(), 100, 100ms);
  EXPECT_EQ(events.size(), 3u) << "the slow watcher gets what was queued, then ends";
  EXPECT_TRUE(slow.value()->Done());
  EXPECT_NE(slow.value()->EndReason().find("fell behind"), std::string::npos);
  // It resumes from the last revision it saw, as a Kubernetes client re-watches.
  auto resumed = store_->Watch("pods/", events.back().revision);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(Drain(resumed.value().get(), 100, 100ms).size(), 17u);
}

TEST_F(StoreTest, CancelAndCloseEndWatches) {
  Open();
  auto w = store_->Watch("pods/", 0);
  ASSERT_TRUE(w.ok());
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    StoreEvent e;
    w.value()->Next(&e, 10000ms);
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  w.value()->Cancel();
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_TRUE(w.value()->Done());
  EXPECT_EQ(w.value()->EndReason(), "cancelled");

  auto w2 = store_->Watch("pods/", 0);
  ASSERT_TRUE(w2.ok());
  store_.reset();
  EXPECT_TRUE(w2.value()->Done());
  EXPECT_EQ(w2.value()->EndReason(), "store closed");
  StoreEvent e;
  EXPECT_FALSE(w2.value()->Next(&e, 10ms));
}

TEST_F(StoreTest, ConcurrentWritersAndWatchersSeeEveryEventInOrder) {
  Open();
  constexpr int kWriters = 4, kPerWriter = 100, kWatchers = 5;
  std::vector<std::unique_ptr<WatchStream>> watches;
  for (int i = 0; i < kWatchers; ++i) {
    auto w = store_->Watch("pods/", 0);
    ASSERT_TRUE(w.ok());
    watches.push_back(std::move(w).value());
  }
  std::vector<std::thread> threads;
  std::vector<std::vector<uint64_t>> seen(kWatchers);
  for (int i = 0; i < kWatchers; ++i) {
    threads.emplace_back([&, i] {
      StoreEvent e;
      while (seen[i].size() < kWriters * kPerWriter && watches[i]->Next(&e, 5000ms)) seen[i].push_back(e.revision);
    });
  }
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerWriter; ++i) {
        std::string key = "pods/w" + std::to_string(t) + "/p" + std::to_string(i);
        EXPECT_TRUE(store_->Create(key, Pod("p")).ok());
        EXPECT_TRUE(store_->Get(key).has_value());
        store_->List("pods/w" + std::to_string(t) + "/");
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->Revision(), static_cast<uint64_t>(kWriters * kPerWriter));
  for (int i = 0; i < kWatchers; ++i) {
    ASSERT_EQ(seen[i].size(), static_cast<size_t>(kWriters * kPerWriter)) << "watcher " << i;
    for (size_t k = 0; k < seen[i].size(); ++k) EXPECT_EQ(seen[i][k], k + 1);
  }
}

TEST_F(StoreTest, RestartKeepsObjectsAndTheRevision) {
  StoreOptions o = Options();
  o.snapshot_every = 7;  // several snapshots plus a WAL tail
  Open(o);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(store_->Create("pods/default/p" + std::to_string(i), Pod("p")).ok());
  for (int i = 0; i < 30; i += 3) ASSERT_TRUE(store_->Delete("pods/default/p" + std::to_string(i), 0).ok());
  ASSERT_TRUE(store_->Update("pods/default/p1", Pod("p1", "v9"), 0).ok());
  auto before = store_->List("");
  uint64_t revision = store_->Revision();
  EXPECT_EQ(revision, 41u);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/snapshot"));

  Open(o);
  auto after = store_->List("");
  EXPECT_EQ(store_->Revision(), revision);
  EXPECT_EQ(after.keys, before.keys);
  EXPECT_EQ(after.items, before.items);
  EXPECT_EQ(store_->Get("pods/default/p1").value()["spec"]["image"], "v9");
  // History since the last snapshot came back from the WAL: a watch can resume in it.
  uint64_t compacted = store_->CompactedRevision();
  EXPECT_LE(compacted, revision);
  EXPECT_GE(compacted, revision - 7);
  auto w = store_->Watch("pods/", compacted);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(Drain(w.value().get(), 100, 100ms).size(), revision - compacted);
  auto r = store_->Create("pods/default/new", Pod("new"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value()["metadata"]["resourceVersion"], std::to_string(revision + 1));

  // An explicit snapshot, then restart with an empty WAL.
  ASSERT_TRUE(store_->Snapshot().ok());
  Open(o);
  EXPECT_EQ(store_->Revision(), revision + 1);
  EXPECT_EQ(store_->Size(), before.items.size() + 1);
  EXPECT_EQ(store_->CompactedRevision(), revision + 1);
  auto gone = store_->Watch("pods/", revision);
  EXPECT_FALSE(gone.ok());
}

TEST_F(StoreTest, CrashBetweenSnapshotAndWalTruncationReplaysNothingTwice) {
  Open();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store_->Create("pods/default/p" + std::to_string(i), Pod("p")).ok());
  ASSERT_TRUE(store_->Snapshot().ok());
  ASSERT_TRUE(store_->Delete("pods/default/p0", 0).ok());  // 6: replayed again, it would delete a missing key
  std::string old_wal = ReadFile(dir_ + "/wal");
  ASSERT_TRUE(store_->Snapshot().ok());
  ASSERT_TRUE(store_->Create("pods/default/p5", Pod("p")).ok());  // 7, the only record after the snapshot
  std::string tail = ReadFile(dir_ + "/wal");
  store_.reset();
  // As if the process died after the snapshot's rename but before the WAL was truncated.
  WriteFile(dir_ + "/wal", old_wal + tail);
  WriteFile(dir_ + "/snapshot.tmp", "half a snapshot");
  Open();
  EXPECT_EQ(store_->Revision(), 7u);
  EXPECT_EQ(store_->List("pods/").keys.size(), 5u);
  EXPECT_FALSE(store_->Get("pods/default/p0").has_value());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/snapshot.tmp"));
  auto w = store_->Watch("pods/", 6);
  ASSERT_TRUE(w.ok());
  auto events = Drain(w.value().get(), 10, 100ms);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].key, "pods/default/p5");
}

TEST_F(StoreTest, ASecondOpenOfTheSameDirectoryIsRefused) {
  Open();
  auto second = Store::Open(dir_, Options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.code(), StoreErrorCode::kIO);
  EXPECT_NE(second.error().message.find("in use"), std::string::npos);
}

TEST_F(StoreTest, TornTailRecordIsDiscardedAndLogged) {
  Open();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->Create("pods/default/p" + std::to_string(i), Pod("p")).ok());
  store_.reset();
  std::string wal = ReadFile(dir_ + "/wal");
  size_t good = wal.size();
  // A fourth record cut short, as a crash in the middle of write(2) leaves it.
  std::string record;
  wal::AppendRecord(R"({"op":"put","key":"pods/default/p3","rev":4,"obj":{}})", &record);
  WriteFile(dir_ + "/wal", wal + record.substr(0, record.size() - 5));

  Open();
  EXPECT_EQ(store_->Revision(), 3u);
  EXPECT_EQ(store_->Size(), 3u);
  EXPECT_FALSE(store_->Get("pods/default/p3").has_value());
  EXPECT_NE(Logs().find("torn tail"), std::string::npos) << Logs();
  EXPECT_EQ(std::filesystem::file_size(dir_ + "/wal"), good) << "the torn bytes are cut off";
  ASSERT_TRUE(store_->Create("pods/default/p3", Pod("p")).ok());
  Open();
  EXPECT_EQ(store_->Revision(), 4u);
  EXPECT_TRUE(store_->Get("pods/default/p3").has_value());
}

TEST_F(StoreTest, LastRecordWithBadChecksumOrZeroFillIsTorn) {
  Open();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->Create("pods/default/p" + std::to_string(i), Pod("p")).ok());
  store_.reset();
  std::string wal = ReadFile(dir_ + "/wal");
  wal[wal.size() - 3] ^= 0x55;  // inside the last record's payload
  WriteFile(dir_ + "/wal", wal + std::string(4096, '\0'));
  Open();
  EXPECT_EQ(store_->Revision(), 2u);
  EXPECT_FALSE(store_->Get("pods/default/p2").has_value());
  EXPECT_NE(Logs().find("torn tail"), std::string::npos);
}

TEST_F(StoreTest, CorruptRecordInTheMiddleIsRefused) {
  Open();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->Create("pods/default/p" + std::to_string(i), Pod("p")).ok());
  store_.reset();
  std::string wal = ReadFile(dir_ + "/wal");
  wal[wal::kHeaderBytes + 10] ^= 0x01;  // the first record's payload
  WriteFile(dir_ + "/wal", wal);
  auto r = Store::Open(dir_, Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.code(), StoreErrorCode::kIO);
  EXPECT_NE(r.error().message.find("corrupt in the middle"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("offset 0"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(dir_ + "/wal"), std::string::npos) << r.error().message;
  EXPECT_EQ(ReadFile(dir_ + "/wal"), wal) << "a refused open must not touch the files";
}

TEST_F(StoreTest, CorruptSnapshotIsRefused) {
  Open();
  ASSERT_TRUE(store_->Create("pods/default/a", Pod("a")).ok());
  ASSERT_TRUE(store_->Snapshot().ok());
  store_.reset();
  std::string snap = ReadFile(dir_ + "/snapshot");
  snap[snap.size() - 2] ^= 0x20;
  WriteFile(dir_ + "/snapshot", snap);
  auto r = Store::Open(dir_, Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.code(), StoreErrorCode::kIO);
  EXPECT_NE(r.error().message.find("snapshot"), std::string::npos);
}

TEST_F(StoreTest, DamagedWalNeverYieldsAStateThatWasNotWritten) {
  Open();
  std::vector<std::vector<json>> states = {{}};  // states[r]: every object after revision r
  for (int i = 0; i < 30; ++i) {
    std::string key = "pods/default/p" + std::to_string(i % 7);
    if (i % 5 == 4) {
      ASSERT_TRUE(store_->Delete(store_->List("pods/").keys.front(), 0).ok());
    } else if (store_->Get(key)) {
      ASSERT_TRUE(store_->Update(key, Pod(key, "v" + std::to_string(i)), 0).ok());
    } else {
      ASSERT_TRUE(store_->Create(key, Pod(key)).ok());
    }
    states.push_back(store_->List("").items);
  }
  store_.reset();
  const std::string original = ReadFile(dir_ + "/wal");
  std::vector<size_t> record_ends;  // byte offset just past each record
  for (size_t off = 0; off < original.size();) {
    uint32_t len = 0;
    for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(original[off + i]);
    off += wal::kHeaderBytes + len;
    record_ends.push_back(off);
  }
  ASSERT_EQ(record_ends.size(), 30u);
  const size_t last_record_start = record_ends[28];
  std::mt19937 rng(42);
  int opened = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::string damaged = original;
    size_t at = rng() % damaged.size();
    bool cut = trial % 3 == 0;
    if (cut) {
      damaged.resize(at);  // a crash mid-append: the whole records before `at` must come back
    } else {
      damaged[at] ^= static_cast<char>(1 + rng() % 255);  // damage: flip bits anywhere
    }
    WriteFile(dir_ + "/wal", damaged);
    auto r = Store::Open(dir_, Options());
    if (!r.ok()) {
      EXPECT_EQ(r.code(), StoreErrorCode::kIO);
      EXPECT_FALSE(cut) << "a cut is a torn tail and must open";
      ++refused;
      continue;
    }
    ++opened;
    uint64_t rev = r.value()->Revision();
    ASSERT_LT(rev, states.size());
    EXPECT_EQ(r.value()->List("").items, states[rev]) << "recovered revision " << rev;
    if (cut) {
      size_t whole = std::upper_bound(record_ends.begin(), record_ends.end(), at) - record_ends.begin();
      EXPECT_EQ(rev, whole) << "cut at " << at;
    } else {
      EXPECT_GE(at, last_record_start) << "damage before the last record must be refused, not read as a torn tail";
    }
  }
  EXPECT_GT(opened, 0);
  EXPECT_GT(refused, 0);
}

TEST(WalTest, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(wal::Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(wal::Crc32(""), 0u);
}

TEST(WalTest, ParseRecordsRoundTrips) {
  std::string data;
  wal::AppendRecord("one", &data);
  wal::AppendRecord("two", &data);
  auto r = wal::ParseRecords(data, "f");
  EXPECT_EQ(r.payloads, (std::vector<std::string>{"one", "two"}));
  EXPECT_FALSE(r.torn_tail);
  EXPECT_FALSE(r.corrupt_middle);
  EXPECT_EQ(r.good_bytes, data.size());
  auto torn = wal::ParseRecords(data + "\x05", "f");
  EXPECT_TRUE(torn.torn_tail);
  EXPECT_EQ(torn.payloads.size(), 2u);
  std::string bad_len = data;
  bad_len[0] = '\xff';
  bad_len[3] = '\x7f';  // an impossible length, with good records after it
  auto mid = wal::ParseRecords(bad_len, "f");
  EXPECT_TRUE(mid.corrupt_middle);
}

}  // namespace
}  // namespace meshwork::controlplane
