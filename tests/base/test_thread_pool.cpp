#include "strata/base/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

using namespace strata;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<ThreadPool> make_pool(int n, ThreadPool::StartHook hook = {}) {
  auto r = ThreadPool::create(n, std::move(hook));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}
}  // namespace

TEST(ThreadPool, RejectsNoThreads) {
  auto r = ThreadPool::create(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "ThreadPool: num_threads must be >= 1, got 0");
  EXPECT_EQ(ThreadPool::create(-3).status().code(), StatusCode::kInvalidArgument);
}

TEST(ThreadPool, ParallelForSplitsExactly) {
  auto pool = make_pool(4);
  ASSERT_EQ(pool->num_threads(), 4);
  std::mutex mu;
  std::vector<std::pair<int, std::pair<size_t, size_t>>> seen;  // (worker, range)
  pool->parallel_for(10, [&](size_t b, size_t e) {
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back({pool->worker_index(), {b, e}});
  });
  std::sort(seen.begin(), seen.end());
  // Worker w gets [w*10/4, (w+1)*10/4): [0,2) [2,5) [5,7) [7,10).
  const std::vector<std::pair<int, std::pair<size_t, size_t>>> want = {
      {0, {0, 2}}, {1, {2, 5}}, {2, {5, 7}}, {3, {7, 10}}};
  EXPECT_EQ(seen, want);
}

TEST(ThreadPool, ParallelForSkipsEmptyRanges) {
  auto pool = make_pool(4);
  std::mutex mu;
  std::vector<std::pair<size_t, size_t>> seen;
  pool->parallel_for(2, [&](size_t b, size_t e) {
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back({b, e});
  });
  std::sort(seen.begin(), seen.end());
  // Ranges [0,0) [0,1) [1,1) [1,2): the empty ones are not run.
  const std::vector<std::pair<size_t, size_t>> want = {{0, 1}, {1, 2}};
  EXPECT_EQ(seen, want);
  int calls = 0;
  pool->parallel_for(0, [&](size_t, size_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPool, ParallelForFromManyCallers) {
  auto pool = make_pool(3);
  std::atomic<size_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        pool->parallel_for(100, [&](size_t b, size_t e) { total += e - b; });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4u * 50u * 100u);
}

TEST(ThreadPool, OneThreadRunsInSubmissionOrder) {
  auto pool = make_pool(1);
  std::vector<int> order;  // touched by the one worker only
  for (int i = 0; i < 100; ++i) pool->submit([&order, i] { order.push_back(i); });
  pool->shutdown();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(ThreadPool, DestructorDrainsTheQueue) {
  std::atomic<int> ran{0};
  {
    auto pool = make_pool(2);
    for (int i = 0; i < 64; ++i) {
      pool->submit([&ran] {
        std::this_thread::sleep_for(1ms);
        ran.fetch_add(1);
      });
    }
  }  // destroyed with most of the queue still waiting
  EXPECT_EQ(ran.load(), 64);
}

TEST(ThreadPool, TasksSubmittedWhileDrainingRun) {
  std::atomic<int> ran{0};
  {
    auto pool = make_pool(1);
    ThreadPool* raw = pool.get();
    pool->submit([raw, &ran] {
      std::this_thread::sleep_for(5ms);
      raw->submit([&ran] { ran.fetch_add(10); });
      ran.fetch_add(1);
    });
  }
  EXPECT_EQ(ran.load(), 11);
}

TEST(ThreadPool, ShutdownIsIdempotent) {
  auto pool = make_pool(2);
  std::atomic<int> ran{0};
  pool->submit([&] { ran.fetch_add(1); });
  pool->shutdown();
  pool->shutdown();
  EXPECT_EQ(ran.load(), 1);
}

TEST(ThreadPool, StartHookOncePerWorkerBeforeCreateReturns) {
  std::mutex mu;
  std::vector<int> indices;
  std::vector<std::thread::id> threads;
  auto pool = make_pool(5, [&](int w) {
    std::lock_guard<std::mutex> lk(mu);
    indices.push_back(w);
    threads.push_back(std::this_thread::get_id());
  });
  {
    std::lock_guard<std::mutex> lk(mu);  // every hook has returned by now
    std::vector<int> sorted = indices;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4}));
    std::vector<std::thread::id> distinct = threads;
    std::sort(distinct.begin(), distinct.end());
    EXPECT_EQ(std::unique(distinct.begin(), distinct.end()), distinct.end());
    EXPECT_EQ(std::count(threads.begin(), threads.end(), std::this_thread::get_id()), 0);
  }
  // The hook ran on the worker that later runs range w of a parallel_for.
  std::vector<std::thread::id> range_thread(5);
  pool->parallel_for(5, [&](size_t b, size_t) { range_thread[b] = std::this_thread::get_id(); });
  std::lock_guard<std::mutex> lk(mu);
  for (size_t k = 0; k < indices.size(); ++k) {
    EXPECT_EQ(range_thread[static_cast<size_t>(indices[k])], threads[k]) << "worker " << indices[k];
  }
}

TEST(ThreadPool, WorkerIndex) {
  auto pool = make_pool(2);
  auto other = make_pool(1);
  EXPECT_EQ(pool->worker_index(), -1);
  auto f = pool->async([&] { return std::make_pair(pool->worker_index(), other->worker_index()); });
  auto r = f.result();
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->first == 0 || r->first == 1) << r->first;
  EXPECT_EQ(r->second, -1);
}

TEST(ThreadPool, AsyncResultTypes) {
  auto pool = make_pool(1);
  Future<void> a = pool->async([] { return Status::OK(); });
  Future<void> b = pool->async([] { return not_found("key 'k'"); });
  Future<int> c = pool->async([] { return 42; });
  Future<int> d = pool->async([]() -> Result<int> { return out_of_range("offset 9"); });
  Future<void> e = pool->async([] {});
  Future<int> g = pool->async([] { return make_ready_future(Result<int>(7)); });
  EXPECT_TRUE(a.result().ok());
  EXPECT_EQ(b.result().status(), not_found("key 'k'"));
  EXPECT_EQ(*c.result(), 42);
  EXPECT_EQ(d.result().status(), out_of_range("offset 9"));
  EXPECT_TRUE(e.result().ok());
  EXPECT_EQ(*g.result(), 7);
}

TEST(ThreadPool, QueuedTasksAndParallelForInterleave) {
  auto pool = make_pool(2);
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  pool->submit([&] {
    started.store(true);
    while (!release.load()) std::this_thread::sleep_for(1ms);
    ran.fetch_add(1);
  });
  while (!started.load()) std::this_thread::sleep_for(1ms);
  std::thread releaser([&] {
    std::this_thread::sleep_for(20ms);
    release.store(true);
  });
  // One worker is busy in the task: parallel_for waits for it (so the task has finished when
  // it returns), and both ranges run.
  std::atomic<size_t> covered{0};
  pool->parallel_for(8, [&](size_t b, size_t e) { covered += e - b; });
  releaser.join();
  EXPECT_EQ(covered.load(), 8u);
  EXPECT_EQ(ran.load(), 1);
}
