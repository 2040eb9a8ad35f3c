// Private pieces shared by the Gloo and NCCL communicators.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "strata/base/thread_pool.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/rendezvous.hpp"

/// Returns a ready failed Future<void> from the enclosing function when `expr` fails.
#define STRATA_RETURN_FUTURE_IF_ERROR(expr)                                  \
  do {                                                                       \
    Status strata_s_ = (expr);                                               \
    if (!strata_s_.ok()) return make_ready_future(Result<void>(strata_s_)); \
  } while (0)

namespace strata::detail {

/// What create_communicator() hands a backend: the store connection (and the server when
/// this rank hosts it) plus the key prefix of this communicator.
struct Bootstrap {
  std::unique_ptr<RendezvousServer> server;  // rank 0 only (when it hosts the store)
  std::unique_ptr<RendezvousClient> client;
  std::string prefix;  // "strata/comm<k>/"
  DistributedEnv env;
  CommunicatorOptions options;

  /// Tears the store down politely: the host waits (bounded) for the other ranks to
  /// disconnect first, so that none of them loses the store while still using it.
  ~Bootstrap();
};

/// The operation queue of a communicator: a pool of one worker, so operations run one at a
/// time in the order they were issued (ThreadPool::async() gives each its future).
/// \error ResourceExhausted when the thread cannot be started.
Result<std::unique_ptr<ThreadPool>> make_op_queue();

/// A communicator's composite queue (Communicator::run_composite_async()): a ThreadPool of
/// one worker, started by the first run(). The backend calls shutdown() first in its
/// destructor, while its operation queue still runs the composites' collectives.
/// \threadsafety run() from any thread; shutdown() once, from the destructor.
class CompositeQueue {
 public:
  /// Queues `op` (see run_composite_async()). \error ResourceExhausted when the worker
  /// cannot be started; FailedPrecondition after shutdown().
  Future<void> run(std::function<Status()> op);
  /// Runs every queued composite, then joins the worker (no-op when none was started).
  void shutdown();

 private:
  std::mutex mu_;
  std::unique_ptr<ThreadPool> pool_;
  bool shut_down_ = false;
};

/// What the Gloo and NCCL communicators have alike: the bootstrap (rendezvous client,
/// environment, options), the composite queue, and the accessors over them. The backend's
/// destructor calls composite_.shutdown() first (composites use its operation queue).
class BootstrappedCommunicator : public Communicator {
 public:
  int rank() const override { return boot_->env.rank; }
  int size() const override { return boot_->env.world_size; }
  const CommunicatorOptions& options() const override { return boot_->options; }
  RendezvousClient& store() override { return *boot_->client; }
  Future<void> run_composite_async(std::function<Status()> op) override {
    return composite_.run(std::move(op));
  }

 protected:
  explicit BootstrappedCommunicator(std::unique_ptr<Bootstrap> boot) : boot_(std::move(boot)) {}

  std::unique_ptr<Bootstrap> boot_;  // destroyed last: after the backend's own members
  CompositeQueue composite_;         // one worker: composites in submission order
};

/// Turns a transport failure into a Status naming the lost rank when the store knows one
/// (polls lost_ranks() for up to ~1 s since the server may notice the death a little after
/// the peers do). `timed_out` selects DeadlineExceeded when no rank is known lost.
Status describe_failure(RendezvousClient& store, int rank, std::string_view what,
                        const std::string& detail, bool timed_out,
                        std::chrono::milliseconds timeout);

/// Validates the arguments shared by all collectives.
Status check_args(std::string_view what, const void* a, const void* b, size_t count, DType dtype);

/// check_args() for a broadcast, plus: InvalidArgument when `root` is not in [0, size).
Status check_broadcast_args(void* buf, size_t count, DType dtype, int root, int size);

Result<std::unique_ptr<Communicator>> create_gloo(std::unique_ptr<Bootstrap> boot);
Result<std::unique_ptr<Communicator>> create_nccl(std::unique_ptr<Bootstrap> boot);

}  // namespace strata::detail
