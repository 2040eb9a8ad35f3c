// strata::store (private) — the data path between memory and the data files: chunks go
// straight from aligned host memory to the disk (O_DIRECT) or stream through pinned staging
// buffers, pipelined piece by piece, and every chunk carries an XXH3-64 checksum that reads
// verify (StoreOptions::verify_checksums).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "checksum.hpp"
#include "piece_pipeline.hpp"
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
  // The caller's stream when one was given (ordered after its queued work), else our own.
  DeviceStream s(opts_.device_id, device_stream_.load(std::memory_order_acquire));
  STRATA_RETURN_IF_ERROR(s.copy_async(dst, src, n));
  return s.synchronize();
}

Status StoreImpl::set_device_stream(void* stream) {
  if (stream != nullptr && !has_device_) {
#ifdef STRATA_HAVE_CUDA
    const char* why = "the store has no GPU";
#else
    const char* why = "strata was built without CUDA";
#endif
    return invalid_argument("StoreOptions.device_stream / set_device_stream: a CUDA stream was "
                            "given but " + std::string(why) + " (device " +
                            std::to_string(opts_.device_id) +
                            "); pass nullptr, or open the store where the device tier exists");
  }
  device_stream_.store(stream, std::memory_order_release);
  return Status::OK();
}

Status StoreImpl::checksum_error(const std::string& key, uint32_t j, uint64_t chunk_start,
                                 const ChunkRef& c, uint64_t got) const {
  counters_.checksum_failures.add(1);
  return data_loss("object '" + key + "': checksum mismatch in chunk " + std::to_string(j) +
                   " at object offset " + std::to_string(chunk_start) + " (" +
                   files_[c.ext->dir]->path() + " offset " + std::to_string(c.ext->offset) +
                   ", " + std::to_string(c.nbytes) + " bytes): stored xxh3 " +
                   hex64(c.checksum) + ", read " + hex64(got));
}

Future<uint64_t> StoreImpl::staged_write_async(const Extent& ext, uint64_t len, uint8_t* buf,
                                               uint64_t piece, PieceLoad load, PieceFill fill) {
  struct State : Hashed {
    uint8_t* bufs[2];
  };
  auto s = std::make_shared<State>();
  s->bufs[0] = buf;
  s->bufs[1] = buf + piece;
  mark_dir_dirty(ext.dir);
  counters_.nvme().write(align_up(len, kAlign));
  const std::shared_ptr<IoFile>* file = &files_[ext.dir];
  IoEngine* engine = &io(ext.dir);
  const uint64_t offset = ext.offset;
  auto plen = [len, piece](uint64_t i) { return std::min(piece, len - i * piece); };
  PieceSteps steps;
  steps.count = (len + piece - 1) / piece;
  steps.window = 2;
  if (load) {
    steps.load = [s, load = std::move(load), plen, piece](uint64_t i) {
      return load(s->bufs[i % 2], i * piece, plen(i));
    };
  }
  steps.process = [s, fill = std::move(fill), plen, piece](uint64_t i) -> Status {
    uint8_t* b = s->bufs[i % 2];
    const uint64_t n = plen(i);
    STRATA_RETURN_IF_ERROR(fill(b, i * piece, n));
    s->h.update(b, n);
    const uint64_t padded = align_up(n, kAlign);
    if (padded > n) std::memset(b + n, 0, padded - n);
    return Status::OK();
  };
  steps.store = [s, file, engine, offset, plen, piece](uint64_t i) {
    return engine->write_async(*file, s->bufs[i % 2], align_up(plen(i), kAlign), offset + i * piece);
  };
  steps.cpu = cpu_pool_.get();
  return run_pieces(std::move(steps)).map([s] { return s->h.digest(); });
}

Result<uint64_t> StoreImpl::staged_write_chunk(const Extent& ext, uint64_t len, PieceFill fill) {
  const uint64_t piece = staged_piece(len);
  STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, staging(ext.dir, 2 * piece));
  return staged_write_async(ext, len, static_cast<uint8_t*>(buf.data()), piece, nullptr,
                            std::move(fill))
      .result();
}

