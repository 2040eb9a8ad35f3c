// strata::store — partitioned objects (bandwidth-centric partitioning, ZeRO-Infinity).
//
// An object of `numel` elements is split over the N ranks of a Communicator. With
// c = ceil(numel / N), rank r owns elements [r*c, min((r+1)*c, numel)) — possibly none
// when numel < N — and keeps only those in its own Store (its own NVMe directory).
// fetch_partitioned() has every rank read its slice in parallel and all-gathers the full
// tensor into a caller buffer; the read of piece k+1 overlaps the all-gather of piece k.
// Each rank moves S/N bytes from its disk and the all-gather moves S*(N-1)/N bytes per
// rank, so when pipelined: time ~= max(S / (N * disk_bw), allgather(S))
// (Rajbhandari et al., "ZeRO-Infinity", SC'21, section 6.1 "bandwidth-centric
// partitioning"; docs/partitioned.md). Padding (the last slice shorter than c) is
// internal: callers see exactly numel elements.
//
// In the store, rank r's part of object `key` is two objects of that rank's store:
//   key + kPartitionDataSuffix  ("#part"):      dtype, shape {owned_numel} (absent when 0)
//   key + kPartitionMetaSuffix  ("#partmeta"):  a small record (numel, N, r, dtype, shape)
// written in that order, so a visible meta record implies a complete data object.
//
// Collectives: put_partitioned, fetch_partitioned and reduce_scatter_grads are collective
// over `comm` — every rank calls them in the same order with the same key/desc — and they
// issue collectives of their own. No other collective may be issued on `comm` between the
// call and the readiness of its future (the communicator orders operations by issue
// order; an interleaved one would pair with the wrong operation on other ranks).
//
// Memory: host memory only (a Gloo communicator). A NCCL communicator gives Unimplemented.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/base/dtype.hpp"
#include "strata/store/store.hpp"

namespace strata {

inline constexpr const char* kPartitionDataSuffix = "#part";
inline constexpr const char* kPartitionMetaSuffix = "#partmeta";

/// Which elements each of `world_size` ranks owns (pure arithmetic, no I/O).
/// chunk_numel c = ceil(numel / world_size); rank r owns [begin(r), end(r)) with
/// begin(r) = min(r*c, numel), end(r) = min((r+1)*c, numel). padded_numel() = N*c >= numel.
/// Thread-safety: a value type.
struct PartitionLayout {
  uint64_t numel = 0;
  int world_size = 1;
  uint64_t chunk_numel = 0;  ///< c: elements per rank including padding

