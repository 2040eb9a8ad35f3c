// strata::store — the io_uring engine (EngineKind::kUring), on liburing.
//
// `workers` threads, each owning one ring. A request's pieces go to one worker (round
// robin over requests). A worker keeps up to queue_depth pieces in flight, prepares every
// piece it can, then calls io_uring_submit once per batch of at most submit_batch SQEs; it sleeps only in
// io_uring_wait_cqe, woken by completions or by an eventfd read that submitters signal
// (IOPOLL rings, which cannot poll an eventfd, sleep on a condition variable when idle).
// Buffers inside regions given to register_buffer() use READ_FIXED/WRITE_FIXED; files are
// registered in a sparse table of every ring (IOSQE_FIXED_FILE).
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "io_common.hpp"
#include "io_fault.hpp"
#include "strata/base/logging.hpp"

namespace strata::io {
namespace {

constexpr uint64_t kEventTag = ~0ull;
constexpr unsigned kBufferSlots = 1024;  // sparse registered-buffer table per ring
constexpr uint64_t kMaxIovec = 1ull << 30;  // the kernel's limit for one registered buffer
// Pieces of at least this size are submitted one per io_uring_submit by default (see
// IoEngineOptions::submit_batch).
constexpr uint64_t kLargeBlock = 128 * 1024;

struct Region {
  char* base;
  uint64_t len;
  unsigned first_slot;
  unsigned nslots;
};

class UringEngine final : public EngineBase, public FileSlotOwner {
 public:
  explicit UringEngine(const IoEngineOptions& o) : EngineBase(o) {
    options_.kind = EngineKind::kUring;
  }

  Status init() {
    use_eventfd_ = !options_.iopoll;
    batch_ = options_.submit_batch != 0 ? options_.submit_batch
             : options_.block_size >= kLargeBlock ? 1u
                                                  : options_.queue_depth + 1;
    unsigned entries = 1;
    while (entries < options_.queue_depth + 1) entries <<= 1;
    STRATA_ASSIGN_OR_RETURN(cpus_, numa_node_cpus(options_.numa_node));
    for (uint32_t i = 0; i < options_.workers; ++i) {
      auto w = std::make_unique<Worker>();
      io_uring_params p{};
      if (options_.sqpoll) {
        p.flags |= IORING_SETUP_SQPOLL;
        p.sq_thread_idle = 50;  // ms
      }
      if (options_.iopoll) p.flags |= IORING_SETUP_IOPOLL;
      int rc = static_cast<int>(fault::filter(fault::Site::kSetup, {}, 0));
      if (rc == 0) rc = io_uring_queue_init_params(entries, &w->ring, &p);
      if (rc < 0) {
        return errno_status(-rc, "io_uring_queue_init_params(entries=" + std::to_string(entries) +
                                     (options_.sqpoll ? ", SQPOLL" : "") +
                                     (options_.iopoll ? ", IOPOLL" : "") + ")");
      }
      w->ring_ok = true;
      if (!cpus_.empty()) {
        // The kernel's async workers for this ring (io-wq: blocking or punted requests)
        // run on the node's CPUs too. Best effort: kernels before 5.14 lack it.
        cpu_set_t mask;
        CPU_ZERO(&mask);
        for (int c : cpus_) {
          if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &mask);
        }
        int arc = io_uring_register_iowq_aff(&w->ring, sizeof mask, &mask);
        if (arc < 0) {
          log_debug("io_uring_register_iowq_aff failed (errno " + std::to_string(-arc) +
                    "); io-wq workers stay unbound");
        }
      }
      if (use_eventfd_) {
        w->efd = ::eventfd(0, EFD_CLOEXEC);
        if (w->efd < 0) return errno_status(errno, "eventfd for the io_uring worker");
      }
      workers_.push_back(std::move(w));
    }
    // Registered buffers: a sparse table in every ring, filled by register_buffer().
    fixed_buffers_ = options_.register_buffers;
    for (auto& w : workers_) {
      int rc = io_uring_register_buffers_sparse(&w->ring, kBufferSlots);
      if (rc < 0) {
        log_debug("io_uring_register_buffers_sparse failed (errno " + std::to_string(-rc) +
                  "); using unregistered buffers");
        fixed_buffers_ = false;
        break;
      }
    }
    buffer_slot_used_.assign(kBufferSlots, false);
    // Registered files: a sparse table, two slots per file (direct, buffered descriptor).
    if (options_.register_files) {
      rlimit rl{};
      unsigned n = 4096;
      if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < n) {
        n = static_cast<unsigned>(rl.rlim_cur);
      }
      n &= ~1u;
      fixed_files_ = n >= 2;
      for (auto& w : workers_) {
        if (!fixed_files_) break;
        int rc = io_uring_register_files_sparse(&w->ring, n);
        if (rc < 0) {
          log_debug("io_uring_register_files_sparse failed (errno " + std::to_string(-rc) +
                    "); using plain descriptors");
          fixed_files_ = false;
        }
      }
      if (fixed_files_) {
        for (int s = static_cast<int>(n) - 2; s >= 0; s -= 2) free_file_slots_.push_back(s);
      }
    }
    link_ = std::make_shared<FileSlotLink>();
    link_->owner = this;
    for (auto& w : workers_) {
      Worker* wp = w.get();
      w->thread = std::thread([this, wp] {
        bind_engine_thread(cpus_, options_.numa_node);
        loop(*wp);
      });
    }
    return Status::OK();
  }

