// safetensors files read and written through the IoEngine: Reader (aligned superset reads),
// copy_tensors (file -> memory / store objects) and write_file (memory / store objects ->
// file), each a pipeline of pinned pieces (strata/store/safetensors.hpp).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "store_markers.hpp"
#include "strata/base/env.hpp"
#include "strata/base/half.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/safetensors.hpp"
#include "strata/store/store.hpp"

namespace strata::safetensors {
namespace {

using detail::BFloat16;
using detail::Half;

std::string q(std::string_view s) { return "'" + std::string(s) + "'"; }

Result<std::shared_ptr<IoEngine>> engine_or_default(std::shared_ptr<IoEngine> engine) {
  if (engine) return engine;
  STRATA_ASSIGN_OR_RETURN(auto opts, IoEngineOptions::from_env());
  return IoEngine::create(opts);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// dst[i] = f(src[i]) for n elements. safetensors data is only 8-byte aligned within the
/// file and a piece may start anywhere in it, so elements are loaded and stored with memcpy
/// (any alignment; compiled to plain moves).
template <class D, class S, class F>
void convert_loop(const void* src, void* dst, uint64_t n, F f) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (uint64_t i = 0; i < n; ++i) {
    S v;
    std::memcpy(&v, s + i * sizeof(S), sizeof(S));
    const D r = f(v);
    std::memcpy(d + i * sizeof(D), &r, sizeof(D));
  }
}

/// One element as fp32 (fp64 rounded to fp32 first, as torch's conversions to fp16/bf16 do:
/// c10::Half and c10::BFloat16 are built from a float).
template <class S>
float load_float(S v) {
  if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return detail::to_float(v);
  } else {
    return static_cast<float>(v);
  }
}

template <class S>
void convert_from(const void* src, void* dst, DType dst_dtype, uint64_t n) {
  switch (dst_dtype) {
    case DType::kFloat32:
      return convert_loop<float, S>(src, dst, n, [](S v) { return load_float(v); });
    case DType::kFloat16:
      return convert_loop<Half, S>(src, dst, n, [](S v) { return detail::to_half(load_float(v)); });
    case DType::kBFloat16:
      return convert_loop<BFloat16, S>(src, dst, n, [](S v) { return detail::to_bf16(load_float(v)); });
    case DType::kFloat64:
      return convert_loop<double, S>(src, dst, n, [](S v) {
        if constexpr (std::is_same_v<S, double>) return v;
        return static_cast<double>(load_float(v));
      });
    default:
      return;
  }
}

Status check_conversion(DType from, DType to, const std::string& what) {
  if (from == to || (dtype_is_floating(from) && dtype_is_floating(to))) return Status::OK();
  return invalid_argument(what + ": cannot convert " + std::string(dtype_name(from)) + " to " +
                          std::string(dtype_name(to)) +
                          " (only between fp32, fp16, bf16 and fp64, or to the same dtype)");
}

/// Waits for every future in `fs` (they reference buffers about to be freed); the first
/// error in order, or `first` when it is already one.
template <class F>
Status drain(std::vector<F>& fs, Status first) {
  for (auto& f : fs) {
    if (!f.valid()) continue;
    Status s = f.result().status();
    if (first.ok() && !s.ok()) first = s;
    f = F();
  }
  return first;
}

}  // namespace

// ---- conversions --------------------------------------------------------------------------

Status convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, uint64_t numel) {
  STRATA_RETURN_IF_ERROR(check_conversion(src_dtype, dst_dtype, "convert"));
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, numel * dtype_size(src_dtype));
    return Status::OK();
  }
  switch (src_dtype) {
    case DType::kFloat32: convert_from<float>(src, dst, dst_dtype, numel); break;
    case DType::kFloat16: convert_from<Half>(src, dst, dst_dtype, numel); break;
    case DType::kBFloat16: convert_from<BFloat16>(src, dst, dst_dtype, numel); break;
    case DType::kFloat64: convert_from<double>(src, dst, dst_dtype, numel); break;
    default: break;
  }
  return Status::OK();
}

