// strata::store (private) — opening and closing a store, and the admission of operations
// (a closed or closing store admits none; close() waits for those in flight).
#include <fcntl.h>
#include <sys/random.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <thread>

#include "checksum.hpp"
#include "store_damage.hpp"
#include "store_dirs.hpp"
#include "store_impl.hpp"
#include "store_markers.hpp"
#include "store_paths.hpp"
#include "strata/base/logging.hpp"
#include "strata/store/placement.hpp"
#include "strata/store/topology.hpp"

namespace strata::store_detail {

namespace fs = std::filesystem;

Result<uint64_t> parse_chunk_bytes(const std::string& v, const std::string& cat_path) {
  uint64_t cb = 0;
  auto [end, err] = std::from_chars(v.data(), v.data() + v.size(), cb);
  if (err != std::errc() || end != v.data() + v.size() || cb == 0 || cb % kAlign != 0 ||
      cb > (1ull << 40)) {
    return data_loss("catalog " + cat_path + ": chunk_bytes '" + v +
                     "' is not a positive multiple of 4096 (at most 1 TiB)");
  }
  return cb;
}

namespace {

/// `d` absolute and normalized, without a trailing '/'.
std::string normalized_dir(const std::string& d) {
  std::error_code ec;
  std::string a = fs::absolute(d, ec).lexically_normal().string();
  while (a.size() > 1 && a.back() == '/') a.pop_back();
  return a;
}

}  // namespace

StoreImpl::~StoreImpl() {
  Status st = close_impl(false);
  if (!st.ok()) log_warn("store " + opts_.path + ": close: " + st.to_string());
}

// ---------------------------------------------------------------- open

Status StoreImpl::init(StoreOptions options) {
  opts_ = std::move(options);
  read_only_ = opts_.read_only;
  STRATA_RETURN_IF_ERROR(check_options());
  STRATA_RETURN_IF_ERROR(open_root());
  const std::string cat_path = opts_.path + "/catalog.db";
  STRATA_RETURN_IF_ERROR(lock_and_check_catalog(cat_path));
  STRATA_RETURN_IF_ERROR(open_catalog(cat_path));
  STRATA_RETURN_IF_ERROR(load_identity(cat_path));
  STRATA_RETURN_IF_ERROR(prepare_directories());
  STRATA_RETURN_IF_ERROR(start_engines());
  STRATA_RETURN_IF_ERROR(open_data_files());
  STRATA_RETURN_IF_ERROR(load_objects());
  STRATA_RETURN_IF_ERROR(create_pools());
  if (!read_only_) committer_ = std::thread([this] { committer_loop(); });
  STRATA_ASSIGN_OR_RETURN(pool_, ThreadPool::create(static_cast<int>(opts_.worker_threads)));
  {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    STRATA_ASSIGN_OR_RETURN(cpu_pool_, ThreadPool::create(std::clamp(cores - 1, 1, 8)));
  }
  started_ = true;
  if (opts_.stats_interval.count() > 0) {
    stats_logger_ = std::make_unique<StatsLogger>(opts_.path, opts_.stats_interval,
                                                  [this] { return stats(); });
  }
  return Status::OK();
}

Status StoreImpl::check_options() const {
  STRATA_RETURN_IF_ERROR(check_store_paths(opts_));  // empty/NUL, duplicate dirs
  if (opts_.numa_node != kNumaAuto) {  // before anything is created
    // Nodes only of this machine's topology (with HWLOC_XMLFILE naming another one, nothing
    // is bound: see plan_placement()).
    auto topo = Topology::system();
    if (topo.ok() && (*topo)->is_this_system()) {
      STRATA_RETURN_IF_ERROR(check_numa_node_option(**topo, opts_.numa_node));
    } else if (opts_.numa_node < kNumaNone) {
      return invalid_argument("StoreOptions.numa_node=" + std::to_string(opts_.numa_node) +
                              ": expected a node number, -1 (automatic) or -2 (none)");
    }
  }
  if (opts_.chunk_bytes == 0 || opts_.chunk_bytes % kAlign != 0) {
    return invalid_argument("StoreOptions.chunk_bytes " + std::to_string(opts_.chunk_bytes) +
                            " is not a positive multiple of 4096");
  }
  if (opts_.staging_bytes < 2 * kAlign) {
    return invalid_argument("StoreOptions.staging_bytes " + std::to_string(opts_.staging_bytes) +
                            " is below 8 KiB");
  }
  if (opts_.worker_threads == 0) return invalid_argument("StoreOptions.worker_threads is 0");
  if (opts_.pinned_grow_bytes == 0) {
    return invalid_argument("StoreOptions.pinned_grow_bytes is 0 (the least bytes a pinned pool "
                            "commits when it grows; default 64 MiB)");
  }
  if ((opts_.pinned_allocator.alloc == nullptr) != (opts_.pinned_allocator.free == nullptr)) {
    return invalid_argument(std::string("StoreOptions.pinned_allocator: ") +
                            (opts_.pinned_allocator.alloc ? "free" : "alloc") +
                            " is null (set both functions or neither)");
  }
  if (opts_.stats_interval.count() < 0) {
    return invalid_argument("StoreOptions.stats_interval is negative (" +
                            std::to_string(opts_.stats_interval.count()) + " ms)");
  }
  if (opts_.worker_threads > StoreOptions::kMaxWorkerThreads) {
    return invalid_argument("StoreOptions.worker_threads " + std::to_string(opts_.worker_threads) +
                            " is above " + std::to_string(StoreOptions::kMaxWorkerThreads));
  }
  return Status::OK();
}

Status StoreImpl::open_root() {
  std::error_code ec;
  const std::string& root = opts_.path;
  if (!fs::is_directory(root, ec)) {
    if (!opts_.create || read_only_) return not_found("no store at " + root);
    fs::create_directories(root, ec);
    if (ec) return errno_status(ec.value(), "create store directory " + root);
  }
  opts_.path = normalized_dir(root);
  return Status::OK();
}

Status StoreImpl::lock_and_check_catalog(const std::string& cat_path) {
  const std::string& root = opts_.path;
  std::error_code ec;
  bool fresh = !fs::exists(cat_path, ec);
  if (fresh && !opts_.recreate_catalog) {  // data files without their catalog: DataLoss
    STRATA_RETURN_IF_ERROR(check_orphaned_data(cat_path, root, opts_.nvme_dirs));
  }
  // Opening without `create` leaves a directory that is not a store untouched (no LOCK).
  if (fresh && (read_only_ || !opts_.create)) return not_found("no store catalog at " + cat_path);

  // Opening without `create` leaves a directory whose catalog.db is not a strata catalog
  // (e.g. 0 bytes) untouched too: check before the LOCK is written.
  if (!fresh && !read_only_ && !opts_.create) {
    auto probe = catalog::Catalog::open(cat_path, false, true);
    if (!probe.ok() && probe.status().code() == StatusCode::kDataLoss) return probe.status();
  }
  // Lock first: a second writer must fail before touching anything.
  if (!read_only_) STRATA_RETURN_IF_ERROR(acquire_lock(root));

  fresh = !fs::exists(cat_path, ec);  // again, under the lock
  if (fresh && (read_only_ || !opts_.create)) return not_found("no store catalog at " + cat_path);
  if (fresh && !opts_.recreate_catalog) {
    STRATA_RETURN_IF_ERROR(check_orphaned_data(cat_path, root, opts_.nvme_dirs));
  }
  return Status::OK();
}

Status StoreImpl::open_catalog(const std::string& cat_path) {
  if (!read_only_) {
    // On a (nearly) full file system SQLite cannot even open the catalog in WAL mode:
    // release the ballast first. It is recreated in load_objects() once the data files
    // are trimmed.
    std::error_code ec;
    ballast_path_ = opts_.path + "/catalog.ballast";
    ballast_missing_ = !fs::exists(ballast_path_, ec);
    struct statvfs vfs;
    if (!ballast_missing_ && ::statvfs(opts_.path.c_str(), &vfs) == 0 &&
        static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < 2 * kBallastBytes) {
      release_ballast();
    }
  }
  STRATA_ASSIGN_OR_RETURN(catalog_, catalog::Catalog::open(cat_path, opts_.create, read_only_));
  return Status::OK();
}

Status StoreImpl::load_identity(const std::string& cat_path) {
  const std::string& root = opts_.path;
  // Store identity and layout: recorded at creation, checked at reopen.
  STRATA_ASSIGN_OR_RETURN(auto uuid, catalog_->get_meta("store_uuid"));
  std::vector<std::string> want;
  for (const auto& d : opts_.nvme_dirs) want.push_back(normalized_dir(d));
  if (want.empty()) want.push_back(root);
  if (!uuid) {
    if (read_only_) return data_loss("catalog " + cat_path + " has no store_uuid");
    unsigned char rnd[8];
    if (::getrandom(rnd, sizeof rnd, 0) != sizeof rnd) return errno_status(errno, "getrandom");
    uint64_t v;
    std::memcpy(&v, rnd, sizeof v);
    uuid_ = hex64(v);
    std::string joined;
    for (auto& d : want) joined += encode_dir(root, d) + "\n";
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("format", "1"));
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("chunk_bytes", std::to_string(opts_.chunk_bytes)));
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("nvme_dirs", joined));
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("store_uuid", uuid_));
    dirs_ = want;
    chunk_bytes_ = opts_.chunk_bytes;
  } else {
    uuid_ = *uuid;
    STRATA_ASSIGN_OR_RETURN(auto cb, catalog_->get_meta("chunk_bytes"));
    STRATA_ASSIGN_OR_RETURN(auto nd, catalog_->get_meta("nvme_dirs"));
    if (!cb || !nd) return data_loss("catalog " + cat_path + " lacks chunk_bytes/nvme_dirs");
    STRATA_ASSIGN_OR_RETURN(chunk_bytes_, parse_chunk_bytes(*cb, cat_path));
    STRATA_ASSIGN_OR_RETURN(dirs_, parse_dirs_record(root, *nd, cat_path));
    if (!opts_.nvme_dirs.empty() && want != dirs_) {
      std::string rec;
      for (auto& d : dirs_) rec += (rec.empty() ? "" : ", ") + d;
      return invalid_argument("store " + root + " was created with nvme_dirs [" + rec +
                              "]; reopen it with the same directories (or none)");
    }
  }
  opts_.nvme_dirs = dirs_;
  opts_.chunk_bytes = chunk_bytes_;
  return Status::OK();
}

