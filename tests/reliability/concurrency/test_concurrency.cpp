// Concurrency (its own executable, test_concurrency, labelled "concurrency", so that it can
// run under ThreadSanitizer alone):
//  - 8 threads doing mixed put/get/read_range/write_range/move/prefetch/evict/remove on
//    keys of their own (checked exactly against a model) and on shared keys (whole
//    self-validating versions), with an offloaded optimizer stepping and checkpointing in
//    another thread; then everything checked again after a reopen;
//  - a second process opening the store for writing is refused (FailedPrecondition naming
//    the lock holder's pid);
//  - a read-only process beside a writer reads only whole, committed versions.
// Seeds are printed; STRATA_CONCURRENCY_SEED=<seed> reruns one (STRATA_LONG_TESTS=1: ten
// times the operations).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/temp_dir.hpp"
#include "reliability/child_process.hpp"
#include "reliability/concurrency/self_check.hpp"
#include "strata/optimizer/offload.hpp"

namespace strata {
namespace {

using concurrency::check_version;
using concurrency::version_bytes;
using crash_loop::bytes_of;
using crash_loop::env_u64;
using Clock = std::chrono::steady_clock;


/// Reads `key` whole (any size) and checks it is one whole version; NotFound is fine.
Status read_shared(Store& s, const std::string& key) {
  std::vector<uint8_t> buf;
  Status st = s.get_alloc(key, [&](const TensorDesc& d) -> Result<void*> {
    buf.resize(d.nbytes());
    return static_cast<void*>(buf.data());
  });
  if (!st.ok()) return st;
  uint64_t seed;
  if (!check_version(buf, &seed)) return data_loss("shared key " + key + ": a torn or mixed version");
  return Status::OK();
}

struct Counts {
  std::atomic<uint64_t> ops{0}, notfound{0}, exhausted{0};
};

void worker(Store& s, int id, uint64_t seed, uint64_t nops, Counts& c,
            std::map<std::string, std::vector<uint8_t>>& model) {
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return rng() % n; };
  for (uint64_t i = 0; i < nops; ++i) {
    const bool shared = pick(3) == 0;
    const std::string key = shared ? "shared/" + std::to_string(pick(6))
                                   : "t" + std::to_string(id) + "/" + std::to_string(pick(4));
    auto own = model.find(key);
    const bool present = shared || own != model.end();
    const int op = present ? static_cast<int>(pick(9)) : 0;
    Status st;
    switch (op) {
      case 0: {  // put (overwrite), NVMe or host
        auto v = version_bytes(16 + pick(1200000), rng());
        PutOptions po;
        po.overwrite = true;
        po.tier = pick(2) ? Tier::kHost : Tier::kNvme;
        st = s.put(key, v.data(), TensorDesc::bytes(v.size()), po);
        if (st.ok() && !shared) model[key] = std::move(v);
        break;
      }
      case 1:  // get
        if (shared) {
          st = read_shared(s, key);
        } else {
          std::vector<uint8_t> got(own->second.size());
          st = s.get_bytes(key, got.data(), got.size());
          if (st.ok() && got != own->second) st = data_loss(key + " reads back other bytes");
        }
        break;
      case 2:
        if (!shared) {  // write_range (own keys: concurrent ranges of one chunk are not allowed)
          auto& m = own->second;
          const uint64_t off = 16 + pick(m.size() - 16), len = 1 + pick(m.size() - off);
          auto w = bytes_of(len, rng());
          st = s.write_range(key, off, len, w.data());
          if (st.ok()) std::memcpy(m.data() + off, w.data(), len);
        } else {
          st = read_shared(s, key);
        }
        break;
      case 3:
        if (!shared) {  // read_range
          auto& m = own->second;
          const uint64_t off = pick(m.size()), len = 1 + pick(m.size() - off);
          std::vector<uint8_t> got(len);
          st = s.read_range(key, off, len, got.data());
          if (st.ok() && std::memcmp(got.data(), m.data() + off, len) != 0)
            st = data_loss(key + " read_range reads other bytes");
        } else {
          st = read_shared(s, key);
        }
        break;
      case 4: st = s.move(key, pick(2) ? Tier::kHost : Tier::kNvme); break;
      case 5: st = s.prefetch(key); break;
      case 6: st = s.evict(key); break;
      case 7:
        st = s.remove(key);
        if (st.ok() && !shared) model.erase(key);
        break;
      case 8: st = i % 16 == 8 ? s.flush() : s.prefetch(key); break;
    }
    ++c.ops;
    // Shared keys may be removed by another thread at any moment; a host-tier budget may be
    // momentarily all in use by the other threads' transfers.
    if (shared && st.code() == StatusCode::kNotFound) {
      ++c.notfound;
      continue;
    }
    if (st.code() == StatusCode::kResourceExhausted) {
      ++c.exhausted;
      continue;
    }
    ASSERT_TRUE(st.ok()) << "thread " << id << " op " << i << " (" << op << ") on " << key << ": "
                         << st.to_string();
  }
}

void check_all(Store& s, const std::vector<std::map<std::string, std::vector<uint8_t>>>& models) {
  for (auto& m : models) {
    for (auto& [k, v] : m) {
      std::vector<uint8_t> got(v.size());
      Status st = s.get_bytes(k, got.data(), got.size());
      ASSERT_TRUE(st.ok()) << k << ": " << st.to_string();
      EXPECT_TRUE(got == v) << k;
    }
  }
  for (auto& info : s.list("shared/")) {
    Status st = read_shared(s, info.key);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  auto v = s.verify();
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->errors.empty()) << v->errors.front().to_string();
}

TEST(Concurrency, MixedOperationsOnSharedAndDistinctKeysWithAnOptimizerStepping) {
  const uint64_t base = env_u64("STRATA_CONCURRENCY_SEED", std::random_device{}());
  const uint64_t nops = 400 * (env_u64("STRATA_LONG_TESTS", 0) ? 10 : 1);
  std::printf("[concurrency] seed %llu (STRATA_CONCURRENCY_SEED)\n", static_cast<unsigned long long>(base));
  testing::TempDir dir;
  StoreOptions o = crash_loop::store_options(dir.path() + "/store");
  o.worker_threads = 4;
  auto r = Store::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::shared_ptr<Store> store = std::move(r).value();
  auto opt_r = optimizer::OffloadedOptimizer::create(
      store, *optimizer::builtin_rule_factory("adam"), {{"lr", 1e-3}}, crash_loop::offload_options());
  ASSERT_TRUE(opt_r.ok()) << opt_r.status().to_string();
  auto& opt = **opt_r;
  std::vector<std::vector<float>> grads;
  ASSERT_TRUE(crash_loop::add_two_params(opt, grads).ok());
  constexpr int kThreads = 8;
  Counts counts;
  std::vector<std::map<std::string, std::vector<uint8_t>>> models(kThreads);
  std::atomic<bool> done{false};
  std::atomic<int64_t> steps{0};
  Status opt_status;
  std::thread stepper([&] {
    while (!done.load()) {
      auto st = opt.step();
      if (!st.ok()) {
        opt_status = st.status();
        return;
      }
      if (++steps % 10 == 0) {
        Status c = opt.checkpoint();
        if (!c.ok()) {
          opt_status = c;
          return;
        }
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { worker(*store, t, base + t, nops, counts, models[t]); });
  }
  for (auto& t : threads) t.join();
  done = true;
  stepper.join();
  ASSERT_TRUE(opt_status.ok()) << opt_status.to_string();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(opt.checkpoint().ok());
  EXPECT_EQ(*opt.step_count(0), steps.load());
  ASSERT_TRUE(store->flush().ok());
  check_all(*store, models);
  std::printf("[concurrency] %d threads, %llu operations (%llu NotFound on shared keys, %llu "
              "ResourceExhausted: host tier busy), %lld optimizer steps alongside\n",
              kThreads, static_cast<unsigned long long>(counts.ops.load()),
              static_cast<unsigned long long>(counts.notfound.load()),
              static_cast<unsigned long long>(counts.exhausted.load()),
              static_cast<long long>(steps.load()));
  opt_r->reset();
  ASSERT_TRUE(store->close().ok());
  auto again = Store::open(o);
  ASSERT_TRUE(again.ok());
  check_all(**again, models);
}

TEST(Concurrency, SecondWriterProcessIsRefused) {
  testing::TempDir dir;
  StoreOptions o = crash_loop::store_options(dir.path() + "/store");
  auto r = Store::open(o);
  ASSERT_TRUE(r.ok());
  reliability::ChildProcess child({STRATA_STORE_READER_CHILD, "open-rw", o.path}, dir.path() + "/err");
  ASSERT_TRUE(child.ok());
  std::string line;
  ASSERT_TRUE(child.read_line(line, Clock::now() + std::chrono::seconds(60))) << child.stderr_text();
  EXPECT_EQ(line, "refused FailedPrecondition: store " + o.path + " is locked by pid " +
                      std::to_string(::getpid()));
  EXPECT_EQ(child.wait(), 0);
}

// A writer overwrites, removes and re-puts "ro/" keys (NVMe puts committed at once, host-tier
// puts when a flush or an LRU eviction writes them back) and rewrites "ro/w" whole with
// write_range (committed only by the flushes after some of them; the others are replaced
// before any flush). The reader must see whole versions, and of ro/w only flushed ones.
TEST(Concurrency, ReadOnlyProcessBesideAWriterSeesOnlyCommittedVersions) {
  testing::TempDir dir;
  StoreOptions o = crash_loop::store_options(dir.path() + "/store");
  auto r = Store::open(o);
  ASSERT_TRUE(r.ok());
  Store& s = **r;
  std::map<std::string, std::set<uint64_t>> committed;
  std::mt19937_64 rng(env_u64("STRATA_CONCURRENCY_SEED", 4242));
  auto put = [&](const std::string& k, Tier tier) {
    const uint64_t seed = rng();
    auto v = version_bytes(16 + rng() % 2500000, seed);
    PutOptions po;
    po.overwrite = true;
    po.tier = tier;
    ASSERT_TRUE(s.put(k, v.data(), TensorDesc::bytes(v.size()), po).ok());
    committed[k].insert(seed);  // a host version may be committed by an eviction at any time
  };
  for (int j = 0; j < 4; ++j) put("ro/" + std::to_string(j), Tier::kNvme);
  const uint64_t wsize = 3 << 20;
  {
    auto v = version_bytes(wsize, 1);
    ASSERT_TRUE(s.put("ro/w", v.data(), TensorDesc::bytes(wsize)).ok());
    committed["ro/w"].insert(1);
  }
  ASSERT_TRUE(s.flush().ok());
  reliability::ChildProcess child({STRATA_STORE_READER_CHILD, "read", o.path, "3000"}, dir.path() + "/err");
  ASSERT_TRUE(child.ok());
  const auto end = Clock::now() + std::chrono::milliseconds(2500);
  uint64_t writes = 0;
  while (Clock::now() < end) {
    const int what = static_cast<int>(rng() % 6);
    const std::string k = "ro/" + std::to_string(rng() % 4);
    ++writes;
    if (what == 1) {
      put(k, Tier::kHost);
    } else if (what == 2) {
      Status st = s.remove(k);
      ASSERT_TRUE(st.ok() || st.code() == StatusCode::kNotFound) << st.to_string();
    } else if (what == 3) {
      const uint64_t seed = rng();
      auto v = version_bytes(wsize, seed);
      ASSERT_TRUE(s.write_range("ro/w", 0, wsize, v.data()).ok());
      if (rng() % 2) {
        ASSERT_TRUE(s.flush().ok());
        committed["ro/w"].insert(seed);
      }
    } else {
      put(k, Tier::kNvme);
    }
    if (HasFatalFailure()) return;
  }
  std::string line;
  uint64_t seen = 0;
  std::string result;
  while (child.read_line(line, Clock::now() + std::chrono::seconds(60))) {
    if (line.rfind("seen ", 0) == 0) {
      auto sp = line.find(' ', 5);
      const std::string key = line.substr(5, sp - 5);
      const uint64_t seed = std::stoull(line.substr(sp + 1));
      EXPECT_TRUE(committed[key].count(seed)) << key << " version " << seed << " was never committed";
      ++seen;
    } else if (line.rfind("reads ", 0) == 0) {
      result = line;
    } else {
      ADD_FAILURE() << line;
    }
  }
  EXPECT_EQ(child.wait(), 0) << child.stderr_text();
  EXPECT_FALSE(result.empty());
  EXPECT_GT(seen, 4u);
  std::printf("[concurrency] read-only process: %s, %llu distinct committed versions seen, %llu "
              "writer operations\n",
              result.c_str(), static_cast<unsigned long long>(seen), static_cast<unsigned long long>(writes));
}

}  // namespace
}  // namespace strata