Result<StreamOptions> StreamOptions::from_env() {
  StreamOptions o;
  STRATA_ASSIGN_OR_RETURN(o.piece_bytes, env_size("STRATA_CHECKPOINT_PIECE_BYTES", o.piece_bytes));
  STRATA_ASSIGN_OR_RETURN(uint64_t pieces, env_uint("STRATA_CHECKPOINT_PIECES", o.pieces));
  if (o.piece_bytes == 0 || pieces == 0 || pieces > 1024) {
    return invalid_argument("STRATA_CHECKPOINT_PIECE_BYTES / STRATA_CHECKPOINT_PIECES: must be > 0 "
                            "(pieces at most 1024)");
  }
  o.pieces = static_cast<uint32_t>(pieces);
  return o;
}

// ---- Reader ---------------------------------------------------------------------------------

Reader::~Reader() = default;

Result<std::shared_ptr<Reader>> Reader::open_file(const std::string& path,
                                                  std::shared_ptr<IoEngine> engine) {
  std::shared_ptr<Reader> r(new Reader());
  r->path_ = path;
  STRATA_ASSIGN_OR_RETURN(r->engine_, engine_or_default(std::move(engine)));
  STRATA_ASSIGN_OR_RETURN(r->file_, r->engine_->open(path, OpenMode::kRead));
  r->align_ = std::max<uint64_t>(r->file_->offset_alignment(), 1);
  return r;
}

Result<std::shared_ptr<Reader>> Reader::open(const std::string& path,
                                             std::shared_ptr<IoEngine> engine) {
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Reader> r, open_file(path, std::move(engine)));
  STRATA_ASSIGN_OR_RETURN(uint64_t size, r->file_->size());
  // The length, then the JSON: two aligned reads (the second only when it is longer than
  // the first read's 64 KiB).
  const uint64_t first = std::min<uint64_t>(size, 64 << 10);
  auto alloc = [&](uint64_t n) {
    return std::unique_ptr<char, decltype(&std::free)>(
        static_cast<char*>(std::aligned_alloc(4096, align_up(std::max<uint64_t>(n, 1), 4096) + 4096)),
        &std::free);
  };
  auto buf = alloc(r->superset_nbytes(0, first));
  STRATA_ASSIGN_OR_RETURN(uint64_t head, r->read_superset_async(0, first, buf.get()).result());
  std::string_view got(buf.get() + head, first);
  STRATA_ASSIGN_OR_RETURN(uint64_t n, parse_header_length(got, size, path));
  if (8 + n <= first) {
    STRATA_ASSIGN_OR_RETURN(r->header_, parse_header(got.substr(8, n), size, path));
    return r;
  }
  auto big = alloc(r->superset_nbytes(0, 8 + n));
  STRATA_ASSIGN_OR_RETURN(head, r->read_superset_async(0, 8 + n, big.get()).result());
  STRATA_ASSIGN_OR_RETURN(r->header_,
                          parse_header(std::string_view(big.get() + head + 8, n), size, path));
  return r;
}

Result<std::shared_ptr<Reader>> Reader::open_ranges(const std::string& path,
                                                    std::vector<TensorEntry> tensors,
                                                    std::shared_ptr<IoEngine> engine) {
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Reader> r, open_file(path, std::move(engine)));
  STRATA_ASSIGN_OR_RETURN(uint64_t size, r->file_->size());
  Header& h = r->header_;
  h.raw = true;
  h.file_nbytes = size;
  std::set<std::string> names;
  for (const TensorEntry& e : tensors) {
    const std::string t = "file " + q(path) + ", tensor " + q(e.name);
    uint64_t n = dtype_size(e.dtype);
    bool overflow = false;
    for (uint64_t d : e.shape) overflow = overflow || __builtin_mul_overflow(n, d, &n);
    if (!names.insert(e.name).second) return invalid_argument(t + ": named twice");
    if (e.begin > e.end || e.end > size) {
      return invalid_argument(t + ": bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                              ") are not inside the file's " + std::to_string(size));
    }
    if (overflow || n != e.end - e.begin) {
      return invalid_argument(t + ": " + std::to_string(e.end - e.begin) + " bytes for " +
                              (overflow ? std::string("more than 2^64") : std::to_string(n)) +
                              " of its shape and dtype");
    }
  }
  h.tensors = std::move(tensors);
  h.by_name.resize(h.tensors.size());
  for (size_t i = 0; i < h.by_name.size(); ++i) h.by_name[i] = i;
  std::sort(h.by_name.begin(), h.by_name.end(),
            [&](size_t a, size_t b) { return h.tensors[a].name < h.tensors[b].name; });
  return r;
}

