// Faults injected at the I/O engine's system-call boundary (store/src/io_fault.hpp), on a
// real store over both engines: ENOSPC and EIO on write, EIO on read, short reads and
// writes, EINTR/EAGAIN on submission and completion, fdatasync failing, io_uring_setup
// refused (ENOSYS/EPERM), O_DIRECT refused (EINVAL). For each: the documented error (or the
// documented retry), the store still usable, the objects committed before intact, also
// after a reopen. Each test prints "[io faults] <engine> <fault>: <n> injected -> <outcome>".
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "common/temp_dir.hpp"
#include "reliability/crash_loop.hpp"
#include "reliability/fault_injector.hpp"

namespace strata {
namespace {

using crash_loop::bytes_of;
using reliability::FaultInjector;
using reliability::FaultRule;
using reliability::Site;

const char* engine_name(EngineKind k) { return k == EngineKind::kUring ? "uring" : "threads"; }

void report(EngineKind k, const std::string& fault, uint64_t n, const std::string& outcome) {
  std::printf("[io faults] %s %s: %llu injected -> %s\n", engine_name(k), fault.c_str(),
              static_cast<unsigned long long>(n), outcome.c_str());
}

class IoFaults : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    opts_ = crash_loop::store_options(dir_.path() + "/store");
    opts_.engine_options.kind = GetParam();
    opts_.engine_options.allow_threads_fallback = false;
    auto r = Store::open(opts_);
    if (!r.ok() && GetParam() == EngineKind::kUring &&
        r.status().code() == StatusCode::kUnavailable) {
      GTEST_SKIP() << "io_uring unavailable: " << r.status().to_string();
    }
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    store_ = std::move(r).value();
    // Committed before any fault: several chunks with an odd tail, one aligned chunk, a
    // small object, and a flushed write_range.
    base_ = {{"base/0", bytes_of((3 << 20) + 5, 1)},
             {"base/1", bytes_of(1 << 20, 2)},
             {"base/2", bytes_of(777, 3)}};
    for (auto& [k, v] : base_) ASSERT_TRUE(put(k, v).ok());
    auto w = bytes_of(300000, 4);
    ASSERT_TRUE(store_->write_range("base/0", 1000000, w.size(), w.data()).ok());
    std::memcpy(base_["base/0"].data() + 1000000, w.data(), w.size());
    ASSERT_TRUE(store_->flush().ok());
  }

  Status put(const std::string& key, const std::vector<uint8_t>& v, bool overwrite = false) {
    PutOptions po;
    po.overwrite = overwrite;
    return store_->put(key, v.data(), TensorDesc::bytes(v.size()), po);
  }

  /// Every committed object reads back bit-exact, and verify() is clean.
  void expect_intact() {
    for (auto& [k, v] : base_) {
      std::vector<uint8_t> got(v.size());
      Status st = store_->get_bytes(k, got.data(), got.size());
      ASSERT_TRUE(st.ok()) << k << ": " << st.to_string();
      EXPECT_TRUE(got == v) << k << " differs";
    }
    auto rep = store_->verify();
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    EXPECT_TRUE(rep->errors.empty()) << rep->errors.front().to_string();
  }

  /// A new object goes in and comes back; then close, reopen, and everything is intact.
  void expect_usable_and_durable() {
    auto x = bytes_of((2 << 20) + 123, 99);
    ASSERT_TRUE(put("fresh", x).ok());
    base_["fresh"] = x;
    expect_intact();
    ASSERT_TRUE(store_->close().ok());
    auto r = Store::open(opts_);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    store_ = std::move(r).value();
    expect_intact();
    EXPECT_EQ(store_->list().size(), base_.size());
  }

  testing::TempDir dir_;
  StoreOptions opts_;
  std::unique_ptr<Store> store_;
  std::map<std::string, std::vector<uint8_t>> base_;
};

// A write error fails the put (nothing of it visible) and the write_range (the object
// reads as before), naming the key, the data file and the errno; ENOSPC is ResourceExhausted.