void StoreImpl::write_direct(uint32_t dir, const uint8_t* s,
                             uint64_t len, uint64_t offset, std::vector<Future<uint64_t>>& futs,
                             std::vector<AlignedBlock>& tails) {
  const uint64_t body = align_down(len, kAlign);
  const auto& file = files_[dir];
  IoEngine& engine = io(dir);
  counters_.nvme().write(align_up(len, kAlign));
  if (body > 0) futs.push_back(engine.write_async(file, s, body, offset));
  if (len > body) {
    AlignedBlock t = aligned_block(kAlign);
    std::memset(t.get(), 0, kAlign);
    std::memcpy(t.get(), s + body, len - body);
    futs.push_back(engine.write_async(file, t.get(), kAlign, offset + body));
    tails.push_back(std::move(t));
  }
}

Result<LayoutPtr> StoreImpl::write_layout(const std::string& key, const uint8_t* src,
                                          uint64_t nbytes, uint32_t first_dir, bool src_dev,
                                          uint64_t chunk, uint64_t repeat) {
  auto l = write_layout_once(key, src, nbytes, first_dir, src_dev, chunk, repeat);
  if (!l.ok()) trim_data_files();  // its extents are released by now: give back the space
  return l;
}

Result<LayoutPtr> StoreImpl::write_layout_once(const std::string& key, const uint8_t* src,
                                               uint64_t nbytes, uint32_t first_dir,
                                               bool src_dev, uint64_t chunk, uint64_t repeat) {
  auto layout = std::make_shared<Layout>();
  const uint64_t chunk_bytes = chunk != 0 ? chunk : chunk_bytes_;
  layout->chunk_bytes = chunk_bytes;
  if (nbytes == 0) return LayoutPtr(layout);
  const uint64_t nchunks = (nbytes + chunk_bytes - 1) / chunk_bytes;
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
    const uint64_t len = std::min(chunk_bytes, nbytes - j * chunk_bytes);
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
  const auto t_io = StatsClock::now();
  for (uint64_t j = 0; j < nchunks && st.ok(); ++j) {
    const uint64_t cs = j * chunk_bytes;
    ChunkRef& c = (*layout)[j];
    const uint64_t len = c.nbytes;
    const uint32_t dir = c.ext->dir;
    const auto& file = files_[dir];
    const uint8_t* s = src + (repeat != 0 ? cs % repeat : cs);  // (repeat: whole chunks)
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
    const uint64_t cs = j * chunk_bytes;
    (*layout)[j].checksum = xxh3_64(src + (repeat != 0 ? cs % repeat : cs), (*layout)[j].nbytes);
  }
  for (auto& f : futs) {
    const auto& r = f.result();
    if (st.ok() && !r.ok()) st = r.status();
  }
  counters_.nvme_write_wait_ns.add(ns_since(t_io));
  if (!st.ok()) return st.with_context("put '" + key + "'");
  return LayoutPtr(layout);
}

std::function<Status()> StoreImpl::checksum_check(const std::string& key, uint32_t j,
                                                  uint64_t cs, const ChunkRef& c,
                                                  std::shared_ptr<const Hashed> hashed) const {
  return [this, hashed = std::move(hashed), key, j, cs, c]() -> Status {
    const uint64_t got = hashed->h.digest();
    if (got != c.checksum) return checksum_error(key, j, cs, c, got);
    return Status::OK();
  };
}

Future<void> StoreImpl::staged_read_async(const std::string& key, uint32_t j, uint64_t cs,
                                          const ChunkRef& c, uint64_t lo, uint64_t hi,
                                          bool verify, uint8_t* buf, uint64_t piece_cap,
                                          PieceSink sink) {
  // Range of the chunk to read: all of it when verifying, else the aligned cover of [lo, hi).
  const uint64_t a = verify ? 0 : align_down(lo, kAlign);
  const uint64_t b = verify ? c.nbytes : std::min(c.nbytes, align_up(hi, kAlign));
  const uint64_t piece = std::min(piece_cap, align_up(b - a, kAlign));
  struct State : Hashed {
    uint8_t* bufs[2];
  };
  auto s = std::make_shared<State>();
  s->bufs[0] = buf;
  s->bufs[1] = buf + piece;
  const std::shared_ptr<IoFile>* file = &files_[c.ext->dir];
  IoEngine* engine = &io(c.ext->dir);
  const uint64_t offset = c.ext->offset;
  auto plen = [a, b, piece](uint64_t i) { return std::min(piece, b - (a + i * piece)); };
  const std::string context = "object '" + key + "' chunk " + std::to_string(j);
  counters_.nvme().read(align_up(b - a, kAlign));
  PieceSteps steps;
  steps.count = (b - a + piece - 1) / piece;
  steps.window = 2;
  steps.load = [s, file, engine, offset, plen, a, piece, context](uint64_t i) {
    return with_context(engine->read_async(*file, s->bufs[i % 2], align_up(plen(i), kAlign),
                                     offset + a + i * piece),
                        context);
  };
  steps.process = [s, sink = std::move(sink), plen, a, piece, lo, hi, verify](uint64_t i) {
    const uint64_t p = a + i * piece, n = plen(i);
    if (verify) s->h.update(s->bufs[i % 2], n);
    const uint64_t s0 = std::max(p, lo), s1 = std::min(p + n, hi);
    if (s0 < s1) return sink(s->bufs[i % 2] + (s0 - p), s0, s1 - s0);
    return Status::OK();
  };
  if (verify) steps.finish = checksum_check(key, j, cs, c, s);
  steps.cpu = cpu_pool_.get();
  return run_pieces(std::move(steps));
}

