// A persistent worker pool bound (with hwloc) to the cores of one NUMA node.
#include "strata/optimizer/thread_pool.hpp"

#include <hwloc.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::optimizer {

struct ThreadPool::Impl {
  hwloc_topology_t topo = nullptr;
  hwloc_bitmap_t cpuset = nullptr;  // cores of the node (null when unbound)
  int numa_node = -1;
  std::atomic<int> bound_count{0};

  std::vector<std::thread> workers;
  std::mutex call_mu;  // serializes parallel_for callers

  std::mutex mu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  uint64_t generation = 0;
  bool stop = false;
  const std::function<void(size_t, size_t)>* fn = nullptr;
  size_t num_items = 0;
  int pending = 0;
  int started = 0;
  int num_workers = 0;  // set before any worker starts

  ~Impl() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : workers) {
      if (t.joinable()) t.join();
    }
    if (cpuset != nullptr) hwloc_bitmap_free(cpuset);
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }

  void run(int index) {
    if (cpuset != nullptr &&
        hwloc_set_cpubind(topo, cpuset, HWLOC_CPUBIND_THREAD) == 0) {
      bound_count.fetch_add(1);
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      ++started;
    }
    done_cv.notify_all();
    const size_t nthreads = static_cast<size_t>(num_workers);
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t, size_t)>* f;
      size_t n;
      {
        std::unique_lock<std::mutex> lk(mu);
        work_cv.wait(lk, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        f = fn;
        n = num_items;
      }
      const size_t begin = n * static_cast<size_t>(index) / nthreads;
      const size_t end = n * static_cast<size_t>(index + 1) / nthreads;
      if (begin < end) (*f)(begin, end);
      {
        std::lock_guard<std::mutex> lk(mu);
        if (--pending == 0) done_cv.notify_one();
      }
    }
  }
};

ThreadPool::ThreadPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ThreadPool::~ThreadPool() = default;

Result<std::unique_ptr<ThreadPool>> ThreadPool::create(const ThreadPoolOptions& options) {
  if (options.num_threads < 0) {
    return invalid_argument("ThreadPool: num_threads must be >= 0, got " +
                            std::to_string(options.num_threads));
  }
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topo) != 0 || hwloc_topology_load(impl->topo) != 0) {
    return internal_error("ThreadPool: hwloc could not load the machine topology");
  }
  int cores = hwloc_get_nbobjs_by_type(impl->topo, HWLOC_OBJ_CORE);
  if (options.numa_node >= 0) {
    const int nodes = hwloc_get_nbobjs_by_type(impl->topo, HWLOC_OBJ_NUMANODE);
    if (options.numa_node >= nodes) {
      return invalid_argument("ThreadPool: NUMA node " + std::to_string(options.numa_node) +
                              " does not exist (this machine has " + std::to_string(nodes) +
                              " node(s))");
    }
    hwloc_obj_t node = hwloc_get_obj_by_type(impl->topo, HWLOC_OBJ_NUMANODE,
                                             static_cast<unsigned>(options.numa_node));
    impl->cpuset = hwloc_bitmap_dup(node->cpuset);
    impl->numa_node = options.numa_node;
    cores = hwloc_get_nbobjs_inside_cpuset_by_type(impl->topo, impl->cpuset, HWLOC_OBJ_CORE);
  }
  const int n = options.num_threads > 0 ? options.num_threads : std::max(1, cores);
  auto* raw = impl.get();
  raw->num_workers = n;
  try {
    raw->workers.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) raw->workers.emplace_back([raw, i] { raw->run(i); });
  } catch (const std::system_error& e) {
    return resource_exhausted(std::string("ThreadPool: cannot start a worker thread: ") + e.what(),
                              e.code().value());
  }
  {
    // Wait until every worker has started (and tried to bind), so bound() is settled.
    std::unique_lock<std::mutex> lk(raw->mu);
    raw->done_cv.wait(lk, [&] { return raw->started == n; });
  }
  return std::unique_ptr<ThreadPool>(new ThreadPool(std::move(impl)));
}

int ThreadPool::num_threads() const { return impl_->num_workers; }
int ThreadPool::numa_node() const { return impl_->numa_node; }
bool ThreadPool::bound() const {
  return impl_->cpuset != nullptr && impl_->bound_count.load() == num_threads();
}

void ThreadPool::parallel_for(size_t num_items, const std::function<void(size_t, size_t)>& fn) {
  if (num_items == 0) return;
  std::lock_guard<std::mutex> call(impl_->call_mu);
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->fn = &fn;
  impl_->num_items = num_items;
  impl_->pending = num_threads();
  ++impl_->generation;
  impl_->work_cv.notify_all();
  impl_->done_cv.wait(lk, [&] { return impl_->pending == 0; });
  impl_->fn = nullptr;
}

}  // namespace strata::optimizer
