// The store's data path is completion-driven: reads and write_range of NVMe objects are in
// flight at the engine all at once, however few worker threads the store has.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <sys/mman.h>

#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "test_store_util.hpp"

namespace strata {
namespace {

using store_test::open_or_die;
using store_test::pattern;
using store_test::small_options;
using store_test::TempDir;

/// An engine that holds every read and write while its gate is closed (counting them) and
/// passes them to a real engine when it opens. sync() and everything else pass at once.
class GatedEngine final : public IoEngine {
 public:
  explicit GatedEngine(std::shared_ptr<IoEngine> inner) : inner_(std::move(inner)) {}

  EngineKind kind() const override { return inner_->kind(); }
  const IoEngineOptions& options() const override { return inner_->options(); }
  Result<std::shared_ptr<IoFile>> open(const std::string& path, OpenMode mode) override {
    return inner_->open(path, mode);
  }
  Future<uint64_t> read_async(const std::shared_ptr<IoFile>& file, void* dst, uint64_t nbytes,
                              uint64_t offset) override {
    return hold(false, file, dst, nbytes, offset);
  }
  Future<uint64_t> write_async(const std::shared_ptr<IoFile>& file, const void* src, uint64_t nbytes,
                               uint64_t offset) override {
    return hold(true, file, const_cast<void*>(src), nbytes, offset);
  }
  Future<void> sync_async(const std::shared_ptr<IoFile>& file) override { return inner_->sync_async(file); }
  Status register_buffer(void* addr, uint64_t nbytes) override {
    return inner_->register_buffer(addr, nbytes);
  }
  Status unregister_buffer(void* addr) override { return inner_->unregister_buffer(addr); }
  void drain() override { inner_->drain(); }
  IoOccupancy occupancy() const override { return inner_->occupancy(); }

  void close_gate() {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  /// Passes every held request on and lets the later ones through.
  void open_gate() {
    std::deque<Held> held;
    {
      std::lock_guard<std::mutex> lk(mu_);
      closed_ = false;
      held.swap(held_);
    }
    for (auto& h : held) submit(h);
  }
  /// Waits (at most `timeout`) until at least `n` requests are held; returns how many are.
  size_t wait_held(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return held_.size() >= n; });
    return held_.size();
  }

 private:
  struct Held {
    bool write;
    std::shared_ptr<IoFile> file;
    void* buf;
    uint64_t nbytes, offset;
    std::shared_ptr<Promise<uint64_t>> promise;
  };
  Future<uint64_t> hold(bool write, const std::shared_ptr<IoFile>& file, void* buf,
                        uint64_t nbytes, uint64_t offset) {
    Held h{write, file, buf, nbytes, offset, std::make_shared<Promise<uint64_t>>()};
    Future<uint64_t> f = h.promise->future();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (closed_) {
        held_.push_back(std::move(h));
        cv_.notify_all();
        return f;
      }
    }
    submit(h);
    return f;
  }
  void submit(const Held& h) {
    Future<uint64_t> f = h.write ? inner_->write_async(h.file, h.buf, h.nbytes, h.offset)
                                 : inner_->read_async(h.file, h.buf, h.nbytes, h.offset);
    f.on_ready([p = h.promise](const Result<uint64_t>& r) { p->set(r); });
  }

  std::shared_ptr<IoEngine> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Held> held_;
  bool closed_ = false;
};

/// `n` bytes of 4 KiB-aligned memory (O_DIRECT straight into it), unmapped on destruction.
struct AlignedBytes {
  explicit AlignedBytes(size_t n) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~AlignedBytes() {
    if (data) ::munmap(data, size);
  }
  uint8_t* data;
  size_t size;
};

/// A store at `root` (small_options) with one worker thread over a GatedEngine (*gate).
std::unique_ptr<Store> open_gated(const std::string& root, std::shared_ptr<GatedEngine>* gate) {
  auto inner = IoEngine::create(IoEngineOptions{});
  EXPECT_TRUE(inner.ok()) << inner.status().to_string();
  if (!inner.ok()) return nullptr;
  *gate = std::make_shared<GatedEngine>(*inner);
  auto o = small_options(root);
  o.worker_threads = 1;
  o.engine = *gate;
  return open_or_die(o);
}

