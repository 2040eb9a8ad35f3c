// strata::store — file opening, DIO alignment, request planning and completion accounting
// shared by the io_uring and thread-pool engines. See io_common.hpp.
#include "io_common.hpp"
#include "io_fault.hpp"
#include "strata/store/config.hpp"
#include "strata/store/topology.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "strata/base/env.hpp"
#include "strata/base/logging.hpp"
#include "strata/base/units.hpp"

namespace strata {

std::string_view engine_kind_name(EngineKind k) {
  return k == EngineKind::kUring ? "uring" : "threads";
}

Result<IoEngineOptions> IoEngineOptions::from_env() { return from_config(""); }

Result<IoEngineOptions> IoEngineOptions::from_config(const std::string& config_file) {
  IoEngineOptions o;
  STRATA_ASSIGN_OR_RETURN(auto cfg, load_config_to_use(config_file));
  if (cfg) cfg->apply(o);
  STRATA_RETURN_IF_ERROR(io::apply_env(o));
  return o;
}

namespace io {

Status apply_env(IoEngineOptions& o) {
  if (auto v = env_string("STRATA_IO_ENGINE")) {
    if (*v == "uring") {
      o.kind = EngineKind::kUring;
    } else if (*v == "threads") {
      o.kind = EngineKind::kThreads;
    } else {
      return invalid_argument("STRATA_IO_ENGINE='" + *v + "': expected 'uring' or 'threads'");
    }
  }
  STRATA_ASSIGN_OR_RETURN(uint64_t qd, env_uint("STRATA_QUEUE_DEPTH", o.queue_depth));
  STRATA_ASSIGN_OR_RETURN(uint64_t bs, env_size("STRATA_BLOCK_SIZE", o.block_size));
  STRATA_ASSIGN_OR_RETURN(uint64_t w, env_uint("STRATA_IO_WORKERS", o.workers));
  STRATA_ASSIGN_OR_RETURN(bool direct, env_bool("STRATA_DIRECT", o.direct));
  STRATA_ASSIGN_OR_RETURN(uint64_t batch, env_uint("STRATA_IO_SUBMIT_BATCH", o.submit_batch));
  if (batch > 4096) {
    return invalid_argument("STRATA_IO_SUBMIT_BATCH=" + std::to_string(batch) +
                            ": must be in 0..4096");
  }
  o.submit_batch = static_cast<uint32_t>(batch);
  if (qd == 0 || qd > 4096) {
    return invalid_argument("STRATA_QUEUE_DEPTH=" + std::to_string(qd) + ": must be in 1..4096");
  }
  if (bs == 0 || bs > (1ull << 30)) {
    return invalid_argument("STRATA_BLOCK_SIZE=" + std::to_string(bs) + ": must be in 1..1GiB");
  }
  if (w == 0 || w > 64) {
    return invalid_argument("STRATA_IO_WORKERS=" + std::to_string(w) + ": must be in 1..64");
  }
  o.queue_depth = static_cast<uint32_t>(qd);
  o.block_size = bs;
  o.workers = static_cast<uint32_t>(w);
  o.direct = direct;
  return Status::OK();
}

Result<std::vector<int>> numa_node_cpus(int node) {
  if (node < 0) return std::vector<int>{};
  STRATA_ASSIGN_OR_RETURN(auto topo, Topology::system());
  const NumaNodeInfo* n = topo->numa_node(node);
  if (n == nullptr) {
    return invalid_argument("IoEngineOptions.numa_node=" + std::to_string(node) +
                            ": this machine has no NUMA node " + std::to_string(node) + " (" +
                            std::to_string(topo->numa_nodes().size()) + " nodes)");
  }
  if (n->cpus.empty()) {
    return invalid_argument("IoEngineOptions.numa_node=" + std::to_string(node) +
                            ": NUMA node " + std::to_string(node) + " has no CPUs");
  }
  // Never widen what the process was allowed (taskset, cgroup cpusets): the node's CPUs
  // within the calling thread's affinity; none of them allowed: no binding.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return n->cpus;
  std::vector<int> cpus;
  for (int c : n->cpus) {
    if (c >= 0 && c < CPU_SETSIZE && CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.empty()) {
    log_debug("I/O engine: none of NUMA node " + std::to_string(node) +
              "'s CPUs is in this thread's affinity; its threads stay unbound");
  }
  return cpus;
}

void bind_engine_thread(const std::vector<int>& cpus, int node) {
  if (cpus.empty()) return;
  auto topo = Topology::system();
  Status st = topo.ok() ? (*topo)->bind_thread_to_cpus(cpus) : topo.status();
  if (!st.ok()) {
    warn_once("io_thread_bind", "I/O engine threads stay unbound (NUMA node " +
                                    std::to_string(node) + "): " + st.to_string());
  }
}

}  // namespace io

Result<std::shared_ptr<IoEngine>> IoEngine::create(const IoEngineOptions& options) {
  if (options.numa_node >= 0) STRATA_RETURN_IF_ERROR(io::numa_node_cpus(options.numa_node).status());
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return invalid_argument("IoEngineOptions.queue_depth=" + std::to_string(options.queue_depth) +
                            ": must be in 1..4096");
  }
  if (options.block_size == 0 || options.block_size > (1ull << 30)) {
    return invalid_argument("IoEngineOptions.block_size=" + std::to_string(options.block_size) +
                            ": must be in 1..1GiB");
  }
  if (options.workers == 0 || options.workers > 64) {
    return invalid_argument("IoEngineOptions.workers=" + std::to_string(options.workers) +
                            ": must be in 1..64");
  }
  if (options.kind == EngineKind::kThreads) return io::make_threads_engine(options);
  auto r = io::make_uring_engine(options);
  if (r.ok()) return r;
  if (!options.allow_threads_fallback) {
    return Status(StatusCode::kUnavailable, "io_uring engine unavailable: " + r.status().to_string(),
                  r.status().sys_errno());
  }
  warn_once("io_uring_unavailable", "io_uring unavailable (" + r.status().to_string() +
                                        "); using the thread-pool pread/pwrite engine");
  IoEngineOptions t = options;
  t.kind = EngineKind::kThreads;
  return io::make_threads_engine(t);
}

namespace io {

FileImpl::~FileImpl() {
  if (link_ && slot_ >= 0) {
    std::lock_guard<std::mutex> lk(link_->mu);
    if (link_->owner) link_->owner->unregister_file(slot_);
  }
  if (fd_direct_ >= 0 && fd_direct_ != fd_buffered_) ::close(fd_direct_);
  if (fd_buffered_ >= 0) ::close(fd_buffered_);
}

Result<uint64_t> FileImpl::size() const {
  struct stat st;
  if (::fstat(fd_buffered_, &st) != 0) return errno_status(errno, "fstat of '" + path_ + "'");
  return static_cast<uint64_t>(st.st_size);
}

namespace {

uint32_t read_sysfs_uint(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (in >> v) return static_cast<uint32_t>(v);
  return 0;
}

const char* mode_name(OpenMode m) {
  switch (m) {
    case OpenMode::kRead: return "read";
    case OpenMode::kReadWrite: return "read-write";
    case OpenMode::kTruncate: return "truncate";
  }
  return "?";
}

}  // namespace

std::pair<uint32_t, uint32_t> dio_alignment(int fd) {
  struct statx stx;
  std::memset(&stx, 0, sizeof stx);
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align > 0 &&
      stx.stx_dio_mem_align > 0) {
    return {stx.stx_dio_offset_align, stx.stx_dio_mem_align};
  }
  // The block device holding the file: its queue, or its parent's when it is a partition.
  std::string dev = "/sys/dev/block/" + std::to_string(stx.stx_dev_major) + ":" +
                    std::to_string(stx.stx_dev_minor);
  uint32_t lbs = read_sysfs_uint(dev + "/queue/logical_block_size");
  if (lbs == 0) lbs = read_sysfs_uint(dev + "/../queue/logical_block_size");
  if (lbs == 0) lbs = 4096;
  return {lbs, lbs};
}

Result<std::shared_ptr<FileImpl>> open_file(const std::string& path, OpenMode mode,
                                            const IoEngineOptions& options,
                                            const std::shared_ptr<FileSlotLink>& link) {
  int flags = O_CLOEXEC;
  switch (mode) {
    case OpenMode::kRead: flags |= O_RDONLY; break;
    case OpenMode::kReadWrite: flags |= O_RDWR | O_CREAT; break;
    case OpenMode::kTruncate: flags |= O_RDWR | O_CREAT | O_TRUNC; break;
  }
  auto f = std::make_shared<FileImpl>();
  f->path_ = path;
  f->mode_ = mode;
  f->fd_buffered_ = ::open(path.c_str(), flags, 0644);
  if (f->fd_buffered_ < 0) {
    return errno_status(errno, std::string("open '") + path + "' (" + mode_name(mode) + ")");
  }
  struct stat st;
  if (::fstat(f->fd_buffered_, &st) == 0 && S_ISDIR(st.st_mode)) {
    return errno_status(EISDIR, "open '" + path + "': is a directory");
  }
  f->fd_direct_ = f->fd_buffered_;
  if (options.direct) {
    int dflags = (flags & ~(O_CREAT | O_TRUNC)) | O_DIRECT;
    int fd = -1;
    if (int64_t e = fault::filter(fault::Site::kOpenDirect, path, 0); e < 0) {
      errno = static_cast<int>(-e);
    } else {
      fd = ::open(path.c_str(), dflags);
    }
    if (fd >= 0) {
      f->fd_direct_ = fd;
      f->direct_ = true;
      auto [oa, ma] = dio_alignment(fd);
      f->offset_align_ = oa;
      f->memory_align_ = ma;
    } else if (errno == EINVAL && options.allow_buffered_fallback) {
      warn_once("odirect_refused",
                "O_DIRECT refused by the filesystem of '" + path +
                    "' (errno EINVAL); using buffered I/O there (warned once per process)");
    } else if (errno == EINVAL) {
      return Status(StatusCode::kInvalidArgument,
                    "open '" + path +
                        "' with O_DIRECT: refused by the filesystem (errno 22: Invalid argument)"
                        " and allow_buffered_fallback is false",
                    EINVAL);
    } else {
      return errno_status(errno, "open '" + path + "' with O_DIRECT");
    }
  }
  if (link) {
    std::lock_guard<std::mutex> lk(link->mu);
    if (link->owner) {
      f->slot_ = link->owner->register_file(f->fd_direct_, f->fd_buffered_);
      if (f->slot_ >= 0) f->link_ = link;
    }
  }
  return f;
}

std::string describe(const Piece& p) {
  const char* what = p.req->op == Op::kRead ? "read" : p.req->op == Op::kWrite ? "write" : "sync";
  return std::string(what) + " of '" + p.req->file->path_ + "' at offset " +
         std::to_string(p.offset) + ", length " + std::to_string(p.len);
}

namespace {

void record_error(Request& r, Status s) {
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.error.ok()) r.error = std::move(s);
}

void add_split(Request& r, char* buf, uint64_t rel, uint64_t len, uint64_t block,
               bool buffered, bool bounce) {
  for (uint64_t x = 0; x < len; x += block) {
    Piece p;
    p.req = &r;
    p.buffered_fd = buffered;
    p.user = buf + rel + x;
    p.len = std::min(block, len - x);
    p.offset = r.offset + rel + x;
    p.bounce = bounce ? reinterpret_cast<char*>(1) : nullptr;  // marker: allocate at issue
    r.pieces.push_back(p);
  }
}

}  // namespace

