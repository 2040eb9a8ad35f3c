// strata::store (private) — the data path between memory and the data files: chunks go
// straight from aligned host memory to the disk (O_DIRECT) or stream through pinned staging
// buffers, pipelined piece by piece, and every chunk carries an XXH3-64 checksum that reads
// verify (StoreOptions::verify_checksums).
#include <algorithm>
#include <cstring>
#include <optional>

#include "checksum.hpp"
#include "store_impl.hpp"

namespace strata::store_detail {

Result<PinnedBuffer> StoreImpl::staging(uint32_t dir, uint64_t nbytes) {
  auto r = groups_[dir_group_[dir]].staging->allocate(align_up(nbytes, kAlign),
                                                      std::chrono::minutes(10));
  if (!r.ok()) return r.status().with_context("staging buffer of " + format_bytes(nbytes));
  return r;
}

Status StoreImpl::copy_mem(void* dst, const void* src, uint64_t n, bool any_dev) {
  if (n == 0) return Status::OK();
  if (!any_dev) {
    std::memcpy(dst, src, n);
    return Status::OK();
  }
  DeviceStream s(opts_.device_id);
  STRATA_RETURN_IF_ERROR(s.copy_async(dst, src, n));
  return s.synchronize();
}

Status StoreImpl::checksum_error(const std::string& key, uint32_t j, uint64_t chunk_start,
                                 const ChunkRef& c, uint64_t got) const {
  return data_loss("object '" + key + "': checksum mismatch in chunk " + std::to_string(j) +
                   " at object offset " + std::to_string(chunk_start) + " (" +
                   files_[c.ext->dir]->path() + " offset " + std::to_string(c.ext->offset) +
                   ", " + std::to_string(c.nbytes) + " bytes): stored xxh3 " +
                   hex64(c.checksum) + ", read " + hex64(got));
}

Result<uint64_t> StoreImpl::staged_write_chunk(
    const Extent& ext, uint64_t len,
    const std::function<Status(uint8_t*, uint64_t, uint64_t)>& fill) {
  const uint64_t piece = std::min(piece_bytes_, align_up(len, kAlign));
  STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, staging(ext.dir, 2 * piece));
  uint8_t* bufs[2] = {static_cast<uint8_t*>(buf.data()), static_cast<uint8_t*>(buf.data()) + piece};
  Future<uint64_t> pending[2];
  Xxh3Stream h;
  Status st;
  mark_dir_dirty(ext.dir);
  uint64_t i = 0;
  for (uint64_t p = 0; p < len && st.ok(); p += piece, ++i) {
    int b = static_cast<int>(i % 2);
    if (pending[b].valid()) {
      const auto& r = pending[b].result();
      if (!r.ok()) {
        st = r.status();
        break;
      }
    }
    uint64_t plen = std::min(piece, len - p);
    st = fill(bufs[b], p, plen);
    if (!st.ok()) break;
    h.update(bufs[b], plen);
    uint64_t padded = align_up(plen, kAlign);
    if (padded > plen) std::memset(bufs[b] + plen, 0, padded - plen);
    pending[b] = io(ext.dir).write(files_[ext.dir], bufs[b], padded, ext.offset + p);
  }
  for (auto& f : pending) {
    if (f.valid()) {
      const auto& r = f.result();
      if (st.ok() && !r.ok()) st = r.status();
    }
  }
  if (!st.ok()) return st;
  return h.digest();
}

void StoreImpl::write_direct(uint32_t dir, const uint8_t* s,
                             uint64_t len, uint64_t offset, std::vector<Future<uint64_t>>& futs,
                             std::vector<AlignedBlock>& tails) {
  const uint64_t body = align_down(len, kAlign);
  const auto& file = files_[dir];
  IoEngine& engine = io(dir);
  if (body > 0) futs.push_back(engine.write(file, s, body, offset));
  if (len > body) {
    AlignedBlock t = aligned_block(kAlign);
    std::memset(t.get(), 0, kAlign);
    std::memcpy(t.get(), s + body, len - body);
    futs.push_back(engine.write(file, t.get(), kAlign, offset + body));
    tails.push_back(std::move(t));
  }
}

Result<LayoutPtr> StoreImpl::write_layout(const std::string& key, const uint8_t* src,
                                          uint64_t nbytes, uint32_t first_dir, bool src_dev) {
  auto l = write_layout_once(key, src, nbytes, first_dir, src_dev);
  if (!l.ok()) trim_data_files();  // its extents are released by now: give back the space
  return l;
}