  uint64_t begin(int rank) const;
  uint64_t end(int rank) const;
  uint64_t owned_numel(int rank) const { return end(rank) - begin(rank); }
  uint64_t padded_numel() const { return chunk_numel * static_cast<uint64_t>(world_size); }
};

/// The layout of `numel` elements over `world_size` ranks.
/// \error InvalidArgument when world_size < 1.
Result<PartitionLayout> partition_layout(uint64_t numel, int world_size);

/// The piece fetch_partitioned() uses: `piece_bytes` rounded up to a multiple of
/// `store_chunk_bytes` (itself a multiple of 4096), because Store::read_range() reads and
/// verifies whole chunks. Pure function.
uint64_t effective_piece_bytes(uint64_t piece_bytes, uint64_t store_chunk_bytes);

/// What a rank's store records about its part of a partitioned object.
struct PartitionInfo {
  std::string key;           ///< the object's key (without suffix)
  TensorDesc desc;           ///< dtype and shape of the full tensor
  uint64_t numel = 0;        ///< elements of the full tensor
  int world_size = 0;        ///< N at put time
  int rank = 0;              ///< the rank whose slice this store holds
  uint64_t owned_begin = 0;  ///< first owned element
  uint64_t owned_numel = 0;  ///< owned elements (0 when numel < N and rank >= numel)
};

/// Options of the partitioned calls. Every field states its default.
struct PartitionOptions {
  /// Pipeline piece: bytes of one rank's slice read and gathered per step, rounded up to a
  /// multiple of the store's chunk_bytes() (see effective_piece_bytes(); open stores for
  /// partitioned objects with chunk_bytes <= piece_bytes to pipeline finely). Each step
  /// all-gathers N pieces. Memory: 3 read buffers of a piece + 2 staging buffers of N
  /// pieces (sequential: the whole slice + 2 staging buffers). Default 8 MiB.
  uint64_t piece_bytes = 8ull << 20;
  /// true: read piece k+1 while piece k is gathered. false: read the whole slice, then
  /// gather it in pieces (the "sequential" baseline of `strata bench partitioned-read`).
  /// Default true.
  bool pipelined = true;
  /// put_partitioned: tier receiving the slice and whether an existing key is replaced
  /// (both the slice and the meta record). Default {nvme, no overwrite}.
  PutOptions put;
};

/// Collective: each rank stores the slice it owns of the full tensor `full_src`
/// (`full_desc.nbytes()` bytes, every rank passes the whole tensor) in `store` as
/// `key#part` plus the record `key#partmeta` (see the file comment).
/// \param full_src host memory of full_desc.nbytes() bytes; valid until the future is
///     ready (only the owned range is read).
/// \returns a future that is OK on every rank only when every rank stored its slice.
/// \error on every rank: Unavailable "rank R failed to store its slice" when another rank
///     failed; on the failing rank, its store's error (AlreadyExists without
///     opts.put.overwrite, ResourceExhausted, IoError...) with the key as context;
///     InvalidArgument for an empty key or a null src with a non-empty slice;
///     Unimplemented for a NCCL communicator; the communicator's errors (Unavailable naming
///     a dead rank, DeadlineExceeded).
/// \threadsafety see the file comment (collective ordering); store and comm must outlive
///     the future.
Future<void> put_partitioned_async(Store& store, Communicator& comm, const std::string& key,
                                   const void* full_src, const TensorDesc& full_desc,
                             const PartitionOptions& opts = {});

/// As put_partitioned, but `owned_src` holds only this rank's slice:
/// partition_layout(full_desc.numel(), comm.size()).owned_numel(comm.rank()) elements of
/// full_desc.dtype (may be null when that is 0).
Future<void> put_partitioned_slice_async(Store& store, Communicator& comm, const std::string& key,
                                         const void* owned_src, const TensorDesc& full_desc,
                                   const PartitionOptions& opts = {});

/// Collective: every rank reads its slice from its own `store` (in pieces of
/// opts.piece_bytes) and the slices are all-gathered, so that on every rank `dst` holds
/// the full tensor (full_desc.nbytes() bytes, exact; padding never reaches dst).
/// \param dst host memory of full_desc.nbytes() bytes; untouched by the caller until the
///     future is ready.
/// \error on every rank, agreed before any data moves: FailedPrecondition naming both world
///     sizes when the object was put with a different N ("stored over 3 ranks, fetched over
///     2"), or naming both ranks when a store holds another rank's slice; InvalidArgument
///     naming both descs when full_desc differs from the recorded one; NotFound when a rank
///     lacks `key` ("rank R: ..."). After the data moved: a rank whose read failed
///     (DataLoss, IoError) makes every rank fail with Unavailable naming it, the failing
///     rank returns its own error; the communicator's errors (Unavailable naming a dead
///     rank, DeadlineExceeded after options().timeout) with the key as context.
/// \threadsafety see the file comment; store and comm must outlive the future.
Future<void> fetch_partitioned_async(Store& store, Communicator& comm, const std::string& key,
                                     void* dst, const TensorDesc& full_desc,
                               const PartitionOptions& opts = {});

/// Reads this rank's meta record of `key` (no collective).
/// \error NotFound when `key#partmeta` is absent; DataLoss when the record is malformed.
Result<PartitionInfo> stat_partitioned(Store& store, const std::string& key);

/// Removes this rank's part of `key` (data and meta; no collective).
/// \error NotFound when neither exists.
Status remove_partitioned(Store& store, const std::string& key);

/// Collective, gradient side: `full_grad` (numel elements of `dtype`, the same length on
/// every rank) is reduced element-wise with `op` over the ranks, and rank r receives the
/// reduced elements it owns, partition_layout(numel, N).begin(r) .. end(r), in
/// `owned_slice` (owned_numel(r) elements; may be null when 0). Padding is internal:
/// when numel is not a multiple of N the input is packed into zero-padded pieces of at
/// most `piece_bytes` per rank; when it is, full_grad goes to the communicator without a
/// copy. Semantics of sums of fp16/bf16/integers as in ReduceOp.
/// \param full_grad, owned_slice host memory, valid until the future is ready; must not
///     overlap.
/// \error InvalidArgument for an invalid dtype or a null buffer with a non-zero count;
///     Unimplemented for NCCL; the communicator's errors.
/// \threadsafety see the file comment.
Future<void> reduce_scatter_grads_async(Communicator& comm, const void* full_grad, void* owned_slice,
                                        uint64_t numel, DType dtype, ReduceOp op = ReduceOp::kSum,
                                  uint64_t piece_bytes = 8ull << 20);

// Blocking forms: the *_async call above followed by result(); same arguments, same errors.
inline Status put_partitioned(Store& store, Communicator& comm, const std::string& key,
                              const void* full_src, const TensorDesc& full_desc,
                              const PartitionOptions& opts = {}) {
  return put_partitioned_async(store, comm, key, full_src, full_desc, opts).result().status();
}
inline Status put_partitioned_slice(Store& store, Communicator& comm, const std::string& key,
                                    const void* owned_src, const TensorDesc& full_desc,
                                    const PartitionOptions& opts = {}) {
  return put_partitioned_slice_async(store, comm, key, owned_src, full_desc, opts)
      .result()
      .status();
}
inline Status fetch_partitioned(Store& store, Communicator& comm, const std::string& key,
                                void* dst, const TensorDesc& full_desc,
                                const PartitionOptions& opts = {}) {
  return fetch_partitioned_async(store, comm, key, dst, full_desc, opts).result().status();
}
inline Status reduce_scatter_grads(Communicator& comm, const void* full_grad, void* owned_slice,
                                   uint64_t numel, DType dtype, ReduceOp op = ReduceOp::kSum,
                                   uint64_t piece_bytes = 8ull << 20) {
  return reduce_scatter_grads_async(comm, full_grad, owned_slice, numel, dtype, op, piece_bytes)
      .result()
      .status();
}

}  // namespace strata
