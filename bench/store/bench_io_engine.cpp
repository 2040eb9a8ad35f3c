// Micro-benchmarks of the I/O engine's own costs (Google Benchmark, target strata_microbench):
//  - BM_IoSubmitOverhead: submit + complete of 512-byte buffered reads served from the page
//    cache, 64 per batch: the per-request cost of the engine (planning, queueing, ring or
//    thread hand-off, completion, future), with almost no device time. items/s = requests/s.
//  - BM_IoRandRead4K: 4 KiB O_DIRECT random reads at queue depth 32 from a 64 MiB file on
//    /tmp (STRATA_BENCH_IO_DIR overrides), 256 per batch: small-block IOPS (items/s) and
//    bandwidth (bytes/s).
// Both run for the io_uring engine (arg 0) and the thread-pool engine (arg 1).
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "strata/store/io_engine.hpp"

namespace {

using strata::EngineKind;
using strata::Future;
using strata::IoEngine;
using strata::IoEngineOptions;
using strata::OpenMode;

std::string bench_dir() {
  const char* d = std::getenv("STRATA_BENCH_IO_DIR");
  return d ? d : "/tmp";
}

struct Fixture {
  std::shared_ptr<IoEngine> engine;
  std::shared_ptr<strata::IoFile> file;
  std::string path;
  char* buf = nullptr;
  ~Fixture() {
    file.reset();
    engine.reset();
    if (!path.empty()) ::unlink(path.c_str());
    std::free(buf);
  }
};

/// Engine of `kind`, a file of `file_bytes` written with a pattern, an aligned buffer.
bool setup(Fixture& fx, benchmark::State& state, EngineKind kind, bool direct,
           uint64_t file_bytes, uint64_t buf_bytes, uint32_t qd) {
  IoEngineOptions o;
  o.kind = kind;
  o.direct = direct;
  o.queue_depth = qd;
  o.allow_threads_fallback = false;
  auto e = IoEngine::create(o);
  if (!e.ok()) {
    state.SkipWithError(e.status().to_string().c_str());
    return false;
  }
  fx.engine = *e;
  fx.path = bench_dir() + "/strata_bench_io_" + std::to_string(::getpid()) + ".dat";
  auto f = fx.engine->open(fx.path, OpenMode::kTruncate);
  if (!f.ok()) {
    state.SkipWithError(f.status().to_string().c_str());
    return false;
  }
  fx.file = *f;
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, std::max(buf_bytes, file_bytes)) != 0) {
    state.SkipWithError("posix_memalign failed");
    return false;
  }
  fx.buf = static_cast<char*>(p);
  for (uint64_t i = 0; i < file_bytes; ++i) fx.buf[i] = static_cast<char>(i * 7 + 1);
  auto w = fx.engine->write_async(fx.file, fx.buf, file_bytes, 0).result();
  if (!w.ok()) {
    state.SkipWithError(w.status().to_string().c_str());
    return false;
  }
  return true;
}

/// Waits for every future of `fs`; on the first failure skips the benchmark with its error
/// and returns false.
bool wait_all(benchmark::State& state, std::vector<Future<uint64_t>>& fs) {
  for (auto& f : fs) {
    if (!f.result().ok()) {
      state.SkipWithError(f.result().status().to_string().c_str());
      return false;
    }
  }
  return true;
}

/// Items and bytes processed: `requests` requests of `request_bytes` each per iteration.
void set_processed(benchmark::State& state, uint64_t requests, uint64_t request_bytes) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * requests));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * requests * request_bytes));
}

void BM_IoSubmitOverhead(benchmark::State& state) {
  const auto kind = state.range(0) == 0 ? EngineKind::kUring : EngineKind::kThreads;
  constexpr uint64_t kReq = 512, kBatch = 64, kFile = 1 << 20;
  Fixture fx;
  if (!setup(fx, state, kind, /*direct=*/false, kFile, kFile, 32)) return;
  std::vector<Future<uint64_t>> fs(kBatch);
  uint64_t off = 0;
  for (auto _ : state) {
    for (uint64_t i = 0; i < kBatch; ++i) {
      fs[i] = fx.engine->read_async(fx.file, fx.buf + i * kReq, kReq, off);
      off = (off + kReq) % kFile;
    }
    if (!wait_all(state, fs)) return;
  }
  set_processed(state, kBatch, kReq);
  state.SetLabel(std::string(strata::engine_kind_name(kind)));
}
BENCHMARK(BM_IoSubmitOverhead)->Arg(0)->Arg(1)->UseRealTime();

void BM_IoRandRead4K(benchmark::State& state) {
  const auto kind = state.range(0) == 0 ? EngineKind::kUring : EngineKind::kThreads;
  constexpr uint64_t kBlock = 4096, kBatch = 256, kFile = 64ull << 20;
  Fixture fx;
  if (!setup(fx, state, kind, /*direct=*/true, kFile, kBatch * kBlock, 32)) return;
  if (!fx.file->direct()) state.SetLabel("buffered (O_DIRECT refused)");
  std::mt19937_64 rng(42);
  std::vector<Future<uint64_t>> fs(kBatch);
  for (auto _ : state) {
    for (uint64_t i = 0; i < kBatch; ++i) {
      const uint64_t off = (rng() % (kFile / kBlock)) * kBlock;
      fs[i] = fx.engine->read_async(fx.file, fx.buf + i * kBlock, kBlock, off);
    }
    if (!wait_all(state, fs)) return;
  }
  set_processed(state, kBatch, kBlock);
  if (fx.file->direct()) state.SetLabel(std::string(strata::engine_kind_name(kind)) + " O_DIRECT qd32");
}
BENCHMARK(BM_IoRandRead4K)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
