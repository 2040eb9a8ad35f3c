// strata::optimizer — the offloaded optimizer step (ZeRO-Infinity's CPU/NVMe optimizer).
//
// An OffloadedOptimizer owns a set of parameter tensors: fp32 master weights plus the fp32
// state streams of its UpdateRule (Adam: exp_avg, exp_avg_sq), kept in a Store under
// `OffloadOptions::key_prefix`. Each tensor is placed in one tier:
//  - kHost: the master and states live in optimizer-owned DRAM and are updated in place;
//    each has a backing NVMe object that checkpoint() rewrites.
//  - kNvme: the master and states are NVMe objects of the store. step() streams them
//    through a fixed set of pinned buffers in sub-groups of `sub_group_numel` elements as a
//    three-stage pipeline: read sub-group i+1 (master + states), update sub-group i on the
//    CPU, write sub-group i-1 back (Store::write_range, copy-on-write), all concurrently.
//    When every buffer is busy the pipeline waits for one; it never fails for want of one.
// Results are bit-identical whatever the tier, sub-group size, buffer count or thread
// count (apply_update() is element-wise; see update.hpp), for one SIMD target.
//
// Object keys (P = key_prefix, N = parameter name, S = the rule's state names):
//   P + "meta"            the checkpoint record (rule name, hyperparameters of every
//                         param group, each tensor's name/numel/tier/group/step counter)
//   P + "p/" + N + "/param"     fp32[numel] master weights
//   P + "p/" + N + "/" + S      fp32[numel] state stream S (e.g. ".../exp_avg"); bf16[numel]
//                               under OffloadOptions::state_dtype = kBFloat16
//
// CHECKPOINT CONTRACT (one rule, every tier and every language binding): open()
// restores the state of the optimizer's last checkpoint, and close() is a checkpoint.
// checkpoint() makes the state after the last completed step durable in place: it writes
// the host-tier tensors to their backing objects, writes the meta record, and commits the
// copy-on-write chunks of every tensor and the record in one catalog transaction
// (Store::commit of the optimizer's keys). No NVMe-resident byte is copied elsewhere.
// close() -- also the destructor, strata_optimizer_free() / strata_optimizer_close() in C,
// close(), garbage collection and interpreter exit in Python -- checkpoints when anything
// changed since the last checkpoint, then releases the optimizer. A process that ends
// without closing (SIGKILL, a crash, power loss) resumes at its last checkpoint() or
// close(): masters, states, step counters and hyperparameters of that moment, every
// tensor at the same step whatever its tier, and later steps bit-identical to an
// uninterrupted run given the same gradients.
// Between checkpoints the optimizer's objects are held out of the store's own flush()
// and close() (Store::hold): a flush or close of a shared store by its owner commits the
// store's other objects and none of the optimizer's, so it never moves the optimizer's
// resume point. Consequences: a store closed before the optimizer drops the state since
// the last checkpoint (the optimizer's close() then fails with FailedPrecondition: close
// the optimizer first); a step that fails part-way (an I/O error) leaves the tensors
// partly updated, so checkpoint() and close() refuse from then on (FailedPrecondition;
// close() still releases everything) and a resume restores the last checkpoint; a close()
// whose checkpoint fails (e.g. ResourceExhausted, disk full) returns the error, releases
// everything and loses nothing committed (the last checkpoint stays the resume point).
// Do not flush or commit the optimizer's keys while a step or checkpoint() runs.
//
// A RULE THAT FAILS (UpdateRule::may_fail(), e.g. a Python update rule whose callable
// raises): a step with such a rule in any param group is a transaction. Before it, a
// Store::savepoint() of the NVMe tensors' objects; before each host-tier tensor's update, a
// copy of its streams (DRAM: the host-tier state of the stepped tensors, freed after the
// step). When the step fails -- the rule's error, or any other -- the savepoint is rolled
// back and the copies put back: every master, state and step counter is as before the
// step, the optimizer stays usable (checkpoint() and close() work), and the error says
// "rolled back". Only when the rollback itself fails is the optimizer broken as above.
// Parameter copies (set_param_copy) are not restored: those of tensors updated before the
// failure hold the failed step's values (read the masters back, as strata.torch does).
// Cost: the savepoint keeps the chunks this step replaces on disk until the step ends, so
// the store may need room for one more copy of the rewritten state (3 * T instead of
// 2 * T below, for a step between checkpoints). Overlapped steps (begin_step) keep their
// own savepoints and are not covered by this.
//
// DISK SPACE. Writes are copy-on-write: until the next commit (checkpoint(), or a flush of
// the store between steps) the last checkpoint's chunks stay on disk beside the new ones,
// so the store's NVMe directories need room for two copies of the state. With S = 1 +
// num_states streams (Adam 3, amsgrad 4) and D(n, e) = n * e bytes rounded up to 4 KiB (per
// chunk), the state is T = sum over tensors of D(numel, 4) + num_states * D(numel, e)
// (e = 4, or 2 under state_dtype kBFloat16; host-tier tensors too: their backing objects
// are rewritten by checkpoint()), and a store needs
//   2 * T + min(T_nvme, num_buffers * S * slot stream bytes) + 1 MiB
// (the second term: new chunks of the batches in flight beside the copies they replace;
// the third: catalog) + the gaps the store may leave to align large extents
// (DiskSpaceNeed::margin_bytes). create() and add_param() check it against the free space of each
// file system (statvfs) plus the store's reusable blocks: ResourceExhausted naming the
// directory, the need and the free space, in bytes. After each commit the store punches
// the freed extents out of its data files, so a checkpointed store holds about T on disk,
// and at most 2 * T + in-flight between commits.
//
// Memory. Pinned memory = one PinnedPool of num_buffers slots, each holding one sub-group
// (under num_buffers 0 possibly several: see there) of the master and every state stream:
// num_buffers * (1 + num_states) * align_up(sub_group_numel * 4, 4 KiB) bytes, allocated
// once at create()/open() and within pinned_budget_bytes; the first set_grad_object() adds
// one gradient region per slot (num_buffers * align_up(sub_group_numel * 4, 4 KiB) bytes
// more, outside pinned_budget_bytes), where gradients attached as store objects are read.
// No step allocates memory proportional to a tensor's size, so RSS stays flat across steps
// (host-tier tensors and the caller's in-memory gradients aside; a gradient in a store
// object takes no DRAM of its size).
//
// Example:
//   STRATA_ASSIGN_OR_RETURN(auto store, Store::open({.path = "/nvme/run1"}));
//   STRATA_ASSIGN_OR_RETURN(auto factory, builtin_rule_factory("adamw"));
//   STRATA_ASSIGN_OR_RETURN(auto opt, OffloadedOptimizer::create(
//       std::move(store), factory, {{"lr", 1e-4}, {"weight_decay", 0.01}}, {}));
//   STRATA_ASSIGN_OR_RETURN(ParamHandle w, opt->add_param("w", n, init_values));
//   for (...) { opt->set_grad(w, grad_ptr, DType::kBFloat16);
//               STRATA_RETURN_IF_ERROR(opt->step({.max_grad_norm = 1.0}).status()); }
//   STRATA_RETURN_IF_ERROR(opt->checkpoint());
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"
#include "strata/base/dtype.hpp"
#include "strata/optimizer/grad_utils.hpp"
#include "strata/optimizer/update.hpp"
#include "strata/store/config.hpp"
#include "strata/store/store.hpp"