Status StoreImpl::prepare_directories() {
  const std::string& root = opts_.path;
  {  // NVMe directories and data files must carry this store's identity (store_dirs.cpp).
    STRATA_ASSIGN_OR_RETURN(auto held, catalog_->chunks_per_dir(dirs_.size()));
    STRATA_RETURN_IF_ERROR(prepare_nvme_dirs(root, uuid_, dirs_, held, read_only_));
    if (!read_only_) STRATA_RETURN_IF_ERROR(record_dirs_relocatable(*catalog_, root, dirs_));
  }
  std::error_code ec;
  dir_dirty_.reset(new std::atomic<bool>[dirs_.size()]);
  file_end_.reset(new std::atomic<uint64_t>[dirs_.size()]);
  for (size_t i = 0; i < dirs_.size(); ++i) {
    dir_dirty_[i].store(false);
    file_end_[i].store(0);
    if (!fs::is_directory(dirs_[i], ec)) {
      if (read_only_) return not_found("nvme directory " + dirs_[i] + " is missing");
      STRATA_RETURN_IF_ERROR(create_nvme_dir(dirs_[i]));
    }
  }
  return Status::OK();
}

Status StoreImpl::start_engines() {
  // NUMA placement, then one engine per node of the directories (its threads bound there),
  // or the shared engine for all.
  has_device_ = device_available(opts_.device_id);
  STRATA_RETURN_IF_ERROR(set_device_stream(opts_.device_stream));
  STRATA_RETURN_IF_ERROR(plan_placement());
  dir_group_.resize(dirs_.size());
  for (size_t i = 0; i < dirs_.size(); ++i) {
    const int node = placement_.dir_nodes[i];
    size_t g = 0;
    while (g < groups_.size() && groups_[g].node != node) ++g;
    if (g == groups_.size()) {
      IoGroup grp;
      grp.node = node;
      if (opts_.engine) {
        grp.engine = opts_.engine;
      } else {
        IoEngineOptions eo = opts_.engine_options;
        if (eo.numa_node < 0) eo.numa_node = node;
        STRATA_ASSIGN_OR_RETURN(grp.engine, IoEngine::create(eo));
      }
      groups_.push_back(std::move(grp));
    }
    dir_group_[i] = static_cast<uint32_t>(g);
  }
  engine_ = groups_[0].engine;
  return Status::OK();
}

