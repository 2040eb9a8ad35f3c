// See io_pass.hpp.
#include "io_pass.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>

#include "progress.hpp"
#include "strata/base/units.hpp"

namespace strata::cli {

uint64_t striped_file_bytes(uint64_t size, uint64_t u, uint64_t k, uint64_t j) {
  const uint64_t nfull = size / u, rem = size % u;
  uint64_t units = nfull / k + (j < nfull % k ? 1 : 0);
  return units * u + (j == nfull % k ? rem : 0);
}

PassShape pass_shape(uint32_t queue_depth, uint64_t bs, uint64_t request_size) {
  PassShape p;
  p.request = request_size != 0
                  ? request_size
                  : std::max<uint64_t>(bs, static_cast<uint64_t>(queue_depth) * bs / 4 / bs * bs);
  p.slots = static_cast<uint32_t>(std::max<uint64_t>(
      2, (2 * static_cast<uint64_t>(queue_depth) * bs + p.request - 1) / p.request));
  return p;
}

void drop_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}


LoopResult run_loop(StripedFile& file, bool write, char* mem, uint64_t size, uint64_t bs,
                    uint32_t slots, bool progress, const char* label, double max_seconds) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint32_t, Status>> done;
  const uint64_t nreq = (size + bs - 1) / bs;
  uint64_t next = 0, completed = 0;
  auto submit = [&](uint32_t slot) {
    const uint64_t off = next * bs;
    const uint64_t len = std::min(bs, size - off);
    ++next;
    char* p = mem + static_cast<uint64_t>(slot) * bs;
    Future<uint64_t> f = write ? file.write_async(p, len, off) : file.read_async(p, len, off);
    f.on_ready([&, slot](const Result<uint64_t>& r) {
      // Notify under the lock: the waiter may return (and destroy cv) right after.
      std::lock_guard<std::mutex> lk(mu);
      done.emplace_back(slot, r.status());
      cv.notify_one();
    });
  };
  LoopResult res;
  const auto t0 = std::chrono::steady_clock::now();
  Progress bar(std::string("  ") + label, size, Progress::Unit::kBytes);
  for (uint32_t s = 0; s < slots && next < nreq; ++s) submit(s);
  bool stopped = false;  // max_seconds passed: no further submissions
  while (completed < next) {
    std::pair<uint32_t, Status> c;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !done.empty(); });
      c = std::move(done.front());
      done.pop_front();
    }
    ++completed;
    if (!c.second.ok() && res.status.ok()) res.status = c.second;
    if (max_seconds > 0 && !stopped &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_seconds) {
      stopped = true;
    }
    if (res.status.ok() && !stopped && next < nreq) submit(c.first);
    if (progress) bar.update(std::min(size, completed * bs));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.bytes = std::min(size, next * bs);
  bar.finish();
  return res;
}

}  // namespace strata::cli