uint64_t Reader::superset_nbytes(uint64_t file_offset, uint64_t nbytes) const {
  const uint64_t a = align_down(file_offset, align_);
  const uint64_t b = align_up(file_offset + nbytes, align_);
  return b - a;
}

Future<uint64_t> Reader::read_superset_async(uint64_t file_offset, uint64_t nbytes, void* buf) const {
  const uint64_t size = header_.file_nbytes ? header_.file_nbytes : file_->size().value_or(0);
  if (file_offset + nbytes > size || file_offset + nbytes < file_offset) {
    return make_ready_future<uint64_t>(
        out_of_range("safetensors file " + q(path_) + ": bytes [" + std::to_string(file_offset) +
                     ", " + std::to_string(file_offset + nbytes) + ") run past its end at byte " +
                     std::to_string(size)));
  }
  const uint64_t a = align_down(file_offset, align_);
  const uint64_t b = std::min(align_up(file_offset + nbytes, align_), size);
  const uint64_t head = file_offset - a;
  if (b == a) return make_ready_future<uint64_t>(head);
  return engine_->read_async(file_, buf, b - a, a).map([head](uint64_t) { return head; });
}

// ---- copy_tensors ---------------------------------------------------------------------------

Result<StreamStats> copy_tensors(const Reader& reader, const std::vector<CopyTarget>& targets,
                                 Store* store, const StreamOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const Header& h = reader.header();
  struct Piece {
    size_t target;
    uint64_t elem;  // first element, relative to the target's elem_begin
    uint64_t numel;
  };
  std::vector<Piece> pieces;
  std::vector<uint64_t> begins(targets.size());
  std::map<std::string, uint64_t> chunks;  // chunk bytes of each store target's object
  uint64_t max_src = 0, max_dst = 0;
  bool any_store = false;
  const uint64_t piece_bytes = std::max<uint64_t>(8, options.piece_bytes);
  for (size_t i = 0; i < targets.size(); ++i) {
    const CopyTarget& t = targets[i];
    if (t.tensor >= h.tensors.size()) {
      return invalid_argument("copy_tensors: target " + std::to_string(i) + " names tensor #" +
                              std::to_string(t.tensor) + " of a file of " +
                              std::to_string(h.tensors.size()) + " (" + reader.path() + ")");
    }
    const TensorEntry& e = h.tensors[t.tensor];
    const std::string what = "safetensors file " + q(reader.path()) + ", tensor " + q(e.name);
    auto src = to_strata(e.dtype);
    if (!src) {
      return invalid_argument(what + ": dtype " + std::string(dtype_name(e.dtype)) +
                              " has no strata or torch counterpart here");
    }
    STRATA_RETURN_IF_ERROR(check_conversion(*src, t.dtype, what));
    const uint64_t end = t.elem_end == UINT64_MAX ? e.numel() : t.elem_end;
    if (t.elem_begin > end || end > e.numel()) {
      return invalid_argument(what + ": elements [" + std::to_string(t.elem_begin) + ", " +
                              std::to_string(end) + ") out of its " + std::to_string(e.numel()));
    }
    const uint64_t ss = dtype_size(*src), ds = dtype_size(t.dtype);
    uint64_t per = std::max<uint64_t>(1, piece_bytes / std::max(ss, ds));
    if (!t.memory) {
      if (!store) return invalid_argument(what + ": a store target without a store");
      any_store = true;
      STRATA_ASSIGN_OR_RETURN(ObjectInfo info, store->stat(t.key));
      if (t.key_offset_bytes + (end - t.elem_begin) * ds > info.nbytes) {
        return out_of_range(what + ": bytes [" + std::to_string(t.key_offset_bytes) + ", " +
                            std::to_string(t.key_offset_bytes + (end - t.elem_begin) * ds) +
                            ") of store object " + q(t.key) + " of " + std::to_string(info.nbytes) +
                            " bytes");
      }
      const uint64_t c = info.chunk_bytes;
      chunks[t.key] = c;
      // Pieces of whole chunks where they fit: each is then written without a
      // read-modify-write, and no two pieces in flight share a chunk.
      if (c && c % ds == 0 && t.key_offset_bytes % c == 0 && piece_bytes >= c) {
        per = piece_bytes / c * c / ds;
      }
    }
    begins[i] = t.elem_begin;
    for (uint64_t at = 0; at < end - t.elem_begin; at += per) {
      pieces.push_back({i, at, std::min(per, end - t.elem_begin - at)});
    }
    max_src = std::max(max_src, std::min(per, end - t.elem_begin) * ss);
    if (!t.memory) max_dst = std::max(max_dst, std::min(per, end - t.elem_begin) * ds);
  }
  StreamStats st;
  if (pieces.empty()) return st;
  const uint32_t S = std::max<uint32_t>(1, std::min<uint64_t>(options.pieces, pieces.size()));
  const uint64_t rb = align_up(max_src + 2 * reader.alignment(), 4096);
  const uint64_t ob = any_store ? align_up(max_dst, 4096) : 0;
  PinnedPoolOptions po;
  po.budget_bytes = S * (rb + ob);
  STRATA_ASSIGN_OR_RETURN(auto pool, PinnedPool::create(po, reader.engine()));
  struct Slot {
    PinnedBuffer rbuf, obuf;
  };
  std::vector<Slot> slots(S);
  for (auto& s : slots) {
    STRATA_ASSIGN_OR_RETURN(s.rbuf, pool->allocate(rb));
    if (ob) {
      STRATA_ASSIGN_OR_RETURN(s.obuf, pool->allocate(ob));
    }
  }
  std::vector<Future<uint64_t>> reads(S);
  std::vector<Future<void>> writes(S);
  struct LastWrite {
    Future<void> f;
    uint64_t chunk = 0;  // the last chunk it writes
  };
  std::map<std::string, LastWrite> last_write;
  auto issue = [&](size_t k) {
    const Piece& p = pieces[k];
    const CopyTarget& t = targets[p.target];
    const TensorEntry& e = h.tensors[t.tensor];
    const uint64_t ss = dtype_size(e.dtype);
    const uint64_t fo = h.data_start() + e.begin + (begins[p.target] + p.elem) * ss;
    reads[k % S] = reader.read_superset_async(fo, p.numel * ss, slots[k % S].rbuf.data());
    st.bytes_read += reader.superset_nbytes(fo, p.numel * ss);
  };
  for (size_t k = 0; k < S; ++k) issue(k);
  Status err;
  for (size_t k = 0; k < pieces.size() && err.ok(); ++k) {
    const size_t j = k % S;
    const Piece& p = pieces[k];
    const CopyTarget& t = targets[p.target];
    const TensorEntry& e = h.tensors[t.tensor];
    Result<uint64_t> head = reads[j].result();
    reads[j] = Future<uint64_t>();
    if (!head.ok()) {
      err = head.status();
      break;
    }
    const char* src = static_cast<const char*>(slots[j].rbuf.data()) + *head;
    const uint64_t ds = dtype_size(t.dtype);
    if (t.memory) {
      err = convert(src, *to_strata(e.dtype), static_cast<char*>(t.memory) + p.elem * ds, t.dtype,
                    p.numel);
    } else {
      if (writes[j].valid()) {
        err = writes[j].result().status();
        writes[j] = Future<void>();
        if (!err.ok()) break;
      }
      err = convert(src, *to_strata(e.dtype), slots[j].obuf.data(), t.dtype, p.numel);
      // Two writes in flight into one chunk would each read-modify-write it (one lost):
      // a piece sharing its first chunk with the last write to the key waits for it.
      const uint64_t o = t.key_offset_bytes + p.elem * ds, c = chunks[t.key];
      LastWrite& last = last_write[t.key];
      if (err.ok() && last.f.valid() && c && o / c <= last.chunk) {
        err = last.f.result().status();
        last.f = Future<void>();
      }
      if (err.ok()) {
        writes[j] = store->write_range_async(t.key, o, p.numel * ds, slots[j].obuf.data());
        last.f = writes[j];
        last.chunk = c ? (o + p.numel * ds - 1) / c : 0;
      }
    }
    st.bytes_written += p.numel * ds;
    if (err.ok() && k + S < pieces.size()) issue(k + S);
  }
  err = drain(reads, err);
  err = drain(writes, err);
  last_write.clear();
  if (!err.ok()) return err;
  st.seconds = seconds_since(t0);
  return st;
}

