// Internal: the state of an OffloadedOptimizer (offload.hpp), shared by its files:
//   offload_optimizer.cpp   create/open, rules and resources, the public members
//   offload_tensors.cpp     host-tier memory, add_param, the range accessors
//   offload_pipeline.cpp    step(): gradient checks, DRAM tensors, the NVMe pipeline
//   offload_checkpoint.cpp  the checkpoint record, checkpoint(), close(), restore at open()
//   offload_space.cpp       the disk space the state needs, checked against free space
//   offload_overlap.cpp     the step overlapped with backward (begin_step .. finish_step)
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata/optimizer/offload.hpp"
#include "strata/base/thread_pool.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/store.hpp"

namespace strata::optimizer {

namespace offload_detail {

using Clock = std::chrono::steady_clock;
inline constexpr uint64_t kAlign = 4096;
/// Smallest store chunk of the state objects add_param() creates (Impl::chunk_bytes):
/// below it, per-chunk costs (a catalog row, a request, a checksum) outweigh reading a
/// neighbouring sub-group.
inline constexpr uint64_t kMinStateChunk = 1ull << 20;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Non-empty printable ASCII without whitespace (parameter and state-stream names).
bool valid_name(std::string_view name);

/// Widens the `n` bf16 values stored at byte offset `src_offset` >= 2 * n of `data` to
/// fp32 at data[0, n) (exact), in tiles through a stack buffer (the SIMD
/// load_scaled_grad at scale 1), front to back: with src_offset >= 2 * n no tile's fp32
/// output reaches bf16 input not yet converted.
void widen_bf16_in_place(float* data, uint64_t src_offset, uint64_t n);
/// Narrows data[0, n) fp32 to bf16 (round to nearest even, NaN -> 0x7FC0: store_converted)
/// at bytes [0, 2 * n) of `data`, in tiles through a stack buffer, front to back.
void narrow_bf16_in_place(float* data, uint64_t n);

/// Anonymous private memory (transparent huge pages when allowed), zero-filled.
class HostArray {
 public:
  HostArray() = default;
  /// \error IoError (errno of mmap) when the memory cannot be mapped.
  static Result<HostArray> allocate(uint64_t nbytes);
  HostArray(HostArray&& o) noexcept : p_(o.p_), nbytes_(o.nbytes_) { o.p_ = nullptr; }
  HostArray& operator=(HostArray&& o) noexcept;
  ~HostArray();
  float* data() const { return p_; }

 private:
  float* p_ = nullptr;
  uint64_t nbytes_ = 0;
};

/// The claim of one open optimizer on (store instance, key prefix), process-wide: while it
/// is held no other optimizer may be created or opened on the same Store object under a
/// prefix that equals, contains or is contained in this one (their keys would overlap).
/// Released by its destructor. Thread-safe (one process-wide mutex).
class PrefixClaim {
 public:
  PrefixClaim() = default;
  /// \error FailedPrecondition naming both prefixes and the store when another open
  ///     optimizer of `store` holds an overlapping prefix.
  static Result<PrefixClaim> acquire(const Store* store, const std::string& prefix);
  PrefixClaim(PrefixClaim&& o) noexcept : store_(o.store_), prefix_(std::move(o.prefix_)) {
    o.store_ = nullptr;
  }
  PrefixClaim& operator=(PrefixClaim&& o) noexcept;
  PrefixClaim(const PrefixClaim&) = delete;
  PrefixClaim& operator=(const PrefixClaim&) = delete;
  ~PrefixClaim() { release(); }

 private:
  void release();
  const Store* store_ = nullptr;
  std::string prefix_;
};

}  // namespace offload_detail

struct OffloadedOptimizer::Impl {
  using HostArray = offload_detail::HostArray;

  /// First member: released last, after everything else of the optimizer is gone.
  offload_detail::PrefixClaim claim;