TEST(StoreAsync, ReadsAndWriteRangesAreNotBoundedByWorkerThreads) {
  // One worker thread, 1 MiB chunks, 4 MiB of staging (512 KiB pieces, two per staged
  // transfer). With the gate closed, every read_range/get and write_range below must reach
  // the engine at once: kDirect whole-chunk reads (one request each), kStaged reads into
  // unaligned memory (two pieces in flight each) and kDirect whole-chunk write_ranges (one
  // request each). A store whose worker waited for its I/O would hold exactly one.
  constexpr int kDirect = 6, kStaged = 2;
  constexpr uint64_t kChunk = 1u << 20;
  TempDir d;
  std::shared_ptr<GatedEngine> gate;
  auto s = open_gated(d.path(), &gate);
  ASSERT_TRUE(s);
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < kDirect + kStaged; ++i) {
    data.push_back(pattern(kChunk, 100 + i));
    ASSERT_OK(s->put("k" + std::to_string(i), data[i].data(), TensorDesc::bytes(kChunk)));
  }

  // Reads.
  AlignedBytes out((kDirect + kStaged + 1) * kChunk);
  ASSERT_NE(out.data, nullptr);
  gate->close_gate();
  std::vector<Future<void>> futs;
  for (int i = 0; i < kDirect; ++i) {
    futs.push_back(s->read_range_async("k" + std::to_string(i), 0, kChunk, out.data + i * kChunk));
  }
  for (int i = kDirect; i < kDirect + kStaged; ++i) {  // unaligned: through staging
    futs.push_back(s->get_bytes_async("k" + std::to_string(i), out.data + i * kChunk + 1, kChunk));
  }
  const size_t want_reads = kDirect + 2 * kStaged;
  EXPECT_EQ(gate->wait_held(want_reads), want_reads);
  // No more than that, and none completes while held.
  EXPECT_EQ(gate->wait_held(want_reads + 1, std::chrono::milliseconds(200)), want_reads);
  for (const auto& f : futs) EXPECT_FALSE(f.ready());
  gate->open_gate();
  for (auto& f : futs) EXPECT_OK(f.result());
  for (int i = 0; i < kDirect + kStaged; ++i) {
    const uint8_t* got = out.data + i * kChunk + (i < kDirect ? 0 : 1);
    EXPECT_EQ(std::memcmp(got, data[i].data(), kChunk), 0) << "object " << i;
  }

  // Whole-chunk write_ranges from aligned memory.
  for (int i = 0; i < kDirect; ++i) {
    auto v = pattern(kChunk, 200 + i);
    std::memcpy(out.data + i * kChunk, v.data(), kChunk);
  }
  gate->close_gate();
  futs.clear();
  for (int i = 0; i < kDirect; ++i) {
    futs.push_back(s->write_range_async("k" + std::to_string(i), 0, kChunk, out.data + i * kChunk));
  }
  EXPECT_EQ(gate->wait_held(kDirect), static_cast<size_t>(kDirect));
  EXPECT_EQ(gate->wait_held(kDirect + 1, std::chrono::milliseconds(200)),
            static_cast<size_t>(kDirect));
  for (const auto& f : futs) EXPECT_FALSE(f.ready());
  gate->open_gate();
  for (auto& f : futs) EXPECT_OK(f.result());
  std::vector<uint8_t> back(kChunk);
  for (int i = 0; i < kDirect; ++i) {
    ASSERT_OK(s->get_bytes("k" + std::to_string(i), back.data(), kChunk));
    EXPECT_EQ(back, pattern(kChunk, 200 + i)) << "object " << i;
  }
  ASSERT_OK(s->close());
}

TEST(StoreAsync, CloseWaitsForReadsInFlightAtTheEngine) {
  // A read held at the engine is an operation in flight: close() returns only after it
  // completed (its last step, on the completion thread, ends the operation).
  constexpr uint64_t kChunk = 1u << 20;
  TempDir d;
  std::shared_ptr<GatedEngine> gate;
  auto s = open_gated(d.path(), &gate);
  ASSERT_TRUE(s);
  auto x = pattern(3 * kChunk, 7);
  ASSERT_OK(s->put("x", x.data(), TensorDesc::bytes(x.size())));
  AlignedBytes out(x.size());
  gate->close_gate();
  Future<void> r = s->read_range_async("x", 0, x.size(), out.data);
  ASSERT_EQ(gate->wait_held(3), 3u);
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    EXPECT_OK(s->close());
    closed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(closed.load());
  EXPECT_FALSE(r.ready());
  gate->open_gate();
  closer.join();
  EXPECT_TRUE(closed.load());
  ASSERT_OK(r.result());
  EXPECT_EQ(std::memcmp(out.data, x.data(), x.size()), 0);
}

// Found by fuzz_c_api: worker_threads = 1e9 made open() reserve a vector of 1e9 threads
// (12 GB) and then start threads until the system refused.
TEST(StoreWorkers, WorkerThreadsOutsideOneTo1024IsInvalidArgumentNamingTheValue) {
  TempDir d;
  for (uint32_t n : {0u, StoreOptions::kMaxWorkerThreads + 1, 1000000000u}) {
    auto o = small_options(d.path() + "/s");
    o.worker_threads = n;
    auto s = Store::open(o);
    ASSERT_FALSE(s.ok()) << n;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("worker_threads"), std::string::npos) << s.status().to_string();
    if (n != 0) {
      EXPECT_NE(s.status().message().find(std::to_string(n)), std::string::npos);
    }
  }
  auto o = small_options(d.path() + "/s");
  o.worker_threads = StoreOptions::kMaxWorkerThreads;
  EXPECT_TRUE(Store::open(o).ok());
}

}  // namespace
}  // namespace strata