Result<LayoutPtr> StoreImpl::write_layout_once(const std::string& key, const uint8_t* src,
                                               uint64_t nbytes, uint32_t first_dir,
                                               bool src_dev) {
  auto layout = std::make_shared<Layout>();
  if (nbytes == 0) return LayoutPtr(layout);
  const uint64_t nchunks = (nbytes + chunk_bytes_ - 1) / chunk_bytes_;
  const uint32_t k = static_cast<uint32_t>(dirs_.size());
  layout->resize(nchunks);
  std::vector<Future<uint64_t>> futs;
  std::vector<AlignedBlock> tails;
  // Place every chunk first, then grow each data file once to cover them, before the first
  // write: growing a file (fallocate) waits for all direct I/O in flight on it (ext4:
  // inode_dio_wait), so growing chunk by chunk would stall this put's own writes and those
  // of concurrent puts at every step.
  std::vector<uint64_t> need(k, 0);
  for (uint64_t j = 0; j < nchunks; ++j) {
    const uint64_t len = std::min(chunk_bytes_, nbytes - j * chunk_bytes_);
    const uint32_t dir = static_cast<uint32_t>((first_dir + j) % k);
    auto ext = alloc_->allocate(dir, align_up(len, kAlign), key);
    if (!ext.ok()) return ext.status().with_context("put '" + key + "'");
    need[dir] = std::max(need[dir], (*ext)->offset + (*ext)->len);
    (*layout)[j].ext = std::move(*ext);
    (*layout)[j].nbytes = len;
  }
  for (uint32_t d = 0; d < k; ++d) {
    if (need[d] == 0) continue;
    Status gs = ensure_file_size(d, need[d]);
    if (!gs.ok()) return gs.with_context("put '" + key + "'");
  }
  // Chunks in aligned host memory go straight from `src` to the disk (O_DIRECT): all of
  // them are submitted first, then hashed while the engine keeps the queue full, so the
  // checksum costs CPU time beside the transfer instead of delaying its submission.
  // Other chunks stream through staging buffers (hashed as they are filled).
  std::vector<uint64_t> hash_later;
  Status st;
  for (uint64_t j = 0; j < nchunks && st.ok(); ++j) {
    const uint64_t cs = j * chunk_bytes_;
    ChunkRef& c = (*layout)[j];
    const uint64_t len = c.nbytes;
    const uint32_t dir = c.ext->dir;
    const auto& file = files_[dir];
    const uint8_t* s = src + cs;
    bool direct = !src_dev && is_aligned_ptr(s, std::max<uint32_t>(file->memory_alignment(), 1));
    if (direct) {
      mark_dir_dirty(dir);
      write_direct(dir, s, len, c.ext->offset, futs, tails);
      hash_later.push_back(j);
    } else {
      auto h = staged_write_chunk(*c.ext, len, [&](uint8_t* buf, uint64_t off, uint64_t n) {
        return copy_mem(buf, s + off, n, src_dev);
      });
      if (!h.ok()) {
        st = h.status();
        break;
      }
      c.checksum = *h;
    }
  }
  for (uint64_t j : hash_later) {
    (*layout)[j].checksum = xxh3_64(src + j * chunk_bytes_, (*layout)[j].nbytes);
  }
  for (auto& f : futs) {
    const auto& r = f.result();
    if (st.ok() && !r.ok()) st = r.status();
  }
  if (!st.ok()) return st.with_context("put '" + key + "'");
  return LayoutPtr(layout);
}

Status StoreImpl::staged_read_chunk(
    const std::string& key, uint32_t j, uint64_t chunk_start, const ChunkRef& c, uint64_t lo,
    uint64_t hi, bool verify, const std::function<Status(const uint8_t*, uint64_t, uint64_t)>& sink) {
  // Range of the chunk to read: all of it when verifying, else the aligned cover of [lo, hi).
  uint64_t a = verify ? 0 : align_down(lo, kAlign);
  uint64_t b = verify ? c.nbytes : std::min(c.nbytes, align_up(hi, kAlign));
  const uint64_t piece = std::min(piece_bytes_, align_up(b - a, kAlign));
  STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, staging(c.ext->dir, 2 * piece));
  uint8_t* bufs[2] = {static_cast<uint8_t*>(buf.data()), static_cast<uint8_t*>(buf.data()) + piece};
  const auto& file = files_[c.ext->dir];
  Xxh3Stream h;
  auto submit = [&](uint64_t p, int bi) {
    uint64_t plen = std::min(piece, b - p);
    return io(c.ext->dir).read(file, bufs[bi], align_up(plen, kAlign), c.ext->offset + p);
  };
  Status st;
  Future<uint64_t> next = submit(a, 0);
  uint64_t i = 0;
  for (uint64_t p = a; p < b; p += piece, ++i) {
    int bi = static_cast<int>(i % 2);
    const auto& r = next.result();
    if (!r.ok()) {
      st = r.status().with_context("object '" + key + "' chunk " + std::to_string(j));
      break;
    }
    uint64_t plen = std::min(piece, b - p);
    if (p + piece < b) next = submit(p + piece, 1 - bi);  // overlaps the hash and the copy
    if (verify) h.update(bufs[bi], plen);
    uint64_t s0 = std::max(p, lo), s1 = std::min(p + plen, hi);
    if (s0 < s1) {
      st = sink(bufs[bi] + (s0 - p), s0, s1 - s0);
      if (!st.ok()) break;
    }
  }
  if (!st.ok() && next.valid()) next.wait();
  if (!st.ok()) return st;
  const uint64_t got = h.digest();
  if (verify && got != c.checksum) return checksum_error(key, j, chunk_start, c, got);
  return Status::OK();
}

