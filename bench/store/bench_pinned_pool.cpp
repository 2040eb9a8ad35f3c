// Pinned pool costs: allocate+free of one buffer (empty and fragmented pool, 1 and 2
// threads) beside malloc+free of the same size as the reference, and pool creation
// (mmap + THP + mlock per byte). Run: strata_microbench --benchmark_filter=Pinned
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "strata/base/units.hpp"
#include "strata/store/pinned_pool.hpp"

namespace strata {
namespace {

std::shared_ptr<PinnedPool> bench_pool(uint64_t budget) {
  PinnedPoolOptions o;
  o.budget_bytes = budget;
  auto p = PinnedPool::create(o);
  return p.ok() ? *p : nullptr;
}

// One allocate + free in an otherwise empty pool.
void BM_PinnedPoolAllocFree(benchmark::State& state) {
  static std::shared_ptr<PinnedPool> pool = bench_pool(64 * kMiB);
  if (!pool) {
    state.SkipWithError("pool creation failed");
    return;
  }
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  for (auto _ : state) {
    auto b = pool->try_allocate(n);
    benchmark::DoNotOptimize(b->data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PinnedPoolAllocFree)->Arg(4096)->Arg(1 << 20)->ThreadRange(1, 2)->UseRealTime();

// The reference: malloc + free of the same size (glibc; 1 MiB goes through mmap).
void BM_MallocFree(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MallocFree)->Arg(4096)->Arg(1 << 20)->ThreadRange(1, 2)->UseRealTime();

// Allocate + free with 512 live buffers of random sizes (4 KiB .. 256 KiB): the free list
// holds hundreds of ranges.
void BM_PinnedPoolAllocFreeFragmented(benchmark::State& state) {
  auto pool = bench_pool(256 * kMiB);
  if (!pool) {
    state.SkipWithError("pool creation failed");
    return;
  }
  std::mt19937_64 rng(42);
  std::vector<PinnedBuffer> live(512);
  for (auto& b : live) b = pool->try_allocate(4096 * (1 + rng() % 64)).value();
  for (size_t i = 0; i < live.size(); i += 2) live[i].reset();  // punch holes
  size_t k = 0;
  for (auto _ : state) {
    size_t slot = (k++ * 7919) % live.size();
    live[slot].reset();
    auto r = pool->try_allocate(4096 * (1 + rng() % 64));
    if (r.ok()) live[slot] = std::move(*r);
  }
  state.counters["free_ranges"] = static_cast<double>(pool->free_ranges());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PinnedPoolAllocFreeFragmented);

// Creation + destruction: mmap, madvise, mlock (faults in every page), munlock, munmap.
void BM_PinnedPoolCreate(benchmark::State& state) {
  const uint64_t budget = static_cast<uint64_t>(state.range(0));
  for (auto _ : state) {
    auto p = bench_pool(budget);
    benchmark::DoNotOptimize(p.get());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * budget));
}
BENCHMARK(BM_PinnedPoolCreate)->Arg(2 << 20)->Arg(64 << 20)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace strata