std::shared_ptr<Request> plan_request(Op op, std::shared_ptr<FileImpl> file, char* buf,
                                      uint64_t nbytes, uint64_t offset, uint64_t block_size) {
  auto r = std::make_shared<Request>();
  r->op = op;
  r->file = std::move(file);
  r->nbytes = nbytes;
  r->offset = offset;
  const FileImpl& f = *r->file;
  if (op == Op::kSync) {
    Piece p;
    p.req = r.get();
    p.buffered_fd = true;
    p.offset = 0;
    r->pieces.push_back(p);
  } else if (!f.direct_) {
    add_split(*r, buf, 0, nbytes, block_size, true, false);
  } else {
    const uint64_t oa = f.offset_align_;
    const uint64_t end = offset + nbytes;
    const uint64_t a = align_up(offset, oa);
    const uint64_t b = align_down(end, oa);
    if (a >= b) {
      add_split(*r, buf, 0, nbytes, block_size, true, false);
    } else {
      if (a > offset) add_split(*r, buf, 0, a - offset, block_size, true, false);
      const uint64_t bs = std::max<uint64_t>(oa, align_down(block_size, oa));
      const bool mem_ok = is_aligned_ptr(buf + (a - offset), f.memory_align_);
      add_split(*r, buf, a - offset, b - a, bs, false, !mem_ok);
      if (end > b) add_split(*r, buf, b - offset, end - b, block_size, true, false);
    }
  }
  for (auto& p : r->pieces) p.req = r.get();
  r->pieces_left.store(r->pieces.size());
  r->self_ = r;
  return r;
}

