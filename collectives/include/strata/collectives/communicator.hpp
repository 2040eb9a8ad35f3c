// strata::collectives — the Communicator: one interface over Gloo (host memory, TCP) and
// NCCL (device memory). Created from torchrun's environment contract
// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) or from explicit values.
//
// Semantics follow NCCL's (and torch.distributed's) definitions of each collective:
// https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"
#include "strata/base/dtype.hpp"

namespace strata {

class RendezvousClient;

/// Which engine moves the bytes.
enum class Backend : uint8_t {
  kGloo = 0,  ///< Gloo over TCP; buffers are host memory (pageable or pinned)
  kNccl = 1,  ///< NCCL; buffers are CUDA device memory of the communicator's device
};
std::string_view backend_name(Backend b) noexcept;  ///< "gloo" / "nccl"
/// Parses "gloo" / "nccl".  \error InvalidArgument naming `text` otherwise.
Result<Backend> parse_backend(std::string_view text);

/// Element-wise reduction of all_reduce / reduce_scatter.
/// Sum of fp16/bf16 (Gloo): each pairwise addition is computed in fp32 and rounded to the
/// nearest representable value (ties to even), as NCCL does for half types.
/// Sum and max of bool are logical OR (torch.distributed maps bool SUM to MAX the same
/// way). Integer sums wrap around (two's complement), as in NCCL.
enum class ReduceOp : uint8_t { kSum = 0, kMax = 1 };
std::string_view reduce_op_name(ReduceOp op) noexcept;  ///< "sum" / "max"

/// torchrun's environment contract, read by read_distributed_env().
struct DistributedEnv {
  std::string master_addr;   ///< MASTER_ADDR: host of the rendezvous server (rank 0)
  uint16_t master_port = 0;  ///< MASTER_PORT: its TCP port (1..65535)
  int rank = 0;              ///< RANK: 0 <= rank < world_size
  int world_size = 1;        ///< WORLD_SIZE: >= 1
  int local_rank = 0;        ///< LOCAL_RANK: rank on this node; picks the GPU (NCCL)
};

/// Reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK (LOCAL_RANK may be
/// absent: it then defaults to RANK).
/// \error InvalidArgument naming the variable when one is missing, not a decimal integer,
///     or out of range (port 0 or > 65535, rank >= world_size, world_size < 1).
Result<DistributedEnv> read_distributed_env();

/// Options of a communicator. Defaults are stated per field; environment variables only
/// seed defaults (see communicator_options_from_env()).
struct CommunicatorOptions {
  Backend backend = Backend::kGloo;
  /// End-to-end timeout of rendezvous and of each collective. A rank that died or stopped
  /// responding makes the others fail after at most about this long. Default 30 s
  /// (STRATA_COLL_TIMEOUT_MS).
  std::chrono::milliseconds timeout{30000};
  /// Gloo: network interface to use (e.g. "eth0"); empty = choose by address. Default
  /// GLOO_SOCKET_IFNAME, as in torch.distributed.
  std::string gloo_interface;
  /// Gloo: host name or address this rank listens on; empty = 127.0.0.1 when MASTER_ADDR
  /// is a loopback address, otherwise the machine's host name.
  std::string gloo_hostname;
  /// Gloo: reduce_scatter works on pieces whose packed input (size() blocks) is at most
  /// this many bytes; it bounds the scratch memory (2 copies) of a call. Default 64 MiB.
  size_t gloo_reduce_scatter_chunk_bytes = size_t{64} << 20;
  /// NCCL: CUDA device ordinal; -1 = LOCAL_RANK modulo the number of devices. Default -1.
  int cuda_device = -1;
  /// Whether rank 0 starts the rendezvous server on MASTER_ADDR:MASTER_PORT (torchrun's
  /// default behaviour). Set false when some other process already serves it. Default true.
  bool rank0_hosts_store = true;
};

/// Default options seeded from STRATA_COLL_TIMEOUT_MS (milliseconds) and
/// GLOO_SOCKET_IFNAME.  \error InvalidArgument naming a malformed variable.
Result<CommunicatorOptions> communicator_options_from_env();

/// A group of `size()` ranks that run collectives together.
///
/// Every rank must issue the same collectives in the same order with matching counts and
/// dtypes (as with NCCL and Gloo). Operations of one communicator run one after another in
/// the order they were issued, on an internal thread; the *_async variants return at once.
///
/// Buffers: Gloo communicators take host pointers, NCCL communicators device pointers of
/// device(); memory_kind() says which. Every buffer must stay valid and untouched until
/// the operation's future is ready. Send and receive buffers may be the same pointer
/// (in place) where stated.
///
/// Errors of every collective: InvalidArgument for a bad root, an unsupported
/// dtype/op pair or a null buffer with a non-zero count; Unavailable naming the lost rank
/// when a peer died (its connection closed); DeadlineExceeded when a peer did not answer
/// within options().timeout; FailedPrecondition for any call after such an error (the
/// communicator is then broken: create a new one). A count of 0 is a no-op on every rank.
///
/// Thread-safety: all members may be called from any thread; operations are ordered by
/// the order in which the calls were made.
class Communicator {
 public:
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  /// The options it was created with.
  virtual const CommunicatorOptions& options() const = 0;
  /// NCCL: the CUDA device ordinal of its buffers; Gloo: -1 (host memory).
  virtual int device() const = 0;