TEST_P(IoFaults, EioAndEnospcOnWriteFailOnlyTheWritingCall) {
  for (auto [err, code] : {std::pair{EIO, StatusCode::kIoError},
                           std::pair{ENOSPC, StatusCode::kResourceExhausted}}) {
    const std::string fault = std::string(err == EIO ? "EIO" : "ENOSPC") + " on write";
    uint64_t n = 0;
    auto v = bytes_of(5 << 20, 10);
    const std::string key = "victim/" + std::to_string(err);
    {
      FaultInjector inj({{Site::kWrite, err, 3, 1}});
      Status st = put(key, v);
      n += inj.injected();
      ASSERT_EQ(inj.injected(), 1u);
      EXPECT_EQ(st.code(), code) << st.to_string();
      EXPECT_EQ(st.sys_errno(), err) << st.to_string();
      EXPECT_NE(st.message().find(inj.last_path()), std::string::npos) << st.to_string();
      EXPECT_NE(st.message().find(key), std::string::npos) << st.to_string();
      EXPECT_FALSE(store_->contains(key));
    }
    {
      FaultInjector inj({{Site::kWrite, err, 1, 1}});
      auto w = bytes_of(1500000, 11);
      Status st = store_->write_range("base/0", 700000, w.size(), w.data());
      n += inj.injected();
      ASSERT_EQ(inj.injected(), 1u);
      EXPECT_EQ(st.code(), code) << st.to_string();
      EXPECT_EQ(st.sys_errno(), err) << st.to_string();
      EXPECT_NE(st.message().find("base/0"), std::string::npos) << st.to_string();
    }
    expect_intact();
    ASSERT_TRUE(put(key, v).ok());  // the same put succeeds once the fault is gone
    base_[key] = v;
    report(GetParam(), fault, n, "put and write_range fail with " + std::string(status_code_name(code)) +
                                     " errno " + std::to_string(err) + "; earlier data intact");
  }
  expect_usable_and_durable();
}