namespace strata::optimizer {

/// Named hyperparameters of a param group, with torch.optim's argument names: "lr",
/// "beta1", "beta2" (torch's betas[0], betas[1]), "eps", "weight_decay", "amsgrad" (0/1),
/// "maximize" (0/1), "any_betas" (0/1, adam/adamw: see AdamOptions::any_betas),
/// "momentum", "dampening", "nesterov" (0/1), "lr_decay",
/// "initial_accumulator_value". Booleans are 0.0 / 1.0.
using Hyperparams = std::map<std::string, double, std::less<>>;

/// Builds the UpdateRule of one param group from its hyperparameters. Called at
/// create()/open(), add_param_group() and whenever a group's hyperparameters change (e.g.
/// set_lr() from a learning-rate scheduler): it must be cheap and must not keep references
/// to its argument. A custom optimizer wraps make_elementwise_rule() in a factory.
/// \error InvalidArgument naming the hyperparameter that is unknown or out of range.
/// \threadsafety called from the thread calling the optimizer member, one call at a time.
using RuleFactory = std::function<Result<std::unique_ptr<UpdateRule>>(const Hyperparams&)>;

/// The factory of a built-in optimizer: "adam", "adamw", "adagrad", "sgd" or "lion"
/// (optimizers.hpp). Keys absent from the Hyperparams take torch.optim's defaults (see
/// builtin_default_hyperparams); unknown keys are InvalidArgument.
/// \error InvalidArgument for an unknown optimizer name.
Result<RuleFactory> builtin_rule_factory(std::string_view optimizer);

/// As builtin_rule_factory("adam" / "adamw"), but the rules are make_torch_exact_adam's:
/// bit-identical to torch.optim.Adam / AdamW (scalar, slower than the SIMD rules). Same
/// hyperparameters, defaults and checks; same rule names, so a checkpoint made with either
/// factory resumes with the other.
/// \error InvalidArgument for any other optimizer name.
Result<RuleFactory> torch_exact_rule_factory(std::string_view optimizer);

/// torch.optim's defaults of a built-in optimizer, every key it accepts (e.g. adamw:
/// lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 1e-2, amsgrad 0, maximize 0).
/// \error InvalidArgument for an unknown optimizer name.
Result<Hyperparams> builtin_default_hyperparams(std::string_view optimizer);

/// Where a tensor's master and states live.
enum class Placement : uint8_t {
  kAuto = 0,  ///< kHost while the host-tier bytes stay within host_budget_bytes, else kNvme
  kHost = 1,  ///< optimizer-owned DRAM, updated in place
  kNvme = 2,  ///< store NVMe objects, streamed through the pinned pipeline
};
/// "auto" | "host" | "nvme".
std::string_view placement_name(Placement p);

/// Options of OffloadedOptimizer::create()/open(). Every field states its default and unit.
/// None can change after create()/open().
struct OffloadOptions {
  /// Prefix of every store key this optimizer uses (several optimizers may share a store
  /// under different prefixes). Two optimizers open at once on one Store object may not
  /// use prefixes that overlap (equal, or one a prefix of the other, e.g. "optim/" and
  /// "optim/a/"): create()/open() of the second fails. Default "optim/".
  std::string key_prefix = "optim/";
  /// Elements per pipeline sub-group (per stream). 0 = auto: the largest multiple of the
  /// store's chunk_bytes()/4 elements (at least one chunk, at most 4 chunks) whose buffers
  /// fit pinned_budget_bytes (when set). Sub-groups that are a multiple of chunk_bytes()/4
  /// elements let write_range() skip read-modify-write. Any value >= 1 is valid; results do
  /// not depend on it. Default 0.
  uint64_t sub_group_numel = 0;
  /// Pinned buffer slots of the pipeline, 0..16. Each slot holds one sub-group of the
  /// master and every state (and, once a gradient object is attached, a gradient region).
  /// 3 give full read/update/write overlap; 1 runs the stages one after another.
  /// 0 = auto: the sub-group is sized as for 4 slots, then the slots are as many as
  /// pinned_budget_bytes holds, 4..64 (4 without a budget), so that a small sub-group
  /// still keeps as many bytes in flight as the budget allows (num_buffers() says how
  /// many). Under auto, with fp32 states, a sub-group smaller than the state objects' chunk
  /// or than 4 MiB per stream (and a multiple of 1024 elements) shares its slot with the
  /// sub-groups after it (whole ones, up to that size, as many as 4 slots of the budget
  /// hold): the consecutive sub-groups of a tensor in one slot are read and written as one
  /// range per stream, so a small sub-group writes whole chunks (no read-modify-write) and
  /// does not multiply the store's requests; each is still updated on its own. Default 4.
  int num_buffers = 4;
  /// Upper bound of the pinned memory of the pipeline, bytes. 0 = exactly what the slots
  /// need: num_buffers * (1 + num_states) * align_up(sub_group_numel * 4, 4 KiB) (the
  /// master and the states of each slot; see Memory above). When set
  /// and sub_group_numel is 0, the sub-group shrinks to fit; when set and an explicit
  /// sub_group_numel does not fit: InvalidArgument. Default 0.
  uint64_t pinned_budget_bytes = 0;
  /// Placement of add_param() calls that pass Placement::kAuto. Default kAuto.
  Placement default_placement = Placement::kAuto;
  /// Bytes of DRAM that host-tier tensors (master 4 bytes per element + each state 4 bytes,
  /// or 2 under state_dtype kBFloat16)
  /// may take under Placement::kAuto; a tensor that would exceed it goes to kNvme.
  /// Explicit kHost placements count too but are never refused. Default 0 (all kAuto
  /// tensors go to NVMe).
  uint64_t host_budget_bytes = 0;
  /// Worker threads of the update kernel (KernelPoolOptions::num_threads). 0 = one per
  /// core of numa_node. Default 0.
  int num_threads = 0;
  /// NUMA node of the kernel threads and of the pinned pipeline memory: a kernel node
  /// number (the store's Topology os_index, as StoreOptions::numa_node and numactl), -1 =
  /// unbound. With a foreign topology (HWLOC_XMLFILE / HWLOC_SYNTHETIC) the targets are
  /// taken from it but nothing is bound (see placement()). Default -1.
  int numa_node = -1;
  /// open(): re-read every NVMe chunk of the store and check its checksum
  /// (Store::verify()) before restoring; any bad chunk fails open() with DataLoss.
  /// Default false (reads verify chunks as they go when the store's verify_checksums is on).
  bool verify_on_open = false;
  /// Element type of the state streams' store objects (and of host-tier state arrays):
  /// kFloat32 (default) or kBFloat16 ("bf16 moments", DeepSpeed's bf16_optimizer_states).
  /// Masters stay fp32 either way. With kBFloat16 a step reads each state sub-group's bf16
  /// bytes (2 per element), widens them to fp32 (exact) for the rule -- which always sees
  /// fp32 spans --, and narrows the updated states back to bf16 with round-to-nearest-even
  /// (NaN -> 0x7FC0, as torch's c10::round_to_nearest_even) before writing 2 bytes per
  /// element: the same values as an fp32 update whose states are rounded to bf16 after
  /// every step. Store bytes per parameter and step (Adam/AdamW): read 4 (master) +
  /// 2 * 2 (moments) = 8 instead of 12, written the same. Initial state values
  /// (UpdateRule::state_init_value) and write_state() values are rounded to bf16;
  /// read_state() returns them widened to fp32. Recorded in the checkpoint: open() with
  /// another state_dtype than the record's fails with FailedPrecondition naming both (no
  /// silent conversion). Any other dtype: InvalidArgument at create()/open(). Every rule
  /// takes kBFloat16, built-in "adagrad" too, but a state that is not a running average
  /// suffers: adagrad's undecayed sum of squared gradients stops growing once an increment
  /// is below sum * 2^-9 (strata.torch's OffloadOptimizer refuses bf16 for torch's
  /// Adagrad, ASGD and Rprop for such reasons).
  DType state_dtype = DType::kFloat32;
};

/// `base` with the fields that the configuration file's "optimizer" section sets
/// (config.hpp; the section is checked when the file is loaded): sub_group_numel,
/// num_buffers, pinned_budget_bytes, host_budget_bytes, num_threads, numa_node,
/// default_placement, verify_on_open and state_dtype ("fp32" | "bf16"). Its other keys (arithmetic, overlap_backward,
/// overlap_bucket_numel) are the bindings'. Precedence: pass what the file may override as
/// `base`, then set the explicit arguments on the result.
/// \threadsafety pure.
OffloadOptions offload_options_from_config(const Config& config, OffloadOptions base = {});

/// Index of a parameter tensor in its optimizer, 0.. in add_param() order (preserved by
/// open()).
using ParamHandle = uint32_t;

/// Elements meaning "to the end of the tensor" in the range accessors below.
inline constexpr uint64_t kToEnd = std::numeric_limits<uint64_t>::max();

/// What param_info() reports.
struct ParamInfo {
  std::string name;
  uint64_t numel = 0;
  Placement placement = Placement::kNvme;  ///< kHost or kNvme, never kAuto
  int group = 0;                           ///< param group index
  int64_t step = 0;                        ///< the tensor's step counter (torch state["step"])
  bool has_grad = false;                   ///< a gradient is attached
  /// The store key of its fp32 master (kNvme: numel * 4 bytes, row-major; a reader such as
  /// a parameter offload may Store::get() it while no step updates this tensor).
  std::string master_key;
};

/// Where an optimizer put its kernel threads and its pinned pipeline memory (placement()):
/// both target OffloadOptions::numa_node of the store's Topology (Topology::system()).
struct OffloadPlacement {
  int numa_node = -1;  ///< OffloadOptions::numa_node, -1 = none
  /// The kernel threads' binding target: the node's CPUs (kernel CPU numbers, ascending);
  /// empty when numa_node is -1 (or the topology lacks the node).
  std::vector<int> thread_cpus;
  /// The pinned slots' binding target (numa_node when set), -1 = none.
  int memory_node = -1;
  bool threads_bound = false;  ///< every kernel thread is bound to thread_cpus
  bool memory_bound = false;   ///< the pinned slots' pages are bound to memory_node
};

/// Per-call options of step().
struct StepOptions {
  /// Every gradient is multiplied by this before use and before the norm is taken, e.g.
  /// 1/loss_scale for a loss-scaled fp16 gradient. Default 1.
  float grad_scale = 1.0f;
  /// > 0: clip by global L2 norm like torch.nn.utils.clip_grad_norm_(max_norm): the norm
  /// of all attached gradients (times grad_scale) is computed first (a pass over the
  /// gradients), then each is multiplied by min(1, max_norm / (norm + 1e-6)).
  /// 0 = no clipping. Default 0. Gradients in store objects (set_grad_object) are not
  /// scanned: with one attached, clipping needs grad_summary.
  double max_grad_norm = 0.0;
  /// Skip the whole step (no tensor changes, no step counter advances) when any attached
  /// gradient holds an inf or NaN (mixed-precision overflow). Default true. As for
  /// max_grad_norm, with a gradient object attached the check needs grad_summary.
  bool skip_if_nonfinite = true;
  /// The gate's inputs when the caller computed them over the step's gradients itself:
  /// gradients not all attached at once (a step run in batches, gradients partitioned over
  /// ranks), or torch's own norm (arithmetic "torch"). The step then decides with
  /// decide_gate() from these instead of scanning the attached gradients.
  struct GradSummary {
    double grad_norm = 0.0;  ///< global L2 norm of every gradient (unscaled; clipping only)
    bool nonfinite = false;  ///< any gradient element is inf or NaN
    NormArithmetic arithmetic = NormArithmetic::kStrata;  ///< where grad_norm came from
  };
  std::optional<GradSummary> grad_summary;
};

/// What a step did.
struct StepStats {
  bool skipped = false;      ///< skipped for a non-finite gradient
  /// Global L2 norm of the attached gradients times grad_scale (before clipping); NaN when
  /// neither clipping nor the non-finite check needed it.
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double clip_coef = 1.0;    ///< factor applied by clipping (1 = none)
  uint32_t tensors_updated = 0;   ///< tensors with a gradient attached
  uint64_t numel_updated = 0;     ///< their elements
  /// Bytes the pipeline read from the store: masters + states, and the gradients read
  /// from store objects (set_grad_object; numel * element size per tensor).
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;     ///< NVMe bytes written by the pipeline
  /// Pipeline batches (one pinned slot each: at most sub_group_numel elements per stream,
  /// or under num_buffers 0 the slot's several sub-groups) read, updated and written back.
  uint32_t sub_groups = 0;
  double seconds = 0.0;           ///< wall time of the step
  double compute_seconds = 0.0;   ///< time inside apply_update()
  double io_wait_seconds = 0.0;   ///< time the update stage waited for reads / free slots
  /// Overlapped steps (begin_step): tensors whose update ran before finish_step(), and the
  /// wall time those early updates took (the part of the step overlapped with backward).
  uint32_t tensors_started_early = 0;
  double early_seconds = 0.0;
  /// Overlapped steps: the speculation failed (skip, clipping, changed hyperparameters or
  /// options) and the early updates were rolled back and redone by finish_step().
  bool rolled_back = false;
};

/// Totals of the steps since create()/open() or reset_stats() (OffloadedOptimizer::stats()):
/// the StepStats of each completed step, summed. docs/offload.md "Stats" defines each.
struct OptimizerStats {
  uint64_t steps = 0;              ///< steps completed (step(), step_async(), finish_step())
  uint64_t steps_skipped = 0;      ///< of which skipped for a non-finite gradient
  uint64_t steps_rolled_back = 0;  ///< overlapped steps whose early updates were redone
  uint64_t sub_groups = 0;         ///< pipeline sub-groups updated (StepStats::sub_groups)
  uint64_t tensors_updated = 0;
  uint64_t numel_updated = 0;
  uint64_t bytes_read = 0;         ///< bytes the pipeline read (StepStats::bytes_read)
  uint64_t bytes_written = 0;      ///< NVMe bytes written by the pipeline
  double step_seconds = 0.0;       ///< wall time of the steps (overlapped: the exposed part)
  double update_seconds = 0.0;     ///< time in apply_update() (StepStats::compute_seconds)
  double io_wait_seconds = 0.0;    ///< time the update stage waited for reads / free slots
  double early_seconds = 0.0;      ///< overlapped steps: wall time of the early updates
  /// update_seconds / (update_seconds + io_wait_seconds), 0 when both are 0: the share of
  /// the update stage's time spent computing rather than waiting for I/O. 1: the I/O was
  /// hidden behind the updates (compute-bound); near 0: the updates waited (I/O-bound).
  double overlap() const {
    const double t = update_seconds + io_wait_seconds;
    return t > 0.0 ? update_seconds / t : 0.0;
  }
};

/// One gradient handed to start_update(): `grad` holds the tensor's numel elements of
/// `grad_type` (kFloat32, kFloat16, kBFloat16; host memory). `param_copy`, when not null,
/// receives the updated master as `param_copy_type` (kFloat32, kFloat16 or kBFloat16),
/// numel elements of host memory: a buffer of the caller's, not the model's live weights,
/// since backward may still read those (see OVERLAPPED STEP).
///
/// `master`, when not null, holds the tensor's current fp32 master values (numel elements,
/// host memory, equal to its stored master: e.g. a parameter materialized for backward whose
/// store object is this master): the early update copies them instead of reading the master
/// stream from NVMe (4 bytes per element less read). `transient`: `grad` and `master` are
/// valid only until the early update of this entry has run (wait_started() returned), not
/// until finish_step(): finish_step() then does not compare the gradient's fingerprint, and a
/// step that must be redone (see OVERLAPPED STEP) fails with FailedPrecondition after the
/// rollback instead of reading them (the caller redoes it with gradients it kept).
struct EarlyGrad {
  ParamHandle param = 0;
  const void* grad = nullptr;
  DType grad_type = DType::kFloat32;
  void* param_copy = nullptr;
  DType param_copy_type = DType::kFloat32;
  const float* master = nullptr;
  bool transient = false;
};

/// What the optimizer's state needs on disk (disk_space(); see DISK SPACE), bytes, summed
/// over the store's NVMe directories.
struct DiskSpaceNeed {
  uint64_t state_bytes = 0;      ///< T: masters and states on disk (chunks rounded to 4 KiB)
  uint64_t in_flight_bytes = 0;  ///< new chunks of the batches in flight
  /// The catalog's allowance (1 MiB) and the free gaps the store may leave to align large
  /// extents (less than NvmeDirSpace::extent_align_bytes after each extent that ends off
  /// that alignment: one per object of the state per copy, per stream of each batch in
  /// flight, and one; 0 when the store aligns to 4 KiB only).
  uint64_t margin_bytes = 0;
  uint64_t need_bytes = 0;       ///< 2 * state + in_flight + margin
  uint64_t held_bytes = 0;       ///< the state of the tensors added so far (on disk already)
  uint64_t free_bytes = 0;       ///< free on the directories' file systems (each counted once)
  /// Empty when the state fits; else a directory whose file system lacks room, the bytes
  /// still needed there and the bytes free there (with the store's reusable blocks).
  std::string short_path;
  uint64_t short_need = 0, short_free = 0;
};

/// The offloaded optimizer. Create with create() (new) or open() (resume a checkpoint).
///
/// Thread-safety: every member may be called from any thread; calls are serialized by an
/// internal mutex, and a call made while step_async() runs waits for that step to finish.
/// Buffers: gradient buffers (set_grad) and parameter-copy buffers (set_param_copy) stay
/// attached across steps and must stay valid, and the gradients unmodified, from the
/// step() / step_async() call until it returns / its future is ready; so must the bytes of
/// gradient objects (set_grad_object: not written, replaced or removed meanwhile).
class OffloadedOptimizer {
 public:
  /// A new optimizer over `store`, with param group 0 built from `defaults`
  /// (factory(defaults) must succeed). Allocates the pinned buffers and starts the kernel
  /// threads. The store is shared: it must not be closed before the optimizer is
  /// destroyed.
  /// \error InvalidArgument for a null store or factory, bad options (num_buffers outside
  ///     0..16, a sub_group_numel that does not fit pinned_budget_bytes), or what the
  ///     factory returns; AlreadyExists when the store already holds key_prefix + "meta"
  ///     (use open()); ResourceExhausted when the pinned pool cannot be created or the
  ///     store's file systems lack the in-flight headroom (see DISK SPACE);
  ///     FailedPrecondition for a read-only store, or when another optimizer open in this
  ///     process on the same Store object uses an overlapping key_prefix (see
  ///     OffloadOptions::key_prefix; the message names both prefixes). The claim on the
  ///     prefix ends when the optimizer is closed or destroyed.
  static Result<std::unique_ptr<OffloadedOptimizer>> create(std::shared_ptr<Store> store,
                                                            RuleFactory factory,
                                                            const Hyperparams& defaults,
                                                            const OffloadOptions& options = {});