Status StoreImpl::read_layout(const std::string& key, const Layout& l, uint64_t off, uint64_t n,
                              uint8_t* dst, bool dst_dev, bool verify) {
  if (n == 0) return Status::OK();
  const uint64_t j0 = off / chunk_bytes_, j1 = (off + n - 1) / chunk_bytes_;
  struct Direct {
    uint32_t j;
    std::vector<Future<uint64_t>> futs;
    AlignedBlock tail;
    uint64_t body = 0;
  };
  std::vector<Direct> direct;
  Status st;
  // Whole chunks into aligned host memory: straight from the disk (O_DIRECT), all chunks in
  // flight at once; verified as they complete. The rest streams through staging buffers.
  for (uint64_t j = j0; j <= j1 && st.ok(); ++j) {
    const ChunkRef& c = l[j];
    const uint64_t cs = j * chunk_bytes_;
    const uint64_t lo = std::max(off, cs), hi = std::min(off + n, cs + c.nbytes);
    uint8_t* d = dst + (lo - off);
    const auto& file = files_[c.ext->dir];
    if (!file) return not_found("object '" + key + "': data file of directory " +
                                dirs_[c.ext->dir] + " is missing");
    bool whole = lo == cs && hi == cs + c.nbytes;
    if (whole && !dst_dev && is_aligned_ptr(d, std::max<uint32_t>(file->memory_alignment(), 1))) {
      Direct x;
      x.j = static_cast<uint32_t>(j);
      x.body = align_down(c.nbytes, kAlign);
      for (uint64_t p = 0; p < x.body; p += kHashPiece) {
        x.futs.push_back(io(c.ext->dir).read(file, d + p, std::min(kHashPiece, x.body - p),
                                       c.ext->offset + p));
      }
      if (c.nbytes > x.body) {
        x.tail = aligned_block(kAlign);
        x.futs.push_back(io(c.ext->dir).read(file, x.tail.get(), kAlign,
                                             c.ext->offset + x.body));
      }
      direct.push_back(std::move(x));
    } else {
      st = staged_read_chunk(key, static_cast<uint32_t>(j), cs, c, lo - cs, hi - cs, verify,
                             [&](const uint8_t* b, uint64_t coff, uint64_t len) {
                               return copy_mem(dst + (cs + coff - off), b, len, dst_dev);
                             });
    }
  }
  // Pieces complete in submission order (one FIFO engine queue); each is verified as soon
  // as it is in, while the later pieces are still in flight.
  for (auto& x : direct) {
    const ChunkRef& c = l[x.j];
    const uint64_t cs = static_cast<uint64_t>(x.j) * chunk_bytes_;
    uint8_t* d = dst + (cs - off);
    std::optional<Xxh3Stream> h;
    if (verify && st.ok()) h.emplace();
    for (size_t i = 0; i < x.futs.size(); ++i) {
      const auto& r = x.futs[i].result();
      if (st.ok() && !r.ok()) st = r.status().with_context("object '" + key + "' chunk " +
                                                           std::to_string(x.j));
      const uint64_t p = static_cast<uint64_t>(i) * kHashPiece;
      if (st.ok() && h && p < x.body) h->update(d + p, std::min(kHashPiece, x.body - p));
    }
    if (!st.ok()) continue;
    if (x.tail) {
      std::memcpy(d + x.body, x.tail.get(), c.nbytes - x.body);
      if (h) h->update(d + x.body, c.nbytes - x.body);
    }
    if (h) {
      const uint64_t got = h->digest();
      if (got != c.checksum) st = checksum_error(key, x.j, cs, c, got);
    }
  }
  return st;
}

}  // namespace strata::store_detail
