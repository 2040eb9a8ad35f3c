// Store durability: reopen, SIGKILL mid-stream of puts, copy-on-write ranges across a crash,
// lock file, checksum mismatches, ENOSPC, striping over several directories, read-only.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "strata/base/units.hpp"
#include "store/test_io_util.hpp"
#include "test_store_util.hpp"

extern char** environ;

namespace strata {
namespace {

using namespace store_test;
namespace fs = std::filesystem;

/// A child process running the crash helper with its stdout on a pipe.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  Child(const std::vector<std::string>& args) {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    std::vector<char*> argv;
    std::string exe = STRATA_STORE_CRASH_HELPER;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(p[1]);
    out = ::fdopen(p[0], "r");
  }
  /// Next line of the child's stdout ("" at EOF).
  std::string line() {
    char buf[256];
    if (!std::fgets(buf, sizeof buf, out)) return "";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void kill9() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      pid = -1;
    }
  }
  ~Child() {
    kill9();
    if (out) std::fclose(out);
  }
};

TEST(StoreDurability, ReopenReadsBackBitExact) {
  TempDir d;
  const TensorDesc f32{DType::kFloat32, {3, 1000, 501}};  // 6,012,000 bytes: 6 chunks
  const TensorDesc bf16{DType::kBFloat16, {17}};
  auto a = pattern(f32.nbytes(), 1), b = pattern(bf16.nbytes(), 2), c = pattern(5000, 3);
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("model/layer 1/w", a.data(), f32));
    ASSERT_OK(s->put("model/ß", b.data(), bf16, {Tier::kHost}));  // dirty until close
    ASSERT_OK(s->put("empty", nullptr, TensorDesc{DType::kInt8, {0, 4}}));
    ASSERT_OK(s->put("gone", c.data(), TensorDesc::bytes(5000)));
    ASSERT_OK(s->remove("gone"));
    ASSERT_OK(s->close());
    EXPECT_EQ(s->put("x", c.data(), TensorDesc::bytes(1)).code(),
              StatusCode::kFailedPrecondition);
  }
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  auto l = s->list();
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].key, "empty");
  EXPECT_EQ(l[0].shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(l[1].key, "model/layer 1/w");
  EXPECT_EQ(l[1].dtype, DType::kFloat32);
  EXPECT_EQ(l[1].shape, (std::vector<int64_t>{3, 1000, 501}));
  EXPECT_EQ(l[1].num_chunks, 6u);
  EXPECT_EQ(l[2].key, "model/ß");
  EXPECT_EQ(l[2].tier, Tier::kNvme);
  EXPECT_FALSE(l[2].dirty);
  std::vector<uint8_t> out(f32.nbytes());
  ASSERT_OK(s->get("model/layer 1/w", out.data(), f32));
  EXPECT_EQ(out, a);
  out.resize(bf16.nbytes());
  ASSERT_OK(s->get("model/ß", out.data(), bf16));
  EXPECT_EQ(out, b);
  EXPECT_EQ(s->stat("gone").status().code(), StatusCode::kNotFound);
  auto v = s->verify();
  ASSERT_OK(v);
  EXPECT_EQ(v->objects, 3u);
  EXPECT_EQ(v->chunks, 7u);
  EXPECT_EQ(v->bytes, f32.nbytes() + bf16.nbytes());
  EXPECT_TRUE(v->errors.empty());
  // Space of removed/overwritten objects is reused, never leaked across reopen.
  EXPECT_EQ(s->usage().nvme_bytes, align_up(f32.nbytes() % (1 << 20), 4096) + 5 * (1 << 20) + 4096);
}