  /// Resumes the optimizer checkpointed under options.key_prefix in `store`: every tensor
  /// (masters, states: NVMe tensors stay where they are, host tensors are read into DRAM),
  /// step counters, param groups and their hyperparameters, as of the last checkpoint()
  /// or close() (see the contract). Gradients and parameter copies are not restored
  /// (attach them again).
  /// \param factory the same factory as at create(); empty = builtin_rule_factory() of the
  ///     recorded rule name.
  /// \error NotFound when there is no checkpoint record or a tensor object is missing;
  ///     FailedPrecondition when the factory rejects the recorded hyperparameters or builds
  ///     a rule whose name or state count differs from the recorded one;
  ///     DataLoss for a malformed record or (verify_on_open) a bad chunk;
  ///     FailedPrecondition when this Store object holds changes of the optimizer's keys
  ///     made after the last checkpoint (an optimizer on it failed to checkpoint them:
  ///     reopen the store to resume from the last checkpoint), or for an overlapping
  ///     key_prefix of another open optimizer; errors of create().
  static Result<std::unique_ptr<OffloadedOptimizer>> open(std::shared_ptr<Store> store,
                                                          RuleFactory factory,
                                                          const OffloadOptions& options = {});

  /// Deletes the optimizer checkpointed under options.key_prefix in `store`, and only it:
  /// the objects of every parameter its record lists (key_prefix + "p/<name>/<stream>"),
  /// then the record (key_prefix + "meta"), then flushes the store. Objects of another
  /// key_prefix are untouched, also one nested under this one. A stream object already
  /// missing is skipped, so a remove interrupted by a crash can be run again. The
  /// optimizer must not be open meanwhile (nothing checks that).
  /// \param factory as open() (names the state streams); empty = builtin_rule_factory() of
  ///     the recorded rule name.
  /// \error NotFound when there is no record; DataLoss for a malformed record;
  ///     FailedPrecondition when the factory rejects the recorded rule or for a read-only
  ///     store; the store's errors.
  static Status remove(std::shared_ptr<Store> store, RuleFactory factory,
                       const OffloadOptions& options = {});