  struct Group {
    Hyperparams hp;
    std::unique_ptr<UpdateRule> rule;
  };
  struct Tensor {
    std::string name;
    uint64_t numel = 0;
    Placement placement = Placement::kNvme;
    int group = 0;
    ParamState state;
    const void* grad = nullptr;
    DType grad_type = DType::kFloat32;
    /// set_grad_object(): the store object holding the gradient (numel elements of
    /// grad_type), read sub-group by sub-group into the slots' gradient regions; `grad` is
    /// then null. Empty: the gradient is `grad` (or none).
    std::string grad_key;
    void* copy = nullptr;
    DType copy_type = DType::kBFloat16;
    std::vector<std::string> keys;  // [0] master, [1 + k] state stream k
    std::vector<uint64_t> chunks;   // bytes per store chunk of each key's object
    std::vector<HostArray> host;    // kHost only: same indexing as keys
    /// A gradient is attached: in memory (set_grad, start_update) or a store object.
    bool has_grad() const { return grad != nullptr || !grad_key.empty(); }
  };

  std::shared_ptr<Store> store;
  RuleFactory factory;
  OffloadOptions opts;
  std::string rule_name;
  int num_states = 0;
  std::vector<std::string> state_names;
  std::vector<float> state_inits;
  std::vector<Group> groups;
  std::vector<Tensor> tensors;
  std::unordered_map<std::string, ParamHandle> by_name;
  uint64_t host_bytes = 0;
  // Lifetime (checkpoint rule, offload.hpp): `changed` = something changed since the last
  // checkpoint (close() checkpoints only then); `broken` = a step failed after it may
  // have changed tensors (no checkpoint can be made any more); `closed` = close() ran.
  bool changed = false;
  Status broken;
  bool closed = false;
  // Every tensor's objects as the last checkpoint (or open()) committed them, and every
  // key that checkpoint covered: a close() that saves nothing (close(false), a broken step,
  // a failed checkpoint) rolls the objects back to it, commits that version again and ends
  // the holds, so the store can be reopened by an optimizer at once. `committed_keys`
  // empty = no such savepoint (none taken yet, or it could not be taken): the holds stay.
  Savepoint committed;
  std::vector<std::string> committed_keys;
  std::string committed_meta;  // the record's text of that checkpoint

  std::unique_ptr<ThreadPool> pool;  // the kernel threads (make_kernel_pool)
  std::shared_ptr<PinnedPool> pinned;
  OffloadPlacement placement;
  // Pinned slots: each holds num_streams() streams of stream_stride bytes (master, then
  // the states).
  std::vector<PinnedBuffer> slots;
  // The gradient region of each slot (slot_grad: the sub-groups of gradients read from
  // store objects, set_grad_object): stream_stride bytes each, a pool of their own made by
  // the first set_grad_object (ensure_grad_regions), so optimizers that never take a
  // gradient object keep num_streams() regions per slot.
  std::shared_ptr<PinnedPool> grad_pinned;
  std::vector<PinnedBuffer> grad_slots;
  uint64_t sg = 0;             // sub-group elements
  uint64_t stream_stride = 0;  // bytes between streams inside a slot
  // Bytes per store chunk of the objects add_param() creates (PutOptions::chunk_bytes):
  // the sub-group's bytes (rounded up to a multiple of them of at least 1 MiB) when that
  // is below the store's chunk, so that each sub-group is whole chunks: read without its
  // neighbours (verification reads whole chunks) and written without read-modify-write.
  uint64_t chunk_bytes = 0;

  // Serialization of members: the baton (busy) is held by one call at a time.
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  mutable bool busy = false;
  /// step_async()'s worker: one thread, started by the first step_async(), joined by
  /// close(); it runs one step at a time (the step holds the baton).
  std::unique_ptr<ThreadPool> step_queue;
  Future<StepStats> last_step;  // the last step_async()'s future (set under the baton)