Status StoreImpl::staged_read_chunk(const std::string& key, uint32_t j, uint64_t cs,
                                    const ChunkRef& c, uint64_t lo, uint64_t hi, bool verify,
                                    PieceSink sink) {
  const uint64_t piece = staged_piece(c.nbytes);
  STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, staging(c.ext->dir, 2 * piece));
  const auto t_io = StatsClock::now();
  Status st = staged_read_async(key, j, cs, c, lo, hi, verify, static_cast<uint8_t*>(buf.data()),
                                piece, std::move(sink))
                  .result()
                  .status();
  counters_.nvme_read_wait_ns.add(ns_since(t_io));
  return st;
}

Future<void> StoreImpl::direct_read_async(const std::string& key, uint32_t j, uint64_t cs,
                                          const ChunkRef& c, uint8_t* d, bool verify) {
  // Pieces of kHashPiece straight into `d`, all in flight at once, each verified as soon as
  // it is in (in order) while the later ones are still in flight; a partial last 4 KiB
  // block through an aligned tail block.
  struct State : Hashed {
    AlignedBlock tail;
  };
  auto s = std::make_shared<State>();
  const uint64_t body = align_down(c.nbytes, kAlign);
  const uint64_t nbody = (body + kHashPiece - 1) / kHashPiece;
  const uint64_t nbytes = c.nbytes;
  if (nbytes > body) s->tail = aligned_block(kAlign);
  const std::shared_ptr<IoFile>* file = &files_[c.ext->dir];
  IoEngine* engine = &io(c.ext->dir);
  const uint64_t offset = c.ext->offset;
  const std::string context = "object '" + key + "' chunk " + std::to_string(j);
  counters_.nvme().read(align_up(nbytes, kAlign));
  PieceSteps steps;
  steps.count = nbody + (nbytes > body ? 1 : 0);
  steps.load = [s, file, engine, offset, d, body, nbody, context](uint64_t i) {
    const uint64_t p = i * kHashPiece;
    Future<uint64_t> f = i < nbody
                             ? engine->read_async(*file, d + p, std::min(kHashPiece, body - p), offset + p)
                             : engine->read_async(*file, s->tail.get(), kAlign, offset + body);
    return with_context(f, context);
  };
  steps.process = [s, d, body, nbody, nbytes, verify](uint64_t i) {
    const uint64_t p = i * kHashPiece;
    if (i < nbody) {
      if (verify) s->h.update(d + p, std::min(kHashPiece, body - p));
    } else {
      std::memcpy(d + body, s->tail.get(), nbytes - body);
      if (verify) s->h.update(d + body, nbytes - body);
    }
    return Status::OK();
  };
  if (verify) steps.finish = checksum_check(key, j, cs, c, s);
  steps.cpu = cpu_pool_.get();
  return run_pieces(std::move(steps));
}