  /// close(); an error is logged (call close() first to see it).
  ~OffloadedOptimizer();
  /// The last checkpoint of the optimizer (see the contract): waits for an in-flight step,
  /// checkpoint()s when anything changed since the last checkpoint (a step, a write, a
  /// hyperparameter, a new parameter or group; a new optimizer counts as changed), then
  /// releases the kernel threads, the pinned pool and the host-tier DRAM. Releases them
  /// also when the checkpoint fails. Idempotent (a second call returns OK). Afterwards the
  /// members that step, read, write or change the optimizer fail with FailedPrecondition;
  /// the introspection members still answer. `checkpoint` false releases without a
  /// checkpoint, as if the process were killed now: a resume restores the previous
  /// checkpoint (for an optimizer abandoned half-built, or a store about to be deleted).
  /// A close that saves nothing (`checkpoint` false after changes, a failed step, a failed
  /// checkpoint) rolls the optimizer's objects back to the last checkpoint (a Store
  /// savepoint taken at each checkpoint and at open(): no extra disk, it holds the chunks
  /// the commit keeps anyway), so open() on the same Store object resumes there at once.
  /// \error what checkpoint() returns (FailedPrecondition after a failed step or for a
  ///     closed store, ResourceExhausted, IoError), the message saying the state since the
  ///     last checkpoint is not saved; the last checkpoint stays the resume point.
  Status close(bool checkpoint = true);
  OffloadedOptimizer(const OffloadedOptimizer&) = delete;
  OffloadedOptimizer& operator=(const OffloadedOptimizer&) = delete;