  ~UringEngine() override {
    if (!workers_.empty() && workers_.back()->thread.joinable()) drain();
    for (auto& w : workers_) {
      {
        std::lock_guard<std::mutex> lk(w->mu);
        w->stop = true;
      }
      wake(*w);
    }
    for (auto& w : workers_) {
      if (w->thread.joinable()) w->thread.join();
    }
    if (link_) {
      std::lock_guard<std::mutex> lk(link_->mu);
      link_->owner = nullptr;
    }
    for (auto& w : workers_) {
      if (w->ring_ok) io_uring_queue_exit(&w->ring);
      if (w->efd >= 0) ::close(w->efd);
    }
  }

  EngineKind kind() const override { return EngineKind::kUring; }

  Status register_buffer(void* addr, uint64_t nbytes) override {
    if (addr == nullptr || nbytes == 0) {
      return invalid_argument("register_buffer: empty region (addr " +
                              std::to_string(reinterpret_cast<uintptr_t>(addr)) + ", " +
                              std::to_string(nbytes) + " bytes)");
    }
    if (!fixed_buffers_) return Status::OK();  // plain READ/WRITE still work
    char* base = static_cast<char*>(addr);
    std::unique_lock<std::shared_mutex> lk(regions_mu_);
    // Overlap check with neighbours.
    auto next = regions_.lower_bound(base);
    if (next != regions_.end() && next->first < base + nbytes) {
      return already_exists("register_buffer: region overlaps a registered one");
    }
    if (next != regions_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.len > base) {
        return already_exists("register_buffer: region overlaps a registered one");
      }
    }
    const unsigned nslots = static_cast<unsigned>((nbytes + kMaxIovec - 1) / kMaxIovec);
    unsigned first = 0, run = 0;
    bool found = false;
    for (unsigned s = 0; s < kBufferSlots; ++s) {
      run = buffer_slot_used_[s] ? 0 : run + 1;
      if (run == nslots) {
        first = s + 1 - nslots;
        found = true;
        break;
      }
    }
    if (!found) {
      return resource_exhausted("register_buffer: no free registered-buffer slots for " +
                                std::to_string(nbytes) + " bytes");
    }
    std::vector<iovec> iovs(nslots);
    for (unsigned i = 0; i < nslots; ++i) {
      iovs[i].iov_base = base + i * kMaxIovec;
      iovs[i].iov_len = std::min(kMaxIovec, nbytes - i * kMaxIovec);
    }
    for (size_t wi = 0; wi < workers_.size(); ++wi) {
      int rc = io_uring_register_buffers_update_tag(&workers_[wi]->ring, first, iovs.data(),
                                                    nullptr, nslots);
      if (rc < 0) {
        clear_buffer_slots(first, nslots, wi);
        return errno_status(-rc, "io_uring_register_buffers_update_tag of " +
                                     std::to_string(nbytes) + " bytes");
      }
    }
    for (unsigned i = 0; i < nslots; ++i) buffer_slot_used_[first + i] = true;
    regions_[base] = Region{base, nbytes, first, nslots};
    return Status::OK();
  }

  Status unregister_buffer(void* addr) override {
    if (!fixed_buffers_) return Status::OK();
    std::unique_lock<std::shared_mutex> lk(regions_mu_);
    auto it = regions_.find(static_cast<char*>(addr));
    if (it == regions_.end()) {
      return not_found("unregister_buffer: no registered region starts at address " +
                       std::to_string(reinterpret_cast<uintptr_t>(addr)));
    }
    clear_buffer_slots(it->second.first_slot, it->second.nslots, workers_.size());
    for (unsigned i = 0; i < it->second.nslots; ++i) {
      buffer_slot_used_[it->second.first_slot + i] = false;
    }
    regions_.erase(it);
    return Status::OK();
  }

  // FileSlotOwner (called with link_->mu held).
  int register_file(int fd_direct, int fd_buffered) override {
    if (!fixed_files_) return -1;
    std::lock_guard<std::mutex> lk(files_mu_);
    if (free_file_slots_.empty()) return -1;
    int slot = free_file_slots_.back();
    int fds[2] = {fd_direct, fd_buffered};
    for (size_t wi = 0; wi < workers_.size(); ++wi) {
      int rc = io_uring_register_files_update(&workers_[wi]->ring, slot, fds, 2);
      if (rc < 0) {
        int none[2] = {-1, -1};
        for (size_t j = 0; j < wi; ++j) io_uring_register_files_update(&workers_[j]->ring, slot, none, 2);
        return -1;
      }
    }
    free_file_slots_.pop_back();
    return slot;
  }

  void unregister_file(int slot) override {
    std::lock_guard<std::mutex> lk(files_mu_);
    int none[2] = {-1, -1};
    for (auto& w : workers_) io_uring_register_files_update(&w->ring, slot, none, 2);
    free_file_slots_.push_back(slot);
  }

  bool fixed_buffers() const { return fixed_buffers_; }

 protected:
  std::shared_ptr<FileSlotLink> slot_link() override { return fixed_files_ ? link_ : nullptr; }

  void enqueue(Request* r) override {
    Worker& w = *workers_[rr_.fetch_add(1, std::memory_order_relaxed) % workers_.size()];
    bool was_empty;
    {
      std::lock_guard<std::mutex> lk(w.mu);
      was_empty = w.incoming.empty();
      for (auto& p : r->pieces) w.incoming.push_back(&p);
    }
    if (was_empty) wake(w);
  }

 private:
  struct Worker {
    io_uring ring{};
    bool ring_ok = false;
    int efd = -1;
    uint64_t efd_value = 0;
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;  // IOPOLL rings only
    std::vector<Piece*> incoming;
    bool stop = false;
  };

  void wake(Worker& w) {
    if (use_eventfd_) {
      uint64_t one = 1;
      ssize_t n = ::write(w.efd, &one, sizeof one);
      (void)n;
    } else {
      std::lock_guard<std::mutex> lk(w.mu);
      w.cv.notify_one();
    }
  }

  void clear_buffer_slots(unsigned first, unsigned nslots, size_t nworkers) {
    std::vector<iovec> empty(nslots);
    for (auto& v : empty) {
      v.iov_base = nullptr;
      v.iov_len = 0;
    }
    for (size_t wi = 0; wi < nworkers; ++wi) {
      io_uring_register_buffers_update_tag(&workers_[wi]->ring, first, empty.data(), nullptr,
                                           nslots);
    }
  }

  /// Registered-buffer index holding [p, p+len), or -1.
  int buffer_index(const char* p, uint64_t len) {
    std::shared_lock<std::shared_mutex> lk(regions_mu_);
    if (regions_.empty()) return -1;
    auto it = regions_.upper_bound(const_cast<char*>(p));
    if (it == regions_.begin()) return -1;
    --it;
    const Region& r = it->second;
    if (p + len > r.base + r.len) return -1;
    const uint64_t first = static_cast<uint64_t>(p - r.base) / kMaxIovec;
    const uint64_t last = static_cast<uint64_t>(p + len - 1 - r.base) / kMaxIovec;
    if (first != last) return -1;
    return static_cast<int>(r.first_slot + first);
  }

  void prep(io_uring_sqe* sqe, Piece& p) {
    const FileImpl& f = *p.req->file;
    int fd;
    bool fixed_file = false;
    if (fixed_files_ && f.slot_ >= 0 && f.link_ == link_) {
      fd = f.slot_ + (p.buffered_fd ? 1 : 0);
      fixed_file = true;
    } else {
      fd = p.buffered_fd ? f.fd_buffered_ : f.fd_direct_;
    }
    const Op op = p.req->op;
    if (op == Op::kSync) {
      io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
    } else {
      const unsigned len = static_cast<unsigned>(p.remaining());
      const uint64_t off = p.offset + p.done;
      const int bi = (fixed_buffers_ && !p.bounce) ? buffer_index(p.data(), len) : -1;
      if (op == Op::kRead) {
        if (bi >= 0) {
          io_uring_prep_read_fixed(sqe, fd, p.data(), len, off, bi);
        } else {
          io_uring_prep_read(sqe, fd, p.data(), len, off);
        }
      } else if (bi >= 0) {
        io_uring_prep_write_fixed(sqe, fd, p.data(), len, off, bi);
      } else {
        io_uring_prep_write(sqe, fd, p.data(), len, off);
      }
    }
    if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, &p);
  }

  void arm_eventfd(Worker& w) {
    io_uring_sqe* sqe = io_uring_get_sqe(&w.ring);
    if (!sqe) {
      io_uring_submit(&w.ring);
      sqe = io_uring_get_sqe(&w.ring);
    }
    io_uring_prep_read(sqe, w.efd, &w.efd_value, sizeof w.efd_value, 0);
    io_uring_sqe_set_data64(sqe, kEventTag);
  }

  void submit_all(Worker& w) {
    for (;;) {
      int rc = static_cast<int>(fault::filter(fault::Site::kSubmit, {}, 0));
      if (rc == 0) rc = io_uring_submit(&w.ring);
      if (rc >= 0 || (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)) {
        if (rc < 0) log_error("io_uring_submit failed (errno " + std::to_string(-rc) + ")");
        return;
      }
      if (rc == -EBUSY || rc == -EAGAIN) std::this_thread::yield();
    }
  }

  void loop(Worker& w) {
    std::deque<Piece*> pending;
    std::vector<Piece*> batch;
    unsigned inflight = 0;
    const unsigned qd = options_.queue_depth;
    bool arm = use_eventfd_;
    for (;;) {
      bool stop;
      {
        std::unique_lock<std::mutex> lk(w.mu);
        if (!use_eventfd_ && inflight == 0 && pending.empty()) {
          w.cv.wait(lk, [&] { return w.stop || !w.incoming.empty(); });
        }
        batch.swap(w.incoming);
        stop = w.stop;
      }
      for (Piece* p : batch) pending.push_back(p);
      batch.clear();
      if (stop && pending.empty() && inflight == 0) return;

      unsigned prepped = 0;
      if (arm) {
        arm_eventfd(w);
        arm = false;
        ++prepped;
      }
      while (!pending.empty() && inflight < qd) {
        Piece* p = pending.front();
        pending.pop_front();
        if (p->done == 0 && p->attempts == 0) {
          prepare_piece(*p);
          if (p->done == p->len && p->len > 0) {  // bounce allocation failed
            finish_piece(*p);
            continue;
          }
        }
        if (options_.iopoll && (p->buffered_fd || p->req->op == Op::kSync)) {
          run_piece_sync(*p, &occupancy_);  // IOPOLL rings take only O_DIRECT reads and writes
          continue;
        }
        io_uring_sqe* sqe = io_uring_get_sqe(&w.ring);
        if (!sqe) {
          submit_all(w);
          prepped = 0;
          sqe = io_uring_get_sqe(&w.ring);
          if (!sqe) {
            pending.push_front(p);
            break;
          }
        }
        prep(sqe, *p);
        occupancy_.start(p->req->op);
        ++inflight;
        ++prepped;
        if (prepped >= batch_) {
          submit_all(w);
          prepped = 0;
        }
      }
      if (prepped) submit_all(w);
      if (inflight == 0 && !use_eventfd_) continue;

      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&w.ring, &cqe);
      if (rc < 0) {
        if (rc != -EINTR && rc != -EAGAIN) {
          log_error("io_uring_wait_cqe failed (errno " + std::to_string(-rc) + ")");
        }
        continue;
      }
      unsigned head, n = 0;
      io_uring_for_each_cqe(&w.ring, head, cqe) {
        ++n;
        if (cqe->user_data == kEventTag) {
          arm = true;
          continue;
        }
        Piece* p = reinterpret_cast<Piece*>(static_cast<uintptr_t>(cqe->user_data));
        occupancy_.end(p->req->op);
        --inflight;
        if (account_result(*p, cqe->res)) {
          finish_piece(*p);
        } else {
          pending.push_front(p);
        }
      }
      io_uring_cq_advance(&w.ring, n);
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint32_t> rr_{0};
  bool use_eventfd_ = true;
  unsigned batch_ = 1;  // SQEs per io_uring_submit at most
  std::vector<int> cpus_;  // of options_.numa_node; empty: unbound
  bool fixed_buffers_ = false;
  bool fixed_files_ = false;
  std::shared_mutex regions_mu_;
  std::map<char*, Region> regions_;
  std::vector<bool> buffer_slot_used_;
  std::shared_ptr<FileSlotLink> link_;
  std::mutex files_mu_;
  std::vector<int> free_file_slots_;
};

}  // namespace

Result<std::shared_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& options) {
  auto e = std::make_shared<UringEngine>(options);
  STRATA_RETURN_IF_ERROR(e->init());
  return std::shared_ptr<IoEngine>(std::move(e));
}

}  // namespace strata::io