  /// The open overlapped step (offload_overlap.cpp), null when none.
  struct EarlyStep {
    StepOptions opts;
    std::vector<char> started;        // per tensor: an early update was queued or ran
    std::vector<EarlyGrad> entries;   // per tensor: its start_update() entry (grad null: none)
    std::vector<Hyperparams> used_hp;  // per tensor: its group's hyperparameters when updated
    std::vector<Savepoint> savepoints;  // one per batch that ran, in order
    StepStats stats;                    // the early updates' counters
    Status error;                       // the first early update's error
    bool nonfinite = false;             // a started tensor's gradient holds inf/NaN
    /// Per tensor: XXH3-64 of its gradient's bytes as the early update read them, and
    /// whether its batch has run (the fingerprint is then set).
    std::vector<uint64_t> grad_hash;
    std::vector<char> ran_early;
    uint32_t ran = 0;  // tensors whose early update completed

    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<uint32_t>> queue;  // batches of tensor handles
    bool running = false;                     // the thread is on a batch
    bool stop = false;
    std::thread thread;
  };
  std::unique_ptr<EarlyStep> early;
  /// FailedPrecondition naming `what` while an overlapped step is open.
  Status check_no_open_step(const char* what) const;

  /// Holds the baton for its lifetime (waits for the holder, e.g. an in-flight step).
  class Baton {
   public:
    explicit Baton(const Impl* impl);
    ~Baton();
    Baton(const Baton&) = delete;
    Baton& operator=(const Baton&) = delete;

   private:
    const Impl* impl_;
  };

  std::string key_of(const std::string& name, int stream) const {
    return opts.key_prefix + "p/" + name + "/" +
           (stream == 0 ? std::string("param") : state_names[stream - 1]);
  }
  std::string meta_key() const { return opts.key_prefix + "meta"; }
  /// Every store key of the optimizer: the record and each tensor's streams.
  std::vector<std::string> all_keys() const;
  /// FailedPrecondition "<what>: the optimizer is closed" once close() ran.
  Status check_open(const char* what) const;
  int num_streams() const { return 1 + num_states; }
  /// OffloadOptions::state_dtype is kBFloat16: the state objects (and host-tier state
  /// arrays) hold bf16, widened to fp32 before and narrowed (RNE) after each update.
  bool bf16_states() const { return opts.state_dtype == DType::kBFloat16; }
  /// Bytes per element of stream `stream` (0 master: 4; states: 4, or 2 when bf16).
  uint64_t elem_bytes(int stream) const { return stream > 0 && bf16_states() ? 2 : 4; }
  /// Bytes per element of a tensor's streams together (master + states): DRAM of a
  /// host-tier tensor, store bytes of one element's update.
  uint64_t bytes_per_element() const {
    return 4 + static_cast<uint64_t>(num_states) * elem_bytes(1);
  }
  /// Store chunk bytes of the state objects add_param() creates: chunk_bytes scaled by
  /// elem_bytes(1) / 4 (whole sub-groups per chunk), or chunk_bytes when that is not a
  /// multiple of 4 KiB.
  uint64_t state_chunk_bytes() const {
    if (!bf16_states() || (chunk_bytes / 2) % offload_detail::kAlign != 0) return chunk_bytes;
    return chunk_bytes / 2;
  }
  /// The update of a host-tier tensor with bf16 states: sub-groups of sg elements whose
  /// states are widened into host_scratch, updated, and narrowed back.
  Status update_host_bf16(const Tensor& t, const UpdateSpans& whole, const StepInfo& info);
  std::vector<float> host_scratch;  // num_states * sg floats, allocated on first use
  /// Byte offset, inside a state stream's region of a slot item of `count` elements (the
  /// item's align_up(count * 4, 4 KiB) bytes at its slot_off: items are packed), where a
  /// bf16 read lands: at least 2 * count (so the forward widening of widen_bf16_in_place
  /// never overwrites bytes still to be read) and 4 KiB-aligned when the region leaves room
  /// for that, so the store reads straight into it.
  static uint64_t bf16_read_offset(uint64_t count) {
    const uint64_t half = count * 2;
    const uint64_t region = (count * 4 + offload_detail::kAlign - 1) / offload_detail::kAlign *
                            offload_detail::kAlign;
    const uint64_t aligned = (region - half) / offload_detail::kAlign * offload_detail::kAlign;
    return aligned >= half ? aligned : half;
  }
  float* slot_stream(size_t slot, int stream) const {
    return reinterpret_cast<float*>(static_cast<char*>(slots[slot].data()) +
                                    static_cast<uint64_t>(stream) * stream_stride);
  }
  /// The gradient region of `slot` (ensure_grad_regions() first): an item at element offset
  /// slot_off of the streams has its gradient at byte offset slot_off * 4 here.
  char* slot_grad(size_t slot) const { return static_cast<char*>(grad_slots[slot].data()); }
  /// Allocates the slots' gradient regions (grad_slots) unless done already.
  /// \error ResourceExhausted when the pinned memory cannot be had.
  Status ensure_grad_regions();