  // ---- param groups ---------------------------------------------------------------------

  /// Adds a param group; keys absent from `hp` take group 0's values.
  /// \returns the group index (1, 2, ...). \error what the factory returns.
  Result<int> add_param_group(const Hyperparams& hp);
  int num_param_groups() const;
  /// The hyperparameters of `group`. \error OutOfRange for a bad group index.
  Result<Hyperparams> hyperparams(int group) const;
  /// Merges `hp` into the group's hyperparameters (keys present replace old values) and
  /// rebuilds its rule; effective from the next step. On error nothing changes.
  /// \error OutOfRange for a bad group; what the factory returns (e.g. lr < 0).
  Status set_hyperparams(int group, const Hyperparams& hp);
  /// set_hyperparams(group, {{"lr", lr}}).
  Status set_lr(int group, double lr);

  // ---- tensors --------------------------------------------------------------------------

  /// Adds a parameter tensor of `numel` fp32 elements to `group`, its states filled with
  /// the rule's initial values, its step counter 0. The NVMe objects are created and
  /// committed before this returns. numel may be 0 (torch.optim accepts zero-size
  /// parameters): such a tensor has empty objects, nothing to update, and a step counter
  /// that a step advances when a gradient is attached (set_grad with any non-null
  /// pointer), recorded and restored like any other, so one checkpoint() holds it.
  /// \param name unique, non-empty, printable ASCII without whitespace (used in keys).
  /// \param init numel fp32 initial master values (host memory, read during the call), or
  ///     nullptr for zeros (cheap for huge tensors: no DRAM proportional to numel is used).
  /// \param placement kAuto = options.default_placement, resolved against
  ///     host_budget_bytes.
  /// \returns the tensor's handle.
  /// \error InvalidArgument for a bad/duplicate name or a bad group;
  ///     ResourceExhausted when DRAM or the NVMe tier is full, or when a file system of
  ///     the store lacks the space of DISK SPACE for the state with this tensor (checked
  ///     before anything is written; the message names the directory, the need and the
  ///     free space in bytes); IoError.
  Result<ParamHandle> add_param(std::string_view name, uint64_t numel, const float* init,
                                int group = 0, Placement placement = Placement::kAuto);
  size_t num_params() const;
  /// \error OutOfRange for a bad handle.
  Result<ParamInfo> param_info(ParamHandle h) const;
  /// \error NotFound when no tensor has that name.
  Result<ParamHandle> find_param(std::string_view name) const;