TEST(StoreDurability, SigkillMidStreamLeavesOnlyCompletePuts) {
  TempDir d;
  uint64_t last = 0;
  {
    Child c({d.path()});
    for (int i = 0; i < 25; ++i) {
      std::string s = c.line();
      ASSERT_FALSE(s.empty()) << "helper died early";
      last = std::stoull(s);
    }
    // Land the kill somewhere inside the next put.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    c.kill9();
  }
  auto s = open_or_die(small_options(d.path()));  // the lock died with the process
  ASSERT_TRUE(s);
  auto l = s->list("obj/");
  ASSERT_GE(l.size(), last + 1);
  ASSERT_LE(l.size(), last + 2);  // at most the put in flight, complete
  for (auto& info : l) {
    uint64_t i = std::stoull(info.key.substr(4));
    uint64_t n = 1 + (i * 392761) % (2400 * 1024);
    ASSERT_EQ(info.nbytes, n) << info.key;
    std::vector<uint8_t> out(n);
    ASSERT_OK(s->get_bytes(info.key, out.data(), n));
    EXPECT_EQ(out, pattern(n, i)) << info.key;
  }
  auto v = s->verify();
  ASSERT_OK(v);
  EXPECT_TRUE(v->errors.empty());
  // The store keeps working after the crash: new puts reuse the orphaned space.
  auto x = pattern(3 << 20, 99);
  ASSERT_OK(s->put("after", x.data(), TensorDesc::bytes(x.size())));
  expect_reads_back(*s, "after", x);
}

TEST(StoreDurability, LockedByAnotherProcessAndSiblingsDoNotCollide) {
  TempDir d;
  fs::create_directories(d.sub("a"));
  Child c({d.sub("a"), "lock"});
  ASSERT_EQ(c.line(), "locked");
  auto r = Store::open(small_options(d.sub("a")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("is locked by pid " + std::to_string(c.pid)),
            std::string::npos)
      << r.status().message();
  // A sibling store next to it, even sharing an NVMe directory, is independent.
  auto o = small_options(d.sub("b"));
  o.nvme_dirs = {d.sub("shared")};
  auto o2 = small_options(d.sub("c"));
  o2.nvme_dirs = {d.sub("shared")};
  auto sb = open_or_die(o);
  auto sc = open_or_die(o2);
  ASSERT_TRUE(sb && sc);
  auto x = pattern(100000, 1), y = pattern(100000, 2);
  ASSERT_OK(sb->put("k", x.data(), TensorDesc::bytes(x.size())));
  ASSERT_OK(sc->put("k", y.data(), TensorDesc::bytes(y.size())));
  expect_reads_back(*sb, "k", x);
  expect_reads_back(*sc, "k", y);
  // Same process, second writer: refused, saying it is this process's own open store.
  auto again = Store::open(o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.status().message(),
            "store " + o.path + " is already open in this process (pid " +
                std::to_string(::getpid()) +
                "): one Store per directory; share that Store object or close it first");
  // The lock dies with its holder.
  c.kill9();
  auto sa = Store::open(small_options(d.sub("a")));
  EXPECT_TRUE(sa.ok()) << sa.status().to_string();
}

std::string data_file(const std::string& dir) {
  for (auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind("strata-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".data") {
      return e.path().string();
    }
  }
  return "";
}

TEST(StoreDurability, ChecksumMismatchIsDataLossNamingKeyAndOffset) {
  TempDir d;
  const uint64_t n = (2u << 20) + 500000;  // 3 chunks
  auto a = pattern(n, 5), b = pattern(1000, 6);
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("victim", a.data(), TensorDesc::bytes(n)));
    ASSERT_OK(s->put("bystander", b.data(), TensorDesc::bytes(1000)));
  }
  // The first object's chunks are the first extents of the (single) data file.
  std::string f = data_file(d.path());
  ASSERT_FALSE(f.empty());
  {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp((1u << 20) + 100);
    char ch = static_cast<char>(a[(1u << 20) + 100] ^ 0x5a);
    io.write(&ch, 1);
  }
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  std::vector<uint8_t> out(n);
  auto st = s->get_bytes("victim", out.data(), n);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("'victim'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("chunk 1 at object offset 1048576"), std::string::npos)
      << st.message();
  // Chunk 0 alone is intact; the other object too: the store stays usable.
  ASSERT_OK(s->read_range("victim", 0, 1u << 20, out.data()));
  std::vector<uint8_t> ob(1000);
  ASSERT_OK(s->get_bytes("bystander", ob.data(), 1000));
  EXPECT_EQ(ob, b);
  auto v = s->verify();
  ASSERT_OK(v);
  ASSERT_EQ(v->errors.size(), 1u);
  EXPECT_EQ(v->errors[0].code(), StatusCode::kDataLoss);
  EXPECT_EQ(v->chunks, 4u);
  s.reset();
  // Verification can be switched off: the bytes come back as stored.
  auto o = small_options(d.path());
  o.verify_checksums = false;
  auto s2 = open_or_die(o);
  ASSERT_TRUE(s2);
  ASSERT_OK(s2->get_bytes("victim", out.data(), n));
  EXPECT_EQ(out[(1u << 20) + 100], a[(1u << 20) + 100] ^ 0x5a);
  out[(1u << 20) + 100] ^= 0x5a;
  EXPECT_EQ(out, a);
}