void prepare_piece(Piece& p) {
  if (p.bounce != reinterpret_cast<char*>(1)) return;
  const uint64_t align = std::max<uint64_t>(4096, p.req->file->memory_align_);
  void* mem = nullptr;
  if (::posix_memalign(&mem, align, align_up(p.len, align)) != 0) {
    // Out of memory for a bounce buffer: let the piece fail with ENOMEM at issue.
    p.bounce = nullptr;
    record_error(*p.req, errno_status(ENOMEM, "bounce buffer for " + describe(p)));
    p.done = p.len;
    return;
  }
  p.bounce = static_cast<char*>(mem);
  if (p.req->op == Op::kWrite) std::memcpy(p.bounce, p.user, p.len);
}

bool account_result(Piece& p, int64_t res) {
  Request& r = *p.req;
  res = fault::filter(r.op == Op::kRead    ? fault::Site::kRead
                      : r.op == Op::kWrite ? fault::Site::kWrite
                                           : fault::Site::kSync,
                      r.file->path_, res);
  if (res < 0) {
    const int e = static_cast<int>(-res);
    if ((e == EINTR || e == EAGAIN) && p.attempts < 1000) {
      ++p.attempts;
      return false;
    }
    record_error(r, errno_status(e, describe(p) + (p.done ? " (after " + std::to_string(p.done) +
                                                              " bytes)"
                                                        : std::string())));
    return true;
  }
  if (r.op == Op::kSync) return true;
  if (res == 0 && p.remaining() > 0) {
    if (r.op == Op::kRead) {
      auto sz = r.file->size();
      record_error(r, data_loss("read past the end of file: " + describe(p) + ": got " +
                                std::to_string(p.done) + " bytes, file size " +
                                (sz.ok() ? std::to_string(*sz) : std::string("unknown"))));
    } else {
      record_error(r, Status(StatusCode::kIoError,
                             describe(p) + ": the kernel wrote 0 bytes after " +
                                 std::to_string(p.done) + " bytes"));
    }
    return true;
  }
  p.done += static_cast<uint64_t>(res);
  if (p.done >= p.len) return true;
  // Short transfer: continue. A remainder that is no longer DIO-aligned goes buffered.
  const FileImpl& f = *r.file;
  if (!p.buffered_fd &&
      (!is_aligned(p.offset + p.done, f.offset_align_) ||
       !is_aligned(p.remaining(), f.offset_align_) ||
       !is_aligned_ptr(p.data(), f.memory_align_))) {
    p.buffered_fd = true;
  }
  return false;
}