  // ---- offload_optimizer.cpp: rules and resources ---------------------------------------

  Status check_handle(ParamHandle h) const;
  /// OK when store object `key` can be the gradient of `t`: it exists, undamaged, holds
  /// t.numel * dtype_size(type) bytes, and records `type` (or raw bytes, kUInt8).
  /// \error NotFound, InvalidArgument or DataLoss, the message starting with `what` and
  ///     naming the key and the sizes.
  Status check_grad_object(const Tensor& t, const std::string& key, DType type,
                           const std::string& what) const;
  /// Builds a group's rule and checks it matches the optimizer's state streams.
  Result<std::unique_ptr<UpdateRule>> build_rule(const Hyperparams& hp) const;
  /// Takes the rule name and state streams from the first rule.
  Status init_from_rule(const UpdateRule& rule);
  /// Resolves the sub-group size and allocates the pinned slots and the kernel threads,
  /// both on opts.numa_node of Topology::system().
  Status setup_resources();

  // ---- offload_tensors.cpp --------------------------------------------------------------

  Result<ParamHandle> add_param(std::string_view name, uint64_t numel, const float* init,
                                int group, Placement placement);
  /// Elements [offset, offset + count) of stream `stream` (0 master, 1 + k state k) of `h`.
  Status read_stream(ParamHandle h, int stream, float* dst, uint64_t offset, uint64_t count);
  Status write_stream(ParamHandle h, int stream, const float* src, uint64_t offset,
                      uint64_t count);

  // ---- offload_pipeline.cpp -------------------------------------------------------------

  Result<StepStats> step(const StepOptions& o) {
    Result<StepStats> r = step_impl(o, nullptr, nullptr);
    if (r.ok()) record(*r);
    return r;
  }
  /// Adds a completed step to `totals` (OffloadedOptimizer::stats()).
  void record(const StepStats& s);
  mutable std::mutex stats_mu;  // guards totals only (stats() reads them during a step)
  OptimizerStats totals;