TEST(StoreDurability, WriteRangeIsCopyOnWriteUntilFlush) {
  TempDir d;
  const uint64_t n = 3u << 20;
  auto a = pattern(n, 40), w = pattern(1500000, 41);
  auto patched = a;
  std::copy(w.begin(), w.end(), patched.begin() + 1000);
  {
    // The helper puts "state" and "state2" (= a), patches both with write_range, flushes
    // only after patching "state2", patches "state" again... see store_crash_helper.cpp.
    Child c({d.path(), "cow"});
    ASSERT_EQ(c.line(), "written");
    c.kill9();
  }
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  std::vector<uint8_t> out(n);
  ASSERT_OK(s->get_bytes("state", out.data(), n));
  EXPECT_EQ(out, a);  // the unflushed write_range is gone, the old chunks intact
  ASSERT_OK(s->get_bytes("state2", out.data(), n));
  EXPECT_EQ(out, patched);  // flushed: durable
  auto v = s->verify();
  ASSERT_OK(v);
  EXPECT_TRUE(v->errors.empty());
}

TEST(StoreDurability, NoSpaceOnDirectoryIsResourceExhaustedWithEnospc) {
  strata::testing::MountedDir tmpfs("tmpfs", 0, "size=2m", "tiny");
  if (!tmpfs.ok()) GTEST_SKIP() << tmpfs.why();
  const std::string& mnt = tmpfs.path();
  auto o = small_options(tmpfs.parent().sub("root"), mnt);
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    auto big = pattern(3u << 20, 1);
    auto st = s->put("big", big.data(), TensorDesc::bytes(big.size()));
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
    EXPECT_EQ(st.sys_errno(), ENOSPC) << st.to_string();
    EXPECT_NE(st.message().find(mnt), std::string::npos) << st.message();
    EXPECT_FALSE(s->contains("big"));
    // Usable afterwards: the failed put's space is free again.
    auto small = pattern(1u << 20, 2);
    ASSERT_OK(s->put("small", small.data(), TensorDesc::bytes(small.size())));
    expect_reads_back(*s, "small", small);
  }
}

TEST(StoreDurability, StripesOverSeveralDirectories) {
  TempDir d;
  auto o = small_options(d.sub("root"));
  o.nvme_dirs = {d.sub("nvme0"), d.sub("nvme1"), d.sub("nvme2")};
  const uint64_t n = (6u << 20) + 7;
  auto a = pattern(n, 50);
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("striped", a.data(), TensorDesc::bytes(n)));
    // 7 chunks over 3 directories: 3 + 2 + 2 extents, the last one 4 KiB.
    EXPECT_EQ(s->usage().nvme_bytes, (6u << 20) + 4096);
  }
  for (auto& dir : o.nvme_dirs) {
    std::string f = data_file(dir);
    ASSERT_FALSE(f.empty()) << dir;
    EXPECT_GE(fs::file_size(f), 2u << 20) << f;
  }
  auto bad = o;
  bad.nvme_dirs = {d.sub("nvme0")};
  auto r = Store::open(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  auto same = o;
  same.nvme_dirs.clear();  // recorded directories
  auto s = open_or_die(same);
  ASSERT_TRUE(s);
  std::vector<uint8_t> out(n);
  ASSERT_OK(s->get_bytes("striped", out.data(), n));
  EXPECT_EQ(out, a);
}