  /// Attaches the gradient of tensor `h` for the next steps: `numel` elements of `type`
  /// (kFloat32, kFloat16 or kBFloat16) at `data`, host memory (device memory:
  /// Unimplemented in this version). nullptr detaches it (for a zero-size tensor, any
  /// non-null pointer attaches: nothing is read). Tensors without a gradient are
  /// not updated by step() and their counters do not advance (like torch's p.grad None).
  /// Replaces (nullptr: detaches) a gradient object of set_grad_object().
  /// \error OutOfRange for a bad handle; InvalidArgument for another dtype.
  Status set_grad(ParamHandle h, const void* data, DType type);
  /// Attaches the gradient of NVMe-tier tensor `h` for the next steps as object `key` of
  /// the optimizer's store (store()): numel elements of `type` (kFloat32, kFloat16 or
  /// kBFloat16), row-major -- the bytes set_grad() would point at --, so a tensor whose
  /// gradient does not fit in memory can be stepped. Each step reads it sub-group by
  /// sub-group (read_range of bytes [begin, begin + count) * dtype_size(type)) into the
  /// pinned slots' gradient regions, with the master and states of the sub-group and
  /// before its update; no DRAM of its size is used, nothing is written to it, and
  /// StepStats::bytes_read counts its bytes. Results are bit-identical to set_grad() with
  /// the same bytes in memory. Replaces a set_grad() pointer; set_grad(h, nullptr),
  /// set_grad(h, ptr), clear_grads() and start_update() replace or detach it. A zero-size
  /// tensor attaches an empty object (nothing is read; its counter advances).
  /// The object must keep these bytes, and not be written, while a step reads it. Since
  /// the step cannot scan it from memory, a step with such a gradient attached (numel > 0)
  /// that needs the gate's scan -- max_grad_norm > 0 or skip_if_nonfinite without
  /// StepOptions::grad_summary -- fails with InvalidArgument before changing anything (the
  /// caller computes the norm and the inf/NaN flag and passes grad_summary); a step also
  /// checks the object again (the errors below, "offload step: ...") before changing
  /// anything. Never started early (start_update() takes memory gradients): in an
  /// overlapped step such a tensor is updated by finish_step() with the rest (or a redo).
  /// \param key a store key (Store::stat()); its object is any tier, any shape.
  /// \error OutOfRange for a bad handle; InvalidArgument for another dtype, an empty key,
  ///     a host-tier tensor (the message names it), an object whose byte size is not
  ///     numel * dtype_size(type) or whose recorded dtype is another (raw bytes, kUInt8,
  ///     are accepted), naming the key and both sizes; NotFound when the store has no
  ///     `key`; DataLoss for a damaged catalog row; FailedPrecondition once closed or for
  ///     a closed store; ResourceExhausted when the first call cannot get the gradient
  ///     regions' pinned memory (num_buffers * align_up(4 * sub_group_numel, 4 KiB)
  ///     bytes, allocated once). On error nothing changes (the previous gradient stays
  ///     attached).
  /// \threadsafety as every member (serialized); not concurrently with start_update() of
  ///     the same tensor.
  Status set_grad_object(ParamHandle h, std::string key, DType type);
  /// Detaches every gradient (in memory and store objects).
  void clear_grads();