Status StoreImpl::plan_placement() {
  const int opt = opts_.numa_node;
  auto topo = Topology::system();
  if (topo.ok() && (*topo)->is_this_system()) {
    auto p = plan_store_placement_for_paths(**topo, dirs_, has_device_ ? opts_.device_id : -1,
                                            opt);
    if (p.ok()) {
      placement_ = std::move(*p);
      log_debug("store " + opts_.path + ": NUMA placement:\n" + placement_.describe(dirs_));
      return Status::OK();
    }
    if (p.status().code() == StatusCode::kInvalidArgument) return p.status();
    log_warn("store " + opts_.path + ": no NUMA placement (" + p.status().to_string() + ")");
  } else if (!topo.ok()) {
    log_warn("store " + opts_.path + ": no NUMA placement (" + topo.status().to_string() + ")");
  }
  // No topology of this machine (e.g. HWLOC_XMLFILE names another one): no binding, as
  // nodes of another machine's topology cannot be bound here. (init() refused bad values.)
  if (opt >= 0) {
    log_warn("store " + opts_.path + ": StoreOptions.numa_node=" + std::to_string(opt) +
             " ignored: the loaded topology is not this machine's (HWLOC_XMLFILE or "
             "HWLOC_SYNTHETIC?)");
  }
  placement_ = StorePlacement{};
  placement_.dir_devices.assign(dirs_.size(), "");
  placement_.dir_nodes.assign(dirs_.size(), -1);
  return Status::OK();
}