  /// All-gather: rank r's `count` elements of `send` land in
  /// recv[r*count, (r+1)*count) on every rank.
  /// \param send `count` elements of `dtype`; may be recv + rank()*count*dtype_size (in
  ///     place).
  /// \param recv size()*count elements of `dtype`.
  virtual Future<void> all_gather_async(const void* send, void* recv, size_t count,
                                        DType dtype) = 0;

  /// Reduce-scatter: the element-wise reduction over all ranks of `send` (size()*recv_count
  /// elements) is computed, and rank r receives block r, i.e. elements
  /// [r*recv_count, (r+1)*recv_count) of the reduced vector, in `recv` (recv_count
  /// elements). `send` and `recv` must not overlap, except recv == send + rank()*recv_count
  /// (in place).
  virtual Future<void> reduce_scatter_async(const void* send, void* recv, size_t recv_count,
                                            DType dtype, ReduceOp op) = 0;

  /// All-reduce: recv[i] = op over ranks of send[i], for i < count. send == recv is
  /// allowed (in place); otherwise they must not overlap.
  virtual Future<void> all_reduce_async(const void* send, void* recv, size_t count, DType dtype,
                                        ReduceOp op) = 0;

  /// Broadcast: `count` elements of `buf` on rank `root` are copied into `buf` on every
  /// rank.  \error InvalidArgument when root is not in [0, size()).
  virtual Future<void> broadcast_async(void* buf, size_t count, DType dtype, int root) = 0;

  /// Completes on every rank only after every rank has called it.
  virtual Future<void> barrier_async() = 0;

  /// Blocking forms: issue the async variant and wait for it. (Inline, so code that only
  /// calls a communicator, such as the store's partitioned objects, needs no backend library.)
  Status all_gather(const void* send, void* recv, size_t count, DType dtype) {
    return all_gather_async(send, recv, count, dtype).result().status();
  }
  Status reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                        ReduceOp op) {
    return reduce_scatter_async(send, recv, recv_count, dtype, op).result().status();
  }
  Status all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
    return all_reduce_async(send, recv, count, dtype, op).result().status();
  }
  Status broadcast(void* buf, size_t count, DType dtype, int root) {
    return broadcast_async(buf, count, dtype, root).result().status();
  }
  Status barrier() { return barrier_async().result().status(); }

  /// Runs `op`, a blocking operation made of this communicator's own collectives (the
  /// store's partitioned objects: put/fetch_partitioned, reduce_scatter_grads), on the
  /// communicator's composite queue, and returns a future of the Status `op` returns.
  /// The composite queue is a strata::ThreadPool of one worker owned by the communicator
  /// (started on first use): composites run one at a time, in the order they were
  /// submitted, and each may block on this communicator's collectives, which run on the
  /// operation queue and so never wait behind a composite. `op` must not wait for another
  /// composite of this communicator (that one is queued behind it).
  /// Lifetime: the destructor runs every queued composite before it stops the operation
  /// queue; what `op` uses besides the communicator must outlive the future.
  /// \error what `op` returns; ResourceExhausted when the worker cannot be started.
  /// 	hreadsafety any thread.
  virtual Future<void> run_composite_async(std::function<Status()> op) = 0;

  /// The rendezvous client this communicator was created with (for application-level
  /// key-value exchange, e.g. catalog metadata); never null. Keys under "strata/" are
  /// reserved.
  virtual RendezvousClient& store() = 0;
};

/// Creates a communicator over `env`: rank 0 starts the rendezvous server (unless
/// options.rank0_hosts_store is false), every rank connects to it, then the backend sets
/// up its connections. Collective: all `env.world_size` ranks must call it.
/// Side effect (Gloo): SIGPIPE is set to "ignore" if its disposition is still the default,
/// so a peer that dies mid-collective gives an error instead of killing this process
/// (docs/collectives.md, "Failures"); an application's own SIGPIPE handler is kept.
/// \error InvalidArgument for bad options; Unavailable when the server cannot be started
///     (port in use) or reached, or when a peer's transport cannot be connected;
///     DeadlineExceeded naming the missing ranks when not all ranks arrived within
///     options.timeout; Unimplemented for NCCL in a build without CUDA; FailedPrecondition
///     for NCCL without a GPU.
Result<std::unique_ptr<Communicator>> create_communicator(const DistributedEnv& env,
                                                          const CommunicatorOptions& options);

/// read_distributed_env() + communicator_options_from_env() (then `backend` applied) +
/// create_communicator(). The entry point for programs started by torchrun or
/// `strata launch`.
Result<std::unique_ptr<Communicator>> create_communicator_from_env(Backend backend = Backend::kGloo);

/// True when this build has the NCCL backend (STRATA_HAVE_CUDA) and at least one GPU is
/// usable now (cudaGetDeviceCount succeeds with a count > 0).
bool nccl_available();

}  // namespace strata
