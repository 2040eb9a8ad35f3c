// Partitioned objects: put/fetch over ranks, reduce-scatter into owned slices.
// See store/include/strata/store/partitioned.hpp and docs/partitioned.md.
#include "strata/store/partitioned.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <utility>

#include "partition_record.hpp"
#include "strata/base/units.hpp"

namespace strata {
namespace {

constexpr size_t kAgreeRecord = 256;  // bytes per rank in agree(): int32 code + message

std::string data_key(const std::string& key) { return key + kPartitionDataSuffix; }
std::string meta_key(const std::string& key) { return key + kPartitionMetaSuffix; }

// 4096-aligned host buffer (O_DIRECT reads go straight into it).
struct AlignedBuffer {
  uint8_t* p = nullptr;
  size_t n = 0;
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t nbytes) : n(nbytes) {
    if (nbytes) p = static_cast<uint8_t*>(std::aligned_alloc(4096, align_up(nbytes, 4096)));
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept : p(std::exchange(o.p, nullptr)), n(o.n) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~AlignedBuffer() { std::free(p); }
  bool failed() const { return n && !p; }
};

// Runs `fn` (a blocking composite collective returning Status) on `comm`'s composite queue
// (Communicator::run_composite_async): one worker owned by the communicator, so the
// operations of one communicator run in the order they were issued, as every rank issues
// them, and none outlives the communicator (its destructor runs them first). Not the
// communicator's operation queue: `fn` blocks on collectives queued there (it would wait
// for itself); not the store's workers either: `fn` waits for store reads and writes that
// need a free worker (with worker_threads = 1 it would wait for itself).
template <class Fn>
Future<void> run_composite(Communicator& comm, Fn fn) {
  return comm.run_composite_async(std::function<Status()>(std::move(fn)));
}

Future<void> ready_error(Status st) { return make_ready_future(Result<void>(std::move(st))); }

Status check_comm(Communicator& comm, const char* what) {
  if (comm.backend() != Backend::kGloo) {
    return unimplemented(std::string(what) +
                         ": partitioned objects support host memory (a Gloo communicator) only");
  }
  return Status::OK();
}

// Every rank contributes its local status; all learn every rank's. Returns the local
// error when there is one, else Unavailable naming the first failed rank and its message,
// else OK. Communicator failures are returned with `what` as context.
Status agree(Communicator& comm, const Status& local, const std::string& what) {
  const int n = comm.size();
  std::vector<uint8_t> mine(kAgreeRecord, 0), all(kAgreeRecord * static_cast<size_t>(n), 0);
  int32_t code = static_cast<int32_t>(local.code());
  std::memcpy(mine.data(), &code, sizeof(code));
  if (!local.ok()) {
    std::string msg = local.to_string();
    std::memcpy(mine.data() + 4, msg.data(), std::min(msg.size(), kAgreeRecord - 5));
  }
  Status st = comm.all_gather(mine.data(), all.data(), kAgreeRecord, DType::kUInt8);
  if (!st.ok()) return st.with_context(what);
  if (!local.ok()) return local;
  for (int r = 0; r < n; ++r) {
    const uint8_t* rec = all.data() + kAgreeRecord * static_cast<size_t>(r);
    int32_t c;
    std::memcpy(&c, rec, sizeof(c));
    if (c != 0) {
      std::string msg(reinterpret_cast<const char*>(rec + 4),
                      strnlen(reinterpret_cast<const char*>(rec + 4), kAgreeRecord - 4));
      return unavailable(what + ": rank " + std::to_string(r) + " failed (" + msg + ")");
    }
  }
  return Status::OK();
}

std::string describe(const TensorDesc& d) { return to_string(d); }

Status put_impl(Store& store, Communicator& comm, const std::string& key, const uint8_t* owned,
                const TensorDesc& full, const PartitionOptions& opts) {
  const int n = comm.size(), r = comm.rank();
  const std::string what = "put_partitioned '" + key + "'";
  Status local;
  auto layout = partition_layout(full.numel(), n);
  if (!layout.ok()) {
    local = layout.status();
  } else {
    const uint64_t own = layout->owned_numel(r);
    const std::string dk = data_key(key), mk = meta_key(key);
    auto run = [&]() -> Status {
      if (opts.put.overwrite && store.contains(mk)) STRATA_RETURN_IF_ERROR(store.remove(mk));
      if (own > 0) {
        TensorDesc sd{full.dtype, {static_cast<int64_t>(own)}};
        STRATA_RETURN_IF_ERROR(store.put(dk, owned, sd, opts.put));
      } else if (opts.put.overwrite && store.contains(dk)) {
        STRATA_RETURN_IF_ERROR(store.remove(dk));
      }
      std::vector<uint8_t> meta = store_detail::encode_partition_meta(*layout, r, full);
      PutOptions mo = opts.put;
      mo.pin = false;
      return store.put(mk, meta.data(), TensorDesc::bytes(meta.size()), mo);
    };
    local = run();
    if (!local.ok()) local = local.with_context(what + " (rank " + std::to_string(r) + ")");
  }
  return agree(comm, local, what);
}

// Copies piece k of every rank from `stage` (N blocks of `len` elements) into dst.
void scatter_out(uint8_t* dst, const uint8_t* stage, const PartitionLayout& l, uint64_t piece0,
                 uint64_t len, uint64_t es) {
  for (int s = 0; s < l.world_size; ++s) {
    uint64_t g = static_cast<uint64_t>(s) * l.chunk_numel + piece0;
    if (g >= l.numel) break;
    uint64_t cnt = std::min(len, l.numel - g);
    std::memcpy(dst + g * es, stage + static_cast<uint64_t>(s) * len * es, cnt * es);
  }
}

Status validate_local(Store& store, const std::string& key, const TensorDesc& full,
                      const PartitionLayout& l, int rank) {
  STRATA_ASSIGN_OR_RETURN(PartitionInfo info, stat_partitioned(store, key));
  if (info.world_size != l.world_size) {
    return failed_precondition("'" + key + "' was stored over " +
                               std::to_string(info.world_size) + " ranks, fetched over " +
                               std::to_string(l.world_size));
  }
  if (info.rank != rank) {
    return failed_precondition("the store of rank " + std::to_string(rank) + " holds rank " +
                               std::to_string(info.rank) + "'s slice of '" + key + "'");
  }
  if (info.desc.dtype != full.dtype || info.desc.shape != full.shape) {
    return invalid_argument("'" + key + "' is " + describe(info.desc) + ", fetched as " +
                            describe(full));
  }
  const uint64_t own_bytes = l.owned_numel(rank) * dtype_size(full.dtype);
  if (own_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(ObjectInfo oi, store.stat(data_key(key)));
    if (oi.nbytes != own_bytes) {
      return data_loss("slice '" + data_key(key) + "' holds " + std::to_string(oi.nbytes) +
                       " bytes, expected " + std::to_string(own_bytes));
    }
  }
  return Status::OK();
}

Status fetch_impl(Store& store, Communicator& comm, const std::string& key, uint8_t* dst,
                  const TensorDesc& full, const PartitionOptions& opts) {
  const int n = comm.size(), r = comm.rank();
  const std::string what = "fetch_partitioned '" + key + "'";
  auto layout_r = partition_layout(full.numel(), n);
  Status local = layout_r.status();
  if (local.ok()) local = validate_local(store, key, full, *layout_r, r);
  if (!local.ok()) local = local.with_context("rank " + std::to_string(r));
  STRATA_RETURN_IF_ERROR(agree(comm, local, what));
  const PartitionLayout l = *layout_r;
  const uint64_t es = dtype_size(full.dtype);
  const uint64_t c = l.chunk_numel, own = l.owned_numel(r);
  if (l.numel == 0) return Status::OK();
  const std::string dk = data_key(key);

  if (n == 1) {  // nothing to gather: read straight into dst
    Status st = store.read_range(dk, 0, own * es, dst);
    return st.with_context(what);
  }

  // Pieces cover whole store chunks: a read_range verifies whole chunks, so a piece smaller
  // than a chunk would read (and checksum) the chunk once per piece.
  const uint64_t piece_bytes = effective_piece_bytes(opts.piece_bytes, store.chunk_bytes());
  const uint64_t p = std::min<uint64_t>(piece_bytes / es, c);  // elements per piece
  const uint64_t k_pieces = (c + p - 1) / p;
  auto piece_len = [&](uint64_t k) { return std::min(p, c - k * p); };
  // Owned bytes of piece k (the rest of the piece is padding).
  auto piece_read = [&](uint64_t k) {
    uint64_t b = k * p;
    return b >= own ? uint64_t{0} : std::min(piece_len(k), own - b);
  };

  // Zero-copy case: no padding and one piece -> read into our place in dst, gather in place.
  if (k_pieces == 1 && l.padded_numel() == l.numel) {
    uint8_t* mine = dst + static_cast<uint64_t>(r) * c * es;
    Status rd = store.read_range(dk, 0, own * es, mine);
    if (!rd.ok()) std::memset(mine, 0, own * es);
    Status g = comm.all_gather(mine, dst, c * es, DType::kUInt8);
    if (!g.ok()) return g.with_context(what);
    return agree(comm, rd.with_context("rank " + std::to_string(r)), what);
  }

  // Buffers: read ring of 3 pieces (or the whole slice when sequential), staging ring of 2.
  const bool seq = !opts.pipelined;
  std::vector<AlignedBuffer> rbuf;
  if (seq) {
    rbuf.emplace_back(c * es);
  } else {
    for (int i = 0; i < 3; ++i) rbuf.emplace_back(p * es);
  }
  AlignedBuffer stage[2] = {AlignedBuffer(p * es * n), AlignedBuffer(p * es * n)};
  for (auto& b : rbuf)
    if (b.failed()) return resource_exhausted(what + ": no memory for read buffers");
  if (stage[0].failed() || stage[1].failed())
    return resource_exhausted(what + ": no memory for staging buffers");

  Status read_err;  // first local read error: reported to every rank at the end
  auto send_ptr = [&](uint64_t k) -> uint8_t* {
    return seq ? rbuf[0].p + k * p * es : rbuf[k % 3].p;
  };
  auto issue_read = [&](uint64_t k) -> Future<void> {
    uint8_t* b = send_ptr(k);
    uint64_t nr = piece_read(k), len = piece_len(k);
    if (nr < len) std::memset(b + nr * es, 0, (len - nr) * es);  // padding
    if (nr == 0) return make_ready_future();
    return store.read_range_async(dk, k * p * es, nr * es, b);
  };
  auto finish_read = [&](uint64_t k, const Future<void>& f) {
    const Result<void>& res = f.result();
    if (!res.ok()) {
      if (read_err.ok())
        read_err = res.status().with_context("rank " + std::to_string(r) + " reading '" + dk + "'");
      std::memset(send_ptr(k), 0, piece_len(k) * es);  // keep the collectives going
    }
  };

  std::deque<Future<void>> pending;  // everything in flight, waited before returning
  auto drain = [&] {
    for (auto& f : pending) f.wait();
  };

  if (seq) {
    // Sequential baseline: the whole slice first, then the gathers.
    std::vector<Future<void>> reads;
    for (uint64_t k = 0; k < k_pieces; ++k) reads.push_back(issue_read(k));
    for (uint64_t k = 0; k < k_pieces; ++k) finish_read(k, reads[k]);
  }

  Future<void> read_next = seq ? make_ready_future() : issue_read(0);
  Future<void> prev_gather;
  for (uint64_t k = 0; k < k_pieces; ++k) {
    if (!seq) finish_read(k, read_next);
    const uint64_t len = piece_len(k);
    Future<void> g = comm.all_gather_async(send_ptr(k), stage[k % 2].p, len * es, DType::kUInt8);
    pending.push_back(g);
    // Read k+1 into the ring slot last used by gather k-2 (already complete).
    if (!seq && k + 1 < k_pieces) {
      read_next = issue_read(k + 1);
      pending.push_back(read_next);
    }
    if (k > 0) {
      const Result<void>& gr = prev_gather.result();
      if (!gr.ok()) {
        drain();
        return gr.status().with_context(what);
      }
      scatter_out(dst, stage[(k - 1) % 2].p, l, (k - 1) * p, piece_len(k - 1), es);
    }
    prev_gather = g;
    while (pending.size() > 8) pending.pop_front();  // old entries are complete
  }
  const Result<void>& gr = prev_gather.result();
  if (!gr.ok()) {
    drain();
    return gr.status().with_context(what);
  }
  scatter_out(dst, stage[(k_pieces - 1) % 2].p, l, (k_pieces - 1) * p, piece_len(k_pieces - 1),
              es);
  drain();
  return agree(comm, read_err, what);
}

Status reduce_scatter_impl(Communicator& comm, const uint8_t* full, uint8_t* owned,
                           const PartitionLayout& l, DType dtype, ReduceOp op,
                           uint64_t piece_bytes) {
  const int n = comm.size(), r = comm.rank();
  const uint64_t es = dtype_size(dtype), c = l.chunk_numel, own = l.owned_numel(r);
  const uint64_t p = std::min<uint64_t>(std::max<uint64_t>(piece_bytes / es, 1), c);
  const uint64_t k_pieces = (c + p - 1) / p;
  auto piece_len = [&](uint64_t k) { return std::min(p, c - k * p); };
  AlignedBuffer pack[2] = {AlignedBuffer(p * es * n), AlignedBuffer(p * es * n)};
  AlignedBuffer out[2] = {AlignedBuffer(p * es), AlignedBuffer(p * es)};
  for (auto* b : {&pack[0], &pack[1], &out[0], &out[1]})
    if (b->failed()) return resource_exhausted("reduce_scatter_grads: no memory for packing");
  auto pack_piece = [&](uint64_t k) {
    const uint64_t len = piece_len(k);
    uint8_t* b = pack[k % 2].p;
    for (int s = 0; s < n; ++s) {
      uint64_t g = static_cast<uint64_t>(s) * c + k * p;
      uint64_t cnt = g >= l.numel ? 0 : std::min(len, l.numel - g);
      uint8_t* d = b + static_cast<uint64_t>(s) * len * es;
      if (cnt) std::memcpy(d, full + g * es, cnt * es);
      if (cnt < len) std::memset(d + cnt * es, 0, (len - cnt) * es);
    }
  };
  auto deliver = [&](uint64_t k) {  // owned part of out[k%2] -> owned slice
    uint64_t b = k * p;
    if (b >= own) return;
    std::memcpy(owned + b * es, out[k % 2].p, std::min(piece_len(k), own - b) * es);
  };
  pack_piece(0);
  Future<void> prev;
  for (uint64_t k = 0; k < k_pieces; ++k) {
    Future<void> f =
        comm.reduce_scatter_async(pack[k % 2].p, out[k % 2].p, piece_len(k), dtype, op);
    if (k > 0) {
      const Result<void>& pr = prev.result();
      if (!pr.ok()) {
        f.wait();
        return pr.status().with_context("reduce_scatter_grads");
      }
      deliver(k - 1);
    }
    if (k + 1 < k_pieces) pack_piece(k + 1);  // pack[(k+1)%2] was used by piece k-1: done
    prev = f;
  }
  const Result<void>& pr = prev.result();
  if (!pr.ok()) return pr.status().with_context("reduce_scatter_grads");
  deliver(k_pieces - 1);
  return Status::OK();
}

}  // namespace

uint64_t effective_piece_bytes(uint64_t piece_bytes, uint64_t store_chunk_bytes) {
  const uint64_t unit = std::max<uint64_t>(align_up(std::max<uint64_t>(store_chunk_bytes, 1), 4096), 4096);
  return align_up(std::max<uint64_t>(piece_bytes, 1), unit);
}

uint64_t PartitionLayout::begin(int rank) const {
  return std::min(static_cast<uint64_t>(rank) * chunk_numel, numel);
}
uint64_t PartitionLayout::end(int rank) const {
  return std::min((static_cast<uint64_t>(rank) + 1) * chunk_numel, numel);
}

Result<PartitionLayout> partition_layout(uint64_t numel, int world_size) {
  if (world_size < 1) {
    return invalid_argument("partition_layout: world_size " + std::to_string(world_size) +
                            " < 1");
  }
  PartitionLayout l;
  l.numel = numel;
  l.world_size = world_size;
  l.chunk_numel = (numel + static_cast<uint64_t>(world_size) - 1) / static_cast<uint64_t>(world_size);
  return l;
}

Result<PartitionInfo> stat_partitioned(Store& store, const std::string& key) {
  const std::string mk = meta_key(key);
  STRATA_ASSIGN_OR_RETURN(ObjectInfo oi, store.stat(mk));
  std::vector<uint8_t> b(oi.nbytes);
  STRATA_RETURN_IF_ERROR(store.get_bytes(mk, b.data(), b.size()));
  return store_detail::decode_partition_meta(key, mk, b.data(), b.size());
}

Status remove_partitioned(Store& store, const std::string& key) {
  const std::string dk = data_key(key), mk = meta_key(key);
  const bool has_meta = store.contains(mk), has_data = store.contains(dk);
  if (!has_meta && !has_data) return not_found("no partitioned object '" + key + "' in this store");
  if (has_meta) STRATA_RETURN_IF_ERROR(store.remove(mk));
  if (has_data) STRATA_RETURN_IF_ERROR(store.remove(dk));
  return Status::OK();
}

Future<void> put_partitioned_async(Store& store, Communicator& comm, const std::string& key,
                                   const void* full_src, const TensorDesc& full_desc,
                             const PartitionOptions& opts) {
  if (Status st = check_comm(comm, "put_partitioned"); !st.ok()) return ready_error(st);
  if (!dtype_is_valid(full_desc.dtype))
    return ready_error(invalid_argument("put_partitioned '" + key + "': invalid dtype"));
  auto l = partition_layout(full_desc.numel(), comm.size());
  if (!l.ok()) return ready_error(l.status());
  const uint8_t* owned = static_cast<const uint8_t*>(full_src);
  if (full_desc.nbytes() > 0 && full_src == nullptr) {
    return ready_error(invalid_argument("put_partitioned '" + key + "': full_src is null"));
  }
  if (owned) owned += l->begin(comm.rank()) * dtype_size(full_desc.dtype);
  return put_partitioned_slice_async(store, comm, key, owned, full_desc, opts);
}

Future<void> put_partitioned_slice_async(Store& store, Communicator& comm, const std::string& key,
                                         const void* owned_src, const TensorDesc& full_desc,
                                   const PartitionOptions& opts) {
  if (Status st = check_comm(comm, "put_partitioned"); !st.ok()) return ready_error(st);
  if (key.empty()) return ready_error(invalid_argument("put_partitioned: empty key"));
  if (!dtype_is_valid(full_desc.dtype))
    return ready_error(invalid_argument("put_partitioned '" + key + "': invalid dtype"));
  for (int64_t e : full_desc.shape)
    if (e < 0)
      return ready_error(invalid_argument("put_partitioned '" + key + "': negative extent in " +
                                          describe(full_desc)));
  auto l = partition_layout(full_desc.numel(), comm.size());
  if (!l.ok()) return ready_error(l.status());
  if (l->owned_numel(comm.rank()) > 0 && owned_src == nullptr) {
    return ready_error(invalid_argument("put_partitioned '" + key + "': slice source is null"));
  }
  const uint8_t* src = static_cast<const uint8_t*>(owned_src);
  Store* s = &store;
  Communicator* c = &comm;
  return run_composite(comm, [s, c, key, src, full_desc, opts] {
    return put_impl(*s, *c, key, src, full_desc, opts);
  });
}

Future<void> fetch_partitioned_async(Store& store, Communicator& comm, const std::string& key,
                                     void* dst, const TensorDesc& full_desc,
                               const PartitionOptions& opts) {
  if (Status st = check_comm(comm, "fetch_partitioned"); !st.ok()) return ready_error(st);
  if (!dtype_is_valid(full_desc.dtype))
    return ready_error(invalid_argument("fetch_partitioned '" + key + "': invalid dtype"));
  if (full_desc.nbytes() > 0 && dst == nullptr)
    return ready_error(invalid_argument("fetch_partitioned '" + key + "': dst is null"));
  Store* s = &store;
  Communicator* c = &comm;
  uint8_t* d = static_cast<uint8_t*>(dst);
  return run_composite(comm, [s, c, key, d, full_desc, opts] {
    return fetch_impl(*s, *c, key, d, full_desc, opts);
  });
}

Future<void> reduce_scatter_grads_async(Communicator& comm, const void* full_grad, void* owned_slice,
                                        uint64_t numel, DType dtype, ReduceOp op,
                                  uint64_t piece_bytes) {
  if (Status st = check_comm(comm, "reduce_scatter_grads"); !st.ok()) return ready_error(st);
  if (!dtype_is_valid(dtype)) return ready_error(invalid_argument("reduce_scatter_grads: invalid dtype"));
  auto l = partition_layout(numel, comm.size());
  if (!l.ok()) return ready_error(l.status());
  const uint64_t own = l->owned_numel(comm.rank());
  if (numel > 0 && full_grad == nullptr)
    return ready_error(invalid_argument("reduce_scatter_grads: full_grad is null"));
  if (own > 0 && owned_slice == nullptr)
    return ready_error(invalid_argument("reduce_scatter_grads: owned_slice is null"));
  if (numel == 0) return make_ready_future();
  if (l->padded_numel() == numel) {  // no padding: straight to the communicator
    return comm.reduce_scatter_async(full_grad, owned_slice, l->chunk_numel, dtype, op);
  }
  Communicator* c = &comm;
  const uint8_t* f = static_cast<const uint8_t*>(full_grad);
  uint8_t* o = static_cast<uint8_t*>(owned_slice);
  PartitionLayout lay = *l;
  return run_composite(comm, [c, f, o, lay, dtype, op, piece_bytes] {
    return reduce_scatter_impl(*c, f, o, lay, dtype, op, piece_bytes);
  });
}

}  // namespace strata