Status StoreImpl::open_data_files() {
  // Data files: <dir>/strata-<uuid>.data, one per NVMe directory.
  std::error_code ec;
  for (size_t i = 0; i < dirs_.size(); ++i) {
    const std::string fpath = data_file_path(dirs_[i], uuid_);
    bool existed = fs::exists(fpath, ec);
    if (existed) file_end_[i].store(fs::file_size(fpath, ec));
    auto f = io(static_cast<uint32_t>(i)).open(fpath, read_only_ ? OpenMode::kRead
                                                                 : OpenMode::kReadWrite);
    if (!f.ok()) {
      if (read_only_ && !existed) {
        files_.push_back(nullptr);
        continue;
      }
      return f.status();
    }
    files_.push_back(*f);
    if (!existed) STRATA_RETURN_IF_ERROR(fsync_directory(dirs_[i]));
    if (!read_only_) {
      int fd = ::open(fpath.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return errno_status(errno, "open " + fpath);
      grow_fds_.push_back(fd);
    }
  }
  return Status::OK();
}

Status StoreImpl::load_objects() {
  // Catalog -> in-memory objects; committed extents are in use, everything else is free.
  // Large extents start on a block-size boundary (ExtentAllocator's class comment): the
  // largest power of two that is at most the engine's block size and kHashPiece (a direct
  // read's request size), at least 4 KiB.
  const uint64_t align =
      std::max(kAlign, std::bit_floor(std::min(engine_->options().block_size, kHashPiece)));
  alloc_ = std::make_shared<ExtentAllocator>(static_cast<uint32_t>(dirs_.size()),
                                             opts_.nvme_budget_bytes, align);
  STRATA_ASSIGN_OR_RETURN(auto rows, catalog_->load_all());
  ExtentClaims claims(dirs_.size(), chunk_bytes_);  // overlapping rows: damaged
  std::vector<bool> adopt;
  for (auto& r : rows) {
    std::string overlap = claims.claim(r, &adopt);
    ObjPtr o = obj_from_row(r, adopt, true);
    if (o->damage.empty()) o->damage = overlap;
    if (!o->damage.empty()) {
      log_warn("store " + opts_.path + ": damaged catalog row: " + o->damage);
      keep_unreferenced_space_ = true;
    }
    durable_[r.key] = o->current;
    objects_[r.key] = o;
  }
  STRATA_RETURN_IF_ERROR(alloc_->finish_load());
  next_dir_ = static_cast<uint32_t>(rows.size());
  // Space preallocated past the last committed extent (growth slack of a process that
  // crashed, or an older version of strata) goes back to the file system.
  if (!read_only_) {
    trim_data_files();
    restore_ballast();  // best effort: a store on a full file system still opens
  }
  return Status::OK();
}

Status StoreImpl::create_pools() {
  piece_bytes_ = std::max<uint64_t>(
      kAlign, align_down(std::min<uint64_t>(chunk_bytes_, opts_.staging_bytes / 8), kAlign));
  // Staging memory: staging_bytes per group, on the group's node. The host tier: on
  // placement_.host_node, registered with the engine of that node's directories (if any).
  // Each pool commits pinned_initial_bytes now and grows by pinned_grow_bytes on demand.
  PinnedPoolOptions so;
  so.budget_bytes = align_up(opts_.staging_bytes, kAlign);
  so.initial_bytes = opts_.pinned_initial_bytes;
  so.grow_bytes = opts_.pinned_grow_bytes;
  so.allocator = opts_.pinned_allocator;
  for (auto& g : groups_) {
    so.numa_node = g.node;
    so.name = "store " + opts_.path + ": staging pool" +
              (g.node >= 0 ? " (NUMA node " + std::to_string(g.node) + ")" : std::string());
    STRATA_ASSIGN_OR_RETURN(g.staging, PinnedPool::create(so, g.engine));
  }
  if (opts_.host_budget_bytes > 0 && !read_only_) {
    PinnedPoolOptions ho = so;
    ho.budget_bytes = align_up(opts_.host_budget_bytes, kAlign);
    ho.numa_node = placement_.host_node;
    ho.name = "store " + opts_.path + ": host tier pool";
    std::shared_ptr<IoEngine> he = engine_;
    for (const auto& g : groups_) {
      if (g.node == placement_.host_node) he = g.engine;
    }
    STRATA_ASSIGN_OR_RETURN(host_pool_, PinnedPool::create(ho, he));
  }
  if (has_device_) {
    device_budget_ = opts_.device_budget_bytes ? opts_.device_budget_bytes
                                               : device_free_bytes(opts_.device_id) / 2;
  }
  return Status::OK();
}

// ---------------------------------------------------------------- close

Status StoreImpl::close_impl(bool stay_open_on_failure) {
  {
    std::unique_lock<std::mutex> lk(ops_mu_);
    for (;;) {
      if (closed_) return Status::OK();
      if (!closing_) break;
      // Another thread is closing: wait until it has closed, or failed and reopened.
      ops_cv_.wait(lk, [&] { return closed_.load() || !closing_; });
    }
    closing_ = true;
  }
  Status st;
  if (!read_only_ && started_) {
    // Wait for the operations in flight, then make everything durable.
    {
      std::unique_lock<std::mutex> lk(ops_mu_);
      ops_cv_.wait(lk, [&] { return ops_in_flight_ == 0; });
    }
    st = flush_impl(nullptr);  // held keys stay uncommitted
    if (!st.ok() && stay_open_on_failure) {
      // Dirty objects could not be written back (e.g. ENOSPC, the NVMe budget): closing
      // now would drop them. Stay open so that the caller can make room and close again.
      {
        std::lock_guard<std::mutex> lk(ops_mu_);
        closing_ = false;
      }
      ops_cv_.notify_all();
      return st.with_context("close: the store stays open (dirty objects were not written "
                             "back; make room and close again, or destroy it to drop them)");
    }
  }
  {
    std::unique_lock<std::mutex> lk(ops_mu_);
    ops_cv_.wait(lk, [&] { return ops_in_flight_ == 0; });
  }
  if (stats_logger_) stats_logger_->stop();
  if (pool_) pool_->shutdown();  // runs what is queued, then joins
  if (committer_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(commit_mu_);
      commit_stop_ = true;
    }
    commit_cv_.notify_all();
    committer_.join();
  }
  // Give back the growth slack while every live version still holds its extents.
  if (!read_only_ && started_) {
    give_back_free_space(/*keep_warm=*/false);  // a closed store holds what its objects take
    trim_data_files();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    host_lru_.clear();
    device_lru_.clear();
    objects_.clear();
    durable_.clear();
  }
  for (auto& g : groups_) g.engine->drain();
  if (cpu_pool_) cpu_pool_->shutdown();  // after the engines: no completion posts to it now
  files_.clear();
  for (int fd : grow_fds_) ::close(fd);
  grow_fds_.clear();
  catalog_.reset();
  host_pool_.reset();
  for (auto& g : groups_) g.staging.reset();
  release_lock();
  {
    std::lock_guard<std::mutex> lk(ops_mu_);
    closed_ = true;
  }
  ops_cv_.notify_all();
  return st;
}

// ---------------------------------------------------------------- admission

Status StoreImpl::check_writable() const {
  if (read_only_) return failed_precondition("store " + opts_.path + " is open read-only");
  return Status::OK();
}

Status StoreImpl::begin_op(bool mutating) const {
  if (mutating) STRATA_RETURN_IF_ERROR(check_writable());
  std::lock_guard<std::mutex> lk(ops_mu_);
  if (closing_ || closed_) return failed_precondition("store " + opts_.path + " is closed");
  ++ops_in_flight_;
  return Status::OK();
}

void StoreImpl::end_op() const {
  {
    std::lock_guard<std::mutex> lk(ops_mu_);
    --ops_in_flight_;
  }
  ops_cv_.notify_all();
}

}  // namespace strata::store_detail