TEST_P(IoFaults, EioOnReadFailsTheReadNamingKeyPathAndOffset) {
  FaultInjector inj({{Site::kRead, EIO, 2, 1}});
  std::vector<uint8_t> got(base_["base/0"].size());
  Status st = store_->get_bytes("base/0", got.data(), got.size());
  ASSERT_EQ(inj.injected(), 1u);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  EXPECT_EQ(st.sys_errno(), EIO) << st.to_string();
  EXPECT_NE(st.message().find("base/0"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find(inj.last_path()), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("offset"), std::string::npos) << st.to_string();
  report(GetParam(), "EIO on read", inj.injected(), "get fails with IoError errno EIO; a retry reads the data");
  expect_intact();  // the next read succeeds
  expect_usable_and_durable();
}

TEST_P(IoFaults, ShortReadsAndWritesAreContinued) {
  FaultInjector inj({{Site::kWrite, 0, 2, 100000}, {Site::kRead, 0, 2, 100000}});
  for (int i = 0; i < 4; ++i) {
    auto v = bytes_of((1 << 20) * i + 4096 * i + 13, 20 + i);
    std::string k = "short/" + std::to_string(i);
    ASSERT_TRUE(put(k, v).ok());
    base_[k] = v;
  }
  auto w = bytes_of(1234567, 30);
  ASSERT_TRUE(store_->write_range("base/0", 4097, w.size(), w.data()).ok());
  std::memcpy(base_["base/0"].data() + 4097, w.data(), w.size());
  ASSERT_TRUE(store_->flush().ok());
  expect_intact();
  EXPECT_GT(inj.injected(0), 10u);
  EXPECT_GT(inj.injected(1), 10u);
  report(GetParam(), "short write", inj.injected(0), "continued, bytes exact");
  report(GetParam(), "short read", inj.injected(1), "continued, bytes exact");
  expect_usable_and_durable();
}

TEST_P(IoFaults, EintrAndEagainAreRetried) {
  std::vector<FaultRule> rules = {{Site::kRead, EINTR, 3, 100000},
                                  {Site::kWrite, EAGAIN, 3, 100000},
                                  {Site::kSync, EINTR, 2, 100000}};
  if (GetParam() == EngineKind::kUring) {
    rules.push_back({Site::kSubmit, EINTR, 2, 100000});
    rules.push_back({Site::kSubmit, EAGAIN, 3, 100000});
  }
  FaultInjector inj(rules);
  for (int i = 0; i < 3; ++i) {
    auto v = bytes_of((1 << 20) * (i + 1) + 99, 40 + i);
    std::string k = "retry/" + std::to_string(i);
    ASSERT_TRUE(put(k, v).ok());
    base_[k] = v;
  }
  auto w = bytes_of(2000000, 50);
  ASSERT_TRUE(store_->write_range("base/0", 12345, w.size(), w.data()).ok());
  std::memcpy(base_["base/0"].data() + 12345, w.data(), w.size());
  ASSERT_TRUE(store_->flush().ok());
  expect_intact();
  const char* names[] = {"EINTR on read", "EAGAIN on write", "EINTR on fdatasync",
                         "EINTR on submission", "EAGAIN on submission"};
  for (size_t i = 0; i < rules.size(); ++i) {
    EXPECT_GT(inj.injected(i), 0u) << names[i];
    report(GetParam(), names[i], inj.injected(i), "retried, bytes exact");
  }
  expect_usable_and_durable();
}

// An fdatasync interrupted (EINTR) is attempted again, not taken as done (the thread
// engine once reported the interrupted call as a successful sync).
TEST_P(IoFaults, EintrOnFdatasyncIsRetriedNotTakenAsDone) {
  auto f = store_->engine()->open(dir_.path() + "/sync_probe", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  FaultInjector inj({{Site::kSync, EINTR, 1, 1}});
  ASSERT_TRUE(store_->engine()->sync_async(*f).result().ok());
  EXPECT_EQ(inj.injected(), 1u);
  EXPECT_EQ(inj.seen(Site::kSync), 2u) << "the interrupted fdatasync was not attempted again";
}

TEST_P(IoFaults, FdatasyncFailureFailsTheCommitAndARetryCommits) {
  auto v = bytes_of(3 << 20, 60);
  uint64_t n = 0;
  {
    FaultInjector inj({{Site::kSync, EIO, 1, 1}});
    Status st = put("victim", v);
    n += inj.injected();
    ASSERT_EQ(inj.injected(), 1u);
    EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
    EXPECT_EQ(st.sys_errno(), EIO) << st.to_string();
    EXPECT_NE(st.message().find("fdatasync"), std::string::npos) << st.to_string();
    EXPECT_FALSE(store_->contains("victim"));
  }
  // A flush whose fdatasync fails: the write_range stays pending, a second flush commits.
  auto w = bytes_of(600000, 61);
  ASSERT_TRUE(store_->write_range("base/1", 100, w.size(), w.data()).ok());
  {
    FaultInjector inj({{Site::kSync, EIO, 1, 1}});
    Status st = store_->flush();
    n += inj.injected();
    ASSERT_EQ(inj.injected(), 1u);
    EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
    EXPECT_EQ(st.sys_errno(), EIO) << st.to_string();
  }
  FaultInjector count({});
  ASSERT_TRUE(store_->flush().ok());
  EXPECT_GE(count.seen(Site::kSync), 1u) << "the retried commit must fdatasync again";
  std::memcpy(base_["base/1"].data() + 100, w.data(), w.size());
  expect_intact();
  ASSERT_TRUE(put("victim", v).ok());
  base_["victim"] = v;
  report(GetParam(), "EIO on fdatasync", n,
         "put and flush fail with IoError errno EIO, nothing committed; the retry syncs and commits");
  expect_usable_and_durable();
}

INSTANTIATE_TEST_SUITE_P(Engines, IoFaults,
                         ::testing::Values(EngineKind::kUring, EngineKind::kThreads),
                         [](const auto& info) { return std::string(engine_name(info.param)); });

// io_uring_setup refused (ENOSYS: an old kernel; EPERM: io_uring_disabled or seccomp): the
// store runs on the thread engine (one warning), or open is Unavailable without the fallback.
TEST(IoFaultsOpen, IoUringUnavailableFallsBackToThreads) {
  for (int err : {ENOSYS, EPERM}) {
    testing::TempDir dir;
    StoreOptions o = crash_loop::store_options(dir.path() + "/store");
    o.engine_options.allow_threads_fallback = false;
    FaultInjector inj({{Site::kSetup, err, 1, 1000}});
    auto strict = Store::open(o);
    ASSERT_FALSE(strict.ok());
    EXPECT_EQ(strict.status().code(), StatusCode::kUnavailable) << strict.status().to_string();
    EXPECT_EQ(strict.status().sys_errno(), err) << strict.status().to_string();
    o.engine_options.allow_threads_fallback = true;
    auto r = Store::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)->engine()->kind(), EngineKind::kThreads);
    auto v = bytes_of((2 << 20) + 1, 70);
    ASSERT_TRUE((*r)->put("x", v.data(), TensorDesc::bytes(v.size())).ok());
    std::vector<uint8_t> got(v.size());
    ASSERT_TRUE((*r)->get_bytes("x", got.data(), got.size()).ok());
    EXPECT_TRUE(got == v);
    ASSERT_TRUE((*r)->close().ok());
    report(EngineKind::kUring, std::string("io_uring_setup ") + (err == ENOSYS ? "ENOSYS" : "EPERM"),
           inj.injected(), "Unavailable without the fallback; thread engine with it, bytes exact");
  }
}