Future<void> StoreImpl::read_layout_async(const std::string& key, LayoutPtr l, uint64_t off,
                                          uint64_t n, uint8_t* dst, bool dst_dev, bool verify) {
  if (n == 0) return make_ready_future();
  const auto t_io = StatsClock::now();
  const Layout& lay = *l;
  const uint64_t chunk_bytes = lay.chunk_bytes != 0 ? lay.chunk_bytes : chunk_bytes_;
  const uint64_t j0 = off / chunk_bytes, j1 = (off + n - 1) / chunk_bytes;
  // Whole chunks into aligned host memory go straight from the disk (O_DIRECT), all chunks
  // in flight at once. The rest streams through staging buffers, one chunk after another
  // per staging pool (NUMA group), from one buffer allocated here, on the calling thread:
  // allocation may wait for memory, which a completion thread must never do.
  std::vector<uint64_t> direct;
  std::map<uint32_t, std::vector<uint64_t>> staged;  // group -> chunks
  std::map<uint32_t, uint64_t> staged_span;          // group -> longest span
  for (uint64_t j = j0; j <= j1; ++j) {
    const ChunkRef& c = lay[j];
    const uint64_t cs = j * chunk_bytes;
    const uint64_t lo = std::max(off, cs), hi = std::min(off + n, cs + c.nbytes);
    const auto& file = files_[c.ext->dir];
    if (!file) {
      return make_ready_future(Result<void>(not_found(
          "object '" + key + "': data file of directory " + dirs_[c.ext->dir] + " is missing")));
    }
    bool whole = lo == cs && hi == cs + c.nbytes;
    if (whole && !dst_dev &&
        is_aligned_ptr(dst + (lo - off), std::max<uint32_t>(file->memory_alignment(), 1))) {
      direct.push_back(j);
    } else {
      const uint32_t g = dir_group_[c.ext->dir];
      staged[g].push_back(j);
      staged_span[g] = std::max(staged_span[g], verify ? c.nbytes : hi - lo + 2 * kAlign);
    }
  }
  struct Job {
    LayoutPtr layout;
    std::vector<PinnedBuffer> bufs;
    FirstError error;
  };
  auto job = std::make_shared<Job>();
  job->layout = std::move(l);
  std::vector<std::pair<uint32_t, uint64_t>> pieces;  // group -> piece size
  for (const auto& [g, span] : staged_span) {
    const uint64_t piece = staged_piece(span);
    const uint32_t dir = static_cast<uint32_t>(lay[staged[g].front()].ext->dir);
    auto buf = staging(dir, 2 * piece);
    if (!buf.ok()) return make_ready_future(Result<void>(buf.status()));
    job->bufs.push_back(std::move(buf).value());
    pieces.emplace_back(g, piece);
  }
  std::vector<Future<void>> parts;
  for (uint64_t j : direct) {
    const uint64_t cs = j * chunk_bytes;
    parts.push_back(direct_read_async(key, static_cast<uint32_t>(j), cs, lay[j], dst + (cs - off),
                                      verify)
                        .then([job, j](const Result<void>& r) -> Status {
                          job->error.note(j, r.status());
                          return r.status();
                        }));
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto [g, piece] = pieces[k];
    uint8_t* buf = static_cast<uint8_t*>(job->bufs[k].data());
    std::vector<std::function<Future<void>()>> chain;
    for (uint64_t j : staged[g]) {
      chain.push_back([this, job, key, j, off, n, dst, dst_dev, verify, buf, piece, chunk_bytes]() {
        const ChunkRef& c = (*job->layout)[j];
        const uint64_t cs = j * chunk_bytes;
        const uint64_t lo = std::max(off, cs) - cs, hi = std::min(off + n, cs + c.nbytes) - cs;
        auto sink = [this, dst, cs, off, dst_dev](const uint8_t* b, uint64_t coff, uint64_t len) {
          return copy_mem(dst + (cs + coff - off), b, len, dst_dev);
        };
        return staged_read_async(key, static_cast<uint32_t>(j), cs, c, lo, hi, verify, buf, piece,
                                 sink)
            .then([job, j](const Result<void>& r) -> Status {
              job->error.note(j, r.status());
              return r.status();
            });
      });
    }
    parts.push_back(run_in_sequence(std::move(chain)));
  }
  // Every part completes before the buffers go (after an error too): the error is the one
  // of the lowest chunk.
  return when_all(parts).then([this, job, t_io](const Result<void>&) -> Status {
    counters_.nvme_read_wait_ns.add(ns_since(t_io));
    job->bufs.clear();
    job->layout.reset();
    return job->error.status();
  });
}

Status StoreImpl::read_layout(const std::string& key, LayoutPtr l, uint64_t off, uint64_t n,
                              uint8_t* dst, bool dst_dev, bool verify) {
  return read_layout_async(key, std::move(l), off, n, dst, dst_dev, verify).result().status();
}

}  // namespace strata::store_detail