void run_piece_sync(Piece& p, OccupancyTracker* occupancy) {
  prepare_piece(p);
  const FileImpl& f = *p.req->file;
  const Op op = p.req->op;
  if (occupancy != nullptr) occupancy->start(op);
  if (p.req->op == Op::kSync) {
    // EINTR/EAGAIN: account_result() counts the attempt and asks for another.
    for (;;) {
      int rc = ::fdatasync(f.fd_buffered_);
      if (account_result(p, rc == 0 ? 0 : -static_cast<int64_t>(errno))) break;
    }
  } else {
    while (p.done < p.len) {
      const int fd = p.buffered_fd ? f.fd_buffered_ : f.fd_direct_;
      ssize_t n = p.req->op == Op::kRead
                      ? ::pread(fd, p.data(), p.remaining(), static_cast<off_t>(p.offset + p.done))
                      : ::pwrite(fd, p.data(), p.remaining(), static_cast<off_t>(p.offset + p.done));
      if (account_result(p, n < 0 ? -static_cast<int64_t>(errno) : n)) break;
    }
  }
  if (occupancy != nullptr) occupancy->end(op);
  finish_piece(p);
}

void finish_piece(Piece& p) {
  Request& r = *p.req;
  if (p.bounce && p.bounce != reinterpret_cast<char*>(1)) {
    if (r.op == Op::kRead && p.done == p.len) std::memcpy(p.user, p.bounce, p.len);
    std::free(p.bounce);
    p.bounce = nullptr;
  }
  if (r.pieces_left.fetch_sub(1) != 1) return;
  std::shared_ptr<Request> keep = std::move(r.self_);
  Status err;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    err = r.error;
  }
  if (r.op == Op::kSync) {
    if (err.ok()) {
      r.void_promise.set_value();
    } else {
      r.void_promise.set_error(err);
    }
  } else if (err.ok()) {
    r.promise.set_value(r.nbytes);
  } else {
    r.promise.set_error(err);
  }
  if (r.on_done) r.on_done();
}