// ---- write_file -----------------------------------------------------------------------------

Result<StreamStats> write_file(const std::string& path, const std::vector<WriteSource>& sources,
                               const std::vector<std::pair<std::string, std::string>>& metadata,
                               Store* store, const StreamOptions& options,
                               std::shared_ptr<IoEngine> engine) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<TensorEntry> entries(sources.size());
  std::set<std::string_view> names;
  uint64_t ratio = 1;  // most source bytes per file byte of a converted store source
  for (size_t i = 0; i < sources.size(); ++i) {
    const WriteSource& s = sources[i];
    const std::string what = "write_file " + q(path) + ", tensor " + q(s.name);
    if (s.name.empty() || s.name == "__metadata__" || !names.insert(s.name).second) {
      return invalid_argument(what + ": a tensor name must be non-empty, not \"__metadata__\", "
                              "and given once");
    }
    STRATA_RETURN_IF_ERROR(check_conversion(s.src_dtype, s.dtype, what));
    bool empty = false;
    for (uint64_t d : s.shape) empty = empty || d == 0;
    if (!s.memory && !store && !empty) return invalid_argument(what + ": a store source without a store");
    if (!s.memory && s.src_dtype != s.dtype) {
      ratio = std::max<uint64_t>(ratio, (dtype_size(s.src_dtype) + dtype_size(s.dtype) - 1) /
                                            dtype_size(s.dtype));
    }
    entries[i].name = s.name;
    entries[i].dtype = from_strata(s.dtype);
    entries[i].shape = s.shape;
  }
  const std::vector<size_t> order = layout_order(entries);
  uint64_t pos = 0;
  for (size_t i : order) {
    uint64_t n = dtype_size(entries[i].dtype);
    for (uint64_t d : entries[i].shape) {
      if (__builtin_mul_overflow(n, d, &n)) {
        return invalid_argument("write_file " + q(path) + ": tensor " + q(entries[i].name) +
                                " has more than 2^64 bytes");
      }
    }
    entries[i].begin = pos;
    entries[i].end = pos += n;
  }
  const std::string header = format_header(entries, metadata, 4096);
  const uint64_t data_start = header.size();
  const uint64_t file_nbytes = data_start + pos;
  STRATA_ASSIGN_OR_RETURN(auto eng, engine_or_default(std::move(engine)));
  const std::string tmp = path + ".tmp";
  {  // created, truncated and allocated ahead (growing a file under direct I/O serializes)
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno_status(errno, "write_file: cannot create " + q(tmp));
    int rc = file_nbytes ? ::posix_fallocate(fd, 0, static_cast<off_t>(file_nbytes)) : 0;
    ::close(fd);
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
      ::unlink(tmp.c_str());
      return errno_status(rc, "write_file: cannot allocate " + std::to_string(file_nbytes) +
                                  " bytes for " + q(tmp));
    }
  }
  auto fail = [&](Status s) -> Status {
    ::unlink(tmp.c_str());
    return s;
  };
  auto opened = eng->open(tmp, OpenMode::kReadWrite);
  if (!opened.ok()) return fail(opened.status());
  std::shared_ptr<IoFile> file = *opened;
  const uint64_t P = align_up(std::max<uint64_t>(options.piece_bytes, 4096), 4096);
  const uint64_t npieces = (file_nbytes + P - 1) / P;
  const uint32_t S = std::max<uint32_t>(2, std::min<uint64_t>(std::max<uint32_t>(options.pieces, 2) * 2,
                                                                std::max<uint64_t>(npieces, 2)));
  const uint32_t L = S / 2;  // pieces filled ahead of the one written
  PinnedPoolOptions po;
  const uint64_t scratch = ratio > 1 ? P * ratio : 0;
  po.budget_bytes = S * (P + scratch);
  auto pool_r = PinnedPool::create(po, eng);
  if (!pool_r.ok()) return fail(pool_r.status());
  auto pool = *pool_r;
  struct Convert {  // a converted store range: scratch -> buf once read
    uint64_t scratch_off, buf_off, numel;
    DType from, to;
  };
  struct Slot {
    PinnedBuffer buf, scratch;
    std::vector<Future<void>> reads;
    std::vector<Convert> converts;
    Future<uint64_t> write;
  };
  std::vector<Slot> slots(S);
  for (auto& s : slots) {
    auto b = pool->allocate(P);
    if (!b.ok()) return fail(b.status());
    s.buf = std::move(*b);
    if (scratch) {
      auto c = pool->allocate(scratch);
      if (!c.ok()) return fail(c.status());
      s.scratch = std::move(*c);
    }
  }
  StreamStats st;
  size_t cursor = 0;  // first tensor (in order) not wholly before the piece being filled
  auto fill = [&](uint64_t k) -> Status {
    Slot& s = slots[k % S];
    s.converts.clear();
    char* buf = static_cast<char*>(s.buf.data());
    const uint64_t a = k * P, b = std::min(file_nbytes, a + P);
    if (a < data_start) std::memcpy(buf, header.data() + a, std::min(b, data_start) - a);
    while (cursor < order.size() && data_start + entries[order[cursor]].end <= a) ++cursor;
    for (size_t c = cursor; c < order.size(); ++c) {
      const TensorEntry& e = entries[order[c]];
      const WriteSource& src = sources[order[c]];
      const uint64_t ta = data_start + e.begin, tb = data_start + e.end;
      if (ta >= b) break;
      const uint64_t x0 = std::max(a, ta) - ta, x1 = std::min(b, tb) - ta;  // bytes of e
      if (x1 <= x0) continue;
      const uint64_t fs = dtype_size(src.dtype), ss = dtype_size(src.src_dtype);
      char* dst = buf + (std::max(a, ta) - a);
      const uint64_t e0 = x0 / fs, n = (x1 - x0) / fs;
      if (src.memory) {
        STRATA_RETURN_IF_ERROR(convert(static_cast<const char*>(src.memory) + e0 * ss, src.src_dtype,
                                       dst, src.dtype, n));
        st.bytes_read += n * ss;
      } else if (src.src_dtype == src.dtype) {
        s.reads.push_back(store->read_range_async(src.key, src.key_offset_bytes + x0, x1 - x0, dst));
        st.bytes_read += x1 - x0;
      } else {
        const uint64_t so = (dst - buf) * ratio;
        s.reads.push_back(store->read_range_async(src.key, src.key_offset_bytes + e0 * ss, n * ss,
                                                  static_cast<char*>(s.scratch.data()) + so));
        s.converts.push_back({so, static_cast<uint64_t>(dst - buf), n, src.src_dtype, src.dtype});
        st.bytes_read += n * ss;
      }
    }
    return Status::OK();
  };
  Status err;
  for (uint64_t k = 0; k < std::min<uint64_t>(L, npieces) && err.ok(); ++k) err = fill(k);
  for (uint64_t k = 0; k < npieces && err.ok(); ++k) {
    Slot& s = slots[k % S];
    err = drain(s.reads, err);
    s.reads.clear();
    if (!err.ok()) break;
    for (const Convert& c : s.converts) {
      err = convert(static_cast<char*>(s.scratch.data()) + c.scratch_off, c.from,
                    static_cast<char*>(s.buf.data()) + c.buf_off, c.to, c.numel);
      if (!err.ok()) break;
    }
    if (!err.ok()) break;
    const uint64_t a = k * P, len = std::min(file_nbytes, a + P) - a;
    s.write = eng->write_async(file, s.buf.data(), len, a);
    st.bytes_written += len;
    if (k + L < npieces) {  // the slot of piece k + L - S, written L iterations ago
      Slot& next = slots[(k + L) % S];
      if (next.write.valid()) {
        err = next.write.result().status();
        next.write = Future<uint64_t>();
        if (!err.ok()) break;
      }
      err = fill(k + L);
    }
  }
  for (auto& s : slots) {
    err = drain(s.reads, err);
    if (s.write.valid()) {
      Status w = s.write.result().status();
      if (err.ok()) err = w;
      s.write = Future<uint64_t>();
    }
  }
  if (err.ok() && options.durable) err = eng->sync_async(file).result().status();
  file.reset();
  if (!err.ok()) return fail(err);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(errno_status(errno, "write_file: cannot rename " + q(tmp) + " to " + q(path)));
  }
  if (options.durable) {
    std::string dir = std::filesystem::path(path).parent_path().string();
    STRATA_RETURN_IF_ERROR(store_detail::fsync_directory(dir.empty() ? "." : dir));
  }
  st.seconds = seconds_since(t0);
  return st;
}

}  // namespace strata::safetensors