  /// One pipeline work item: elements [begin, begin + count) of tensor t, at element
  /// offset slot_off of its batch's slot streams. `grad` / `copy` override the tensor's
  /// attached gradient / param copy (early updates) when not null. `grad_object`: the
  /// gradient is the tensor's grad_key object, of `grad_type`: the item's reads read its
  /// bytes [begin, begin + count) * dtype_size(grad_type) into the slot's gradient region
  /// at byte slot_off * 4, and the update takes it from there.
  struct Item {
    uint32_t t;
    uint64_t begin, count;
    uint64_t slot_off;
    const void* grad = nullptr;
    DType grad_type = DType::kFloat32;
    bool grad_object = false;
    void* copy = nullptr;
    DType copy_type = DType::kFloat32;
    const float* master = nullptr;  // the master's values in memory (EarlyGrad::master)
  };
  /// Early updates already applied to some tensors: a step over the rest (see step_impl).
  struct StartedSet {
    const std::vector<char>* started;           // per tensor: updated early
    const std::vector<EarlyGrad>* early_grads;  // per tensor: its entry (grad null: none)
    float expected_scale = 1.0f;                // the speculation: the gate's scale
    bool redo = false;  // the early updates were rolled back: update every tensor
    // (Not redoing, the started tensors' gradients were scanned finite by the early thread:
    // the non-finite check scans only the others; the global norm, when clipping, is still
    // computed over every gradient, exactly as step().)
  };
  /// step(): with `started` null, every tensor with a gradient. With `started` (and not
  /// redo), the tensors marked there are already updated with scale
  /// started->expected_scale and are skipped by the pipeline (their counters advance with
  /// the others); when the gate decides otherwise (skip, another scale) nothing is updated
  /// and *mismatch is set. Either way a tensor's start_update() entry overrides its
  /// gradient and param copy.
  Result<StepStats> step_impl(const StepOptions& o, const StartedSet* started, bool* mismatch);
  /// `b` follows `a` in one request of the pipeline: the next sub-group of the same tensor,
  /// right after `a` in the slot too, its master and gradient taken the same way.
  static bool continues_run(const Item& a, const Item& b) {
    return a.t == b.t && a.begin + a.count == b.begin && a.slot_off + a.count == b.slot_off &&
           a.master == b.master && a.grad_object == b.grad_object;
  }
  /// The items of the tensors of `work` (handle, start_update() entry or null) in order:
  /// sub-groups of at most sg elements, packed into batches of one slot each (batch j:
  /// items [batches[j], batches[j + 1]), each at a 4 KiB-aligned slot offset).
  void plan_items(const std::vector<std::pair<uint32_t, const EarlyGrad*>>& work,
                  std::vector<Item>& items, std::vector<size_t>& batches) const;
  /// Runs the NVMe pipeline over `items` packed into `batches` (see offload_pipeline.cpp).
  /// `gate` runs once the first reads are in flight and decides whether the step goes
  /// ahead and with which gradient scale: nullopt skips it (nothing is written).
  using Gate = std::function<Result<std::optional<float>>()>;
  Status run_pipeline(const std::vector<Item>& items, const std::vector<size_t>& batches,
                      const Gate& gate, StepStats& stats, bool* skipped);

  // ---- offload_space.cpp ----------------------------------------------------------------

  Result<DiskSpaceNeed> disk_space_need(const std::vector<uint64_t>& more_numels) const;
  /// ResourceExhausted (message starting with `what`) when disk_space_need does not fit.
  Status check_disk_space(const std::vector<uint64_t>& more_numels, const std::string& what) const;

  // ---- offload_checkpoint.cpp -----------------------------------------------------------

  /// Replaces the record by the current state: a pinned, dirty host-tier object under a
  /// Store::hold(), committed by checkpoint()'s Store::commit() with the tensors' chunks.
  Status put_meta();
  Status checkpoint();
  /// A savepoint of every tensor's objects as they are now (about to be, or just,
  /// committed: checkpoint(), open()), for `committed`.
  /// \error what Store::savepoint() returns (logged).
  Result<Savepoint> save_committed();
  /// Makes `sp` (from save_committed(), of the state now committed) the resume point a
  /// close without a checkpoint rolls back to.
  void set_committed(Savepoint sp);
  /// close() without a saved state: rolls back to `committed` (see there).
  /// \error the store's rollback/commit errors (the holds then stay).
  Status drop_uncommitted();
  /// close(): a checkpoint when anything changed (and `checkpoint`), then the holds and
  /// the resources go.
  Status close(bool checkpoint);
  /// open(): the groups, rules, resources and tensors of the record under meta_key().
  Status restore();
  /// remove(): the stream objects of every parameter the record lists (builds the
  /// recorded rule for its state names; no resources).
  Result<std::vector<std::string>> recorded_keys();

 private:
  // offload_tensors.cpp
  Status fill_object(const std::string& key, uint64_t numel, float value);
  Status check_range(ParamHandle h, int stream, uint64_t offset, uint64_t& count) const;

  // offload_pipeline.cpp
  UpdateSpans host_spans(const Tensor& t) const;

  // offload_checkpoint.cpp
  std::string serialize_meta() const;
};

}  // namespace strata::optimizer