  /// Makes every step write a copy of the updated master of `h`, as `type`, to `dst`
  /// (numel elements, host memory): the weights of the next forward pass. kFloat16 /
  /// kBFloat16: rounded to nearest even by the update kernel; kFloat32: the master itself,
  /// copied out of the pipeline's pinned slot (NVMe tier) or the DRAM master (host tier)
  /// right after its update, so no second read of the master is needed to refresh an
  /// fp32 model. The copy is written only when the step is not skipped. nullptr detaches.
  /// \error OutOfRange for a bad handle; InvalidArgument for another dtype.
  Status set_param_copy(ParamHandle h, void* dst, DType type);

  // ---- stepping -------------------------------------------------------------------------

  /// One optimizer step of every tensor with a gradient attached: host tensors first (in
  /// place), then the NVMe pipeline over the NVMe tensors in handle order. Each updated
  /// tensor's step counter advances by one. Blocks until the writes of the step are
  /// complete (not yet durable: see checkpoint()).
  /// \error InvalidArgument before anything changes when a gradient object
  ///     (set_grad_object) would need the gate's scan (max_grad_norm > 0 or
  ///     skip_if_nonfinite without grad_summary; the message names the tensor and says to
  ///     pass grad_summary), or set_grad_object()'s errors when the object changed since;
  ///     I/O errors of the store (IoError, DataLoss, ResourceExhausted) naming the key;
  ///     after such an error the tensors may be partly updated and counters are not
  ///     advanced, so checkpoint() and close() refuse: resume from the last checkpoint.
  ///     FailedPrecondition once closed.
  Result<StepStats> step(const StepOptions& options = {});
  /// The totals of the completed steps (OptimizerStats). Any thread, also while a step
  /// runs (that step is counted once it completes). The store's own counters (every NVMe
  /// transfer, waits, pools): store()->stats().
  OptimizerStats stats() const;
  /// Zeroes the totals.
  void reset_stats();
  // ---- the step overlapped with backward ------------------------------------------------
  //
  // OVERLAPPED STEP. begin_step(o) opens a step whose tensors are updated as their
  // gradients become final (start_update(), e.g. from a backward hook), on an internal
  // thread, while the caller goes on; finish_step() completes it. The early updates
  // speculate that the step is neither skipped (no inf/NaN) nor clipped (global norm <=
  // max_grad_norm, so the clip factor is exactly 1): before each batch of early updates the
  // store keeps its tensors' NVMe contents (Store::savepoint(); one extra copy of what is
  // rewritten stays on disk until finish_step()). finish_step() computes the gate of step()
  // over every attached gradient (same norm, same order); when it confirms the speculation
  // it updates the tensors not started yet (and the host-tier tensors, which are always
  // updated there: their in-place update cannot be rolled back cheaply) and the step is
  // bit-identical to step(o) -- also checking that every started tensor's gradient still
  // has the bytes its early update read (an XXH3-64 fingerprint taken before the update;
  // an edit after it means a redo) --; otherwise it rolls the early updates back
  // (Store::rollback()) and runs step(o): also bit-identical, at the cost of the early I/O.
  // Only NVMe-tier tensors start early. During an open step, members that change state
  // (write_param, write_state, set_step_count, add_param, step, checkpoint) fail with
  // FailedPrecondition; reads may show a started tensor's speculative update.