Status check_io_args(const std::shared_ptr<IoFile>& file, const void* buf, uint64_t nbytes,
                     bool write) {
  if (!file) return invalid_argument("I/O on a null IoFile");
  auto* f = dynamic_cast<FileImpl*>(file.get());
  if (!f) return invalid_argument("IoFile '" + file->path() + "' was not opened by an IoEngine");
  if (nbytes > 0 && buf == nullptr) {
    return invalid_argument("null buffer for " + std::to_string(nbytes) + " bytes on '" +
                            file->path() + "'");
  }
  if (write && f->mode_ == OpenMode::kRead) {
    return permission_denied("write to '" + file->path() +
                             "': the file was opened read-only (OpenMode::kRead)", EBADF);
  }
  return Status::OK();
}

Result<std::shared_ptr<IoFile>> EngineBase::open(const std::string& path, OpenMode mode) {
  STRATA_ASSIGN_OR_RETURN(auto f, open_file(path, mode, options_, slot_link()));
  return std::shared_ptr<IoFile>(std::move(f));
}

void OccupancyTracker::move(Op op, int delta) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  const double dt = std::chrono::duration<double>(now - last_).count();
  seconds_[state_locked()] += dt;
  piece_seconds_[0] += dt * static_cast<double>(reads_);
  piece_seconds_[1] += dt * static_cast<double>(writes_);
  last_ = now;
  (op == Op::kRead ? reads_ : writes_) += delta;
}

IoOccupancy OccupancyTracker::snapshot() const {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  double s[4] = {seconds_[0], seconds_[1], seconds_[2], seconds_[3]};
  const double dt = std::chrono::duration<double>(now - last_).count();  // the open interval
  s[state_locked()] += dt;
  return IoOccupancy{s[0], s[1], s[2], s[3],
                     piece_seconds_[0] + dt * static_cast<double>(reads_),
                     piece_seconds_[1] + dt * static_cast<double>(writes_)};
}

Future<uint64_t> EngineBase::submit(Op op, const std::shared_ptr<IoFile>& file, char* buf,
                                    uint64_t nbytes, uint64_t offset) {
  Status s = check_io_args(file, buf, nbytes, op == Op::kWrite);
  if (!s.ok()) return make_ready_future<uint64_t>(s);
  if (offset + nbytes < offset) {
    return make_ready_future<uint64_t>(invalid_argument(
        "offset " + std::to_string(offset) + " + length " + std::to_string(nbytes) +
        " overflows on '" + file->path() + "'"));
  }
  if (nbytes == 0) return make_ready_future<uint64_t>(uint64_t{0});
  auto r = plan_request(op, std::static_pointer_cast<FileImpl>(file), buf, nbytes, offset,
                        options_.block_size);
  Future<uint64_t> fut = r->promise.future();
  inflight_.add();
  r->on_done = [this] { inflight_.done(); };
  enqueue(r.get());
  return fut;
}

Future<uint64_t> EngineBase::read_async(const std::shared_ptr<IoFile>& file, void* dst, uint64_t nbytes,
                                        uint64_t offset) {
  return submit(Op::kRead, file, static_cast<char*>(dst), nbytes, offset);
}

Future<uint64_t> EngineBase::write_async(const std::shared_ptr<IoFile>& file, const void* src,
                                         uint64_t nbytes, uint64_t offset) {
  return submit(Op::kWrite, file, const_cast<char*>(static_cast<const char*>(src)), nbytes,
                offset);
}

Future<void> EngineBase::sync_async(const std::shared_ptr<IoFile>& file) {
  Status s = check_io_args(file, nullptr, 0, false);
  if (!s.ok()) return make_ready_future(Result<void>(s));
  auto r = plan_request(Op::kSync, std::static_pointer_cast<FileImpl>(file), nullptr, 0, 0,
                        options_.block_size);
  Future<void> fut = r->void_promise.future();
  inflight_.add();
  r->on_done = [this] { inflight_.done(); };
  enqueue(r.get());
  return fut;
}

}  // namespace io
}  // namespace strata