// O_DIRECT refused (EINVAL, as tmpfs does): buffered I/O with one warning, or open fails
// with InvalidArgument naming the data file without the fallback. The data stays readable.
TEST(IoFaultsOpen, ODirectRefusedFallsBackToBufferedIo) {
  testing::TempDir dir;
  StoreOptions o = crash_loop::store_options(dir.path() + "/store");
  auto v = bytes_of((3 << 20) + 17, 80);
  {
    auto r = Store::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE((*r)->put("before", v.data(), TensorDesc::bytes(v.size())).ok());
    ASSERT_TRUE((*r)->close().ok());
  }
  uint64_t n = 0;
  {
    FaultInjector inj({{Site::kOpenDirect, EINVAL, 1, 1000}});
    o.engine_options.allow_buffered_fallback = false;
    auto strict = Store::open(o);
    ASSERT_FALSE(strict.ok());
    EXPECT_EQ(strict.status().code(), StatusCode::kInvalidArgument) << strict.status().to_string();
    EXPECT_EQ(strict.status().sys_errno(), EINVAL) << strict.status().to_string();
    EXPECT_NE(strict.status().message().find(inj.last_path()), std::string::npos)
        << strict.status().to_string();
    o.engine_options.allow_buffered_fallback = true;
    auto r = Store::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::vector<uint8_t> got(v.size());
    ASSERT_TRUE((*r)->get_bytes("before", got.data(), got.size()).ok());
    EXPECT_TRUE(got == v);
    auto w = bytes_of(1 << 20, 81);
    ASSERT_TRUE((*r)->put("buffered", w.data(), TensorDesc::bytes(w.size())).ok());
    ASSERT_TRUE((*r)->close().ok());
    n = inj.injected();
    EXPECT_GE(n, 2u);
  }
  auto r = Store::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto rep = (*r)->verify();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->errors.empty());
  EXPECT_EQ(rep->objects, 2u);
  report(EngineKind::kUring, "open(O_DIRECT) EINVAL", n,
         "InvalidArgument without the fallback; buffered I/O with it, bytes exact");
}

}  // namespace
}  // namespace strata