  /// Opens an overlapped step with options `o` (those of the step() it stands for).
  /// \error FailedPrecondition when one is open already; InvalidArgument as step().
  Status begin_step(const StepOptions& o);
  /// Starts the update of the tensors in `grads` (their gradients final for this step) in
  /// the background, in order, and returns at once. The buffers must stay valid and
  /// unmodified until finish_step()/abort_step() returns. Each gradient is also attached
  /// (as set_grad, replacing a gradient object) until then: finish_step()/abort_step()
  /// detach them. Host-tier and zero-size tensors are only attached here.
  /// \error FailedPrecondition when no step is open or a tensor was started already;
  ///     OutOfRange for a bad handle; InvalidArgument for a bad dtype or a null gradient.
  ///     An I/O error of an early update is reported by finish_step().
  Status start_update(const std::vector<EarlyGrad>& grads);
  /// Waits until the early updates of every start_update() so far have run (or failed).
  /// \error FailedPrecondition when no step is open.
  Status wait_started();
  /// Completes the open step (see OVERLAPPED STEP) with the gradients attached now:
  /// (a redo with a `transient` entry started fails with FailedPrecondition "... was not kept
  /// for a redo" after rolling every early update back: nothing changed, the step is closed)
  /// started tensors with the gradients given to start_update(), the others with
  /// set_grad()'s. `o` must equal begin_step()'s, else the early updates are rolled back and
  /// the step runs with `o`. Writes the param copies given to start_update() for started
  /// tensors that completed.
  /// \error FailedPrecondition when no step is open; step()'s InvalidArgument for a
  ///     gradient object (set_grad_object) that the gate would scan, and the I/O errors of
  ///     step() or of an early update (then every early update is rolled back: the NVMe
  ///     tensors are as before the step, counters not advanced; the step is closed).
  Result<StepStats> finish_step(const StepOptions& o);
  /// Rolls back the open step's early updates and closes it (nothing changes; no-op when
  /// none is open). \error the store's rollback error.
  Status abort_step();
  /// True between begin_step() and finish_step()/abort_step().
  bool step_open() const;

  /// step() on an internal thread. Gradient and copy buffers must stay valid until the
  /// future is ready; other members called meanwhile wait for it.
  Future<StepStats> step_async(const StepOptions& options = {});

  // ---- state access (state_dict / load_state_dict) --------------------------------------

  /// Number of fp32 state streams of the rule and the name of stream i (torch state-dict
  /// key, e.g. "exp_avg").
  int num_states() const;
  std::string state_name(int i) const;
  /// The rule name ("adam", "adamw", a custom rule's name).
  std::string rule_name() const;

  /// Copies elements [offset, offset + count) of the master of `h` (count kToEnd: to the
  /// end) into `dst` (fp32, host memory).
  /// \error OutOfRange for a bad handle or range; store errors for NVMe tensors.
  Status read_param(ParamHandle h, float* dst, uint64_t offset = 0, uint64_t count = kToEnd);
  /// Overwrites elements of the master of `h` from `src` (fp32 host memory). Like a step,
  /// durable at the next checkpoint(). \error as read_param.
  Status write_param(ParamHandle h, const float* src, uint64_t offset = 0,
                     uint64_t count = kToEnd);
  /// As read_param / write_param for state stream `stream` (0 <= stream < num_states()).
  /// \error OutOfRange also for a bad stream index.
  Status read_state(ParamHandle h, int stream, float* dst, uint64_t offset = 0,
                    uint64_t count = kToEnd);
  Status write_state(ParamHandle h, int stream, const float* src, uint64_t offset = 0,
                     uint64_t count = kToEnd);
  /// The step counter of `h` (torch state["step"]). \error OutOfRange for a bad handle.
  Result<int64_t> step_count(ParamHandle h) const;
  /// Restores a step counter (load_state_dict). \error OutOfRange; InvalidArgument for < 0.
  Status set_step_count(ParamHandle h, int64_t step);

  // ---- durability -----------------------------------------------------------------------

  /// Makes the state after the last completed step durable in place (see the contract):
  /// host tensors to their backing objects, the meta record, then one Store::commit() of
  /// the optimizer's keys. Waits for an in-flight step first. On error the previous
  /// checkpoint stays the resume point.
  /// \error store errors (IoError, ResourceExhausted); FailedPrecondition once closed, for
  ///     a closed store, or after a step that failed part-way.
  Status checkpoint();

  // ---- disk space (see DISK SPACE) -------------------------------------------------------

  /// The disk space of the tensors added so far plus tensors of `more_numels` elements
  /// (counted as NVMe-tier), against the free space now.
  /// \error store errors (statvfs: IoError; closed store: FailedPrecondition).
  Result<DiskSpaceNeed> disk_space(const std::vector<uint64_t>& more_numels = {}) const;
  /// OK when disk_space(more_numels) fits, else ResourceExhausted naming the directory,
  /// the bytes needed and the bytes free (e.g. to check a whole model before add_param).
  Status check_disk_space(const std::vector<uint64_t>& more_numels = {}) const;

  // ---- introspection --------------------------------------------------------------------

  const OffloadOptions& options() const;
  /// The resolved sub-group size (elements) and pinned bytes of the pipeline.
  uint64_t sub_group_numel() const;
  uint64_t pinned_bytes() const;
  /// The pipeline's pinned slots: OffloadOptions::num_buffers, or what 0 (auto) resolved
  /// to. \threadsafety immutable after create()/open(); any thread.
  int num_buffers() const;
  /// Bytes of DRAM held by host-tier tensors (masters + states; bf16 states: 2 bytes per
  /// element).
  uint64_t host_bytes() const;
  /// Where the kernel threads and the pinned slots went (fixed at create()/open()).
  const OffloadPlacement& placement() const;
  const std::shared_ptr<Store>& store() const;

  struct Impl;

 private:
  explicit OffloadedOptimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::optimizer