TEST(StoreDurability, ReadOnlyAndListStore) {
  TempDir d;
  auto a = pattern(70000, 60);
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("ro/a", a.data(), TensorDesc{DType::kInt16, {35000}}));
    auto held = Store::open([&] {
      auto o = small_options(d.path());
      o.read_only = true;
      return o;
    }());
    ASSERT_TRUE(held.ok()) << held.status().to_string();  // readers do not need the lock
    auto l = list_store(d.path());
    ASSERT_OK(l);
    ASSERT_EQ(l->size(), 1u);
    EXPECT_EQ((*l)[0].shape, (std::vector<int64_t>{35000}));
  }
  auto o = small_options(d.path());
  o.read_only = true;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  expect_reads_back(*s, "ro/a", a);
  EXPECT_EQ(s->put("x", a.data(), TensorDesc::bytes(1)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->remove("ro/a").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(list_store(d.sub("none")).status().code(), StatusCode::kNotFound);
}

TEST(StoreDurability, OnFlushDurabilityCommitsAtFlush) {
  TempDir d;
  auto o = small_options(d.path());
  o.durability = Durability::kOnFlush;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto a = pattern(10000, 70);
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(s->put("f" + std::to_string(i), a.data(), TensorDesc::bytes(a.size())));
  }
  EXPECT_TRUE(s->stat("f3")->dirty);
  EXPECT_EQ(list_store(d.path())->size(), 0u);  // nothing committed yet
  ASSERT_OK(s->flush());
  EXPECT_FALSE(s->stat("f3")->dirty);
  EXPECT_EQ(list_store(d.path())->size(), 20u);
}

TEST(StoreDurability, HeldKeysAreCommittedOnlyByCommit) {
  // hold(): flush() and close() leave a held key's pending write_range and dirty memory
  // copy uncommitted (close drops them); commit() of the held keys commits them together.
  TempDir d;
  const uint64_t n = 3 * (1u << 20) / 2;
  auto a = pattern(n, 1), b = pattern(n, 2), c = pattern(4096, 3);
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_OK(s->put("held", a.data(), TensorDesc::bytes(n)));
    ASSERT_OK(s->put("free", a.data(), TensorDesc::bytes(n)));
    ASSERT_OK(s->hold({"held", "rec", "absent"}));
    ASSERT_OK(s->write_range("held", 0, n, b.data()));
    ASSERT_OK(s->write_range("free", 0, n, b.data()));
    ASSERT_OK(s->put("rec", c.data(), TensorDesc::bytes(4096), {Tier::kHost, false, true}));
    ASSERT_OK(s->flush());
    EXPECT_TRUE(s->stat("held")->dirty);
    EXPECT_TRUE(s->stat("rec")->dirty);
    EXPECT_FALSE(s->stat("free")->dirty);
    std::vector<uint8_t> out(n);
    ASSERT_OK(s->get_bytes("held", out.data(), n));
    EXPECT_EQ(out, b);  // reads see the pending bytes
    ASSERT_OK(s->close());
  }
  {
    auto s = open_or_die(small_options(d.path()));
    std::vector<uint8_t> out(n);
    ASSERT_OK(s->get_bytes("held", out.data(), n));
    EXPECT_EQ(out, a);  // dropped at close
    ASSERT_OK(s->get_bytes("free", out.data(), n));
    EXPECT_EQ(out, b);
    EXPECT_FALSE(s->contains("rec"));
    ASSERT_OK(s->hold({"held", "rec"}));
    ASSERT_OK(s->write_range("held", 0, n, b.data()));
    ASSERT_OK(s->put("rec", c.data(), TensorDesc::bytes(4096), {Tier::kHost, false, true}));
    ASSERT_OK(s->commit({"held", "rec", "held", "absent"}));
    EXPECT_FALSE(s->stat("held")->dirty);
    EXPECT_FALSE(s->stat("rec")->dirty);
    s->release({"held"});
    ASSERT_OK(s->write_range("held", 0, 4096, c.data()));
    ASSERT_OK(s->close());  // released: the close commits it
  }
  auto s = open_or_die(small_options(d.path()));
  std::vector<uint8_t> out(n), rec(4096);
  ASSERT_OK(s->get_bytes("held", out.data(), n));
  std::copy(c.begin(), c.end(), b.begin());
  EXPECT_EQ(out, b);
  ASSERT_OK(s->get_bytes("rec", rec.data(), 4096));
  EXPECT_EQ(rec, c);
  ASSERT_OK(s->close());
  EXPECT_EQ(s->hold({"x"}).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata
