// The Gloo backend: host memory over Gloo's TCP transport, rendezvous through our store.
#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend.hpp"
#include "reduce_kernels.hpp"
#include "strata/base/units.hpp"

namespace strata::detail {

namespace {

/// Gloo's TCP pairs write with writev(), which raises SIGPIPE when the peer has died; the
/// default action of SIGPIPE kills the whole process before Gloo can report EPIPE (seen:
/// a surviving rank killed by signal 13 right after a peer was SIGKILLed, instead of the
/// Unavailable error naming the lost rank). Like CPython at startup, ignore SIGPIPE --
/// but only while its disposition is still the default: a handler the application
/// installed is kept. Children started by strata's launcher get the default back.
void ignore_default_sigpipe() {
  struct sigaction cur {};
  if (::sigaction(SIGPIPE, nullptr, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
      cur.sa_handler == SIG_DFL) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, nullptr);
  }
}


/// gloo::rendezvous::Store over a RendezvousClient, under a key prefix. Gloo expects
/// exceptions; they carry the Status text and are turned back into a Status by the caller.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(RendezvousClient& client, std::string prefix, std::chrono::milliseconds timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = client_.set(prefix_ + key, std::string_view(data.data(), data.size()));
    if (!s.ok()) throw gloo::IoException(s.to_string());
  }
  std::vector<char> get(const std::string& key) override {
    auto r = client_.get(prefix_ + key, timeout_);
    if (!r.ok()) throw gloo::IoException(r.status().to_string());
    return std::vector<char>(r->begin(), r->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    Status s = client_.wait(full, timeout);
    if (!s.ok()) throw gloo::IoException(s.to_string());
  }

 private:
  RendezvousClient& client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

bool looks_like_timeout(const std::string& msg) {
  return msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos;
}

std::string rank_list(const std::vector<int>& v) {
  std::string s = v.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// describe_failure() (communicator.cpp) says "every rank is still connected to the store"
// whenever the rendezvous server reports no lost rank. But the server only knows the ranks
// that have connected to it: a rank that never started, or exited before creating its
// communicator, is neither connected nor lost. So on a timeout, claim connectivity only for
// what is known: rank 0 (which hosts the server) lists the ranks the server sees connected
// and names the others; every rank names the peers that have not published their Gloo
// address. `all_joined`: every rank passed this communicator's start-up barrier (each was
// connected then), as is the case for a collective.
Status describe_gloo_failure(Bootstrap& boot, std::string_view what, const std::string& detail,
                             bool timed_out, bool all_joined) {
  Status s = describe_failure(*boot.client, boot.env.rank, what, detail, timed_out,
                              boot.options.timeout);
  // Other outcomes (a lost rank named, rank 0 unreachable) are accurate as they are.
  if (s.code() != StatusCode::kDeadlineExceeded) return s;
  const int n = boot.env.world_size, self = boot.env.rank;
  std::string msg = "rank " + std::to_string(self) + ": " + std::string(what) +
                    " failed: no answer from a peer within " +
                    std::to_string(boot.options.timeout.count()) + " ms (";
  std::vector<int> unpublished;  // peers whose Gloo address is not in the store
  if (!all_joined) {
    for (int i = 0; i < n; ++i) {
      if (i == self) continue;
      auto has = boot.client->check({boot.prefix + "gloo/" + std::to_string(i)});
      if (has.ok() && !*has) unpublished.push_back(i);
    }
    if (!unpublished.empty()) {
      msg += rank_list(unpublished) + (unpublished.size() == 1 ? " has" : " have") +
             " not published a Gloo address: not started, exited before creating its "
             "communicator, or hung before it; ";
    }
  }
  if (boot.server) {
    const std::vector<int> connected = boot.server->connected_ranks();
    std::vector<int> others;
    for (int i = 0; i < n; ++i) {
      if (std::find(connected.begin(), connected.end(), i) == connected.end()) others.push_back(i);
    }
    msg += "the rendezvous server sees " + (connected.empty() ? "no rank" : rank_list(connected)) +
           " connected";
    if (!others.empty()) {
      msg += "; " + rank_list(others) + (others.size() == 1 ? " is" : " are") +
             " not connected to it";
    }
  } else {
    msg += "the rendezvous server has lost none of the ranks that connected to it";
  }
  if (all_joined) {
    msg += "; all " + std::to_string(n) +
           " ranks joined this communicator: a peer is hung or issued a different collective";
  } else if (unpublished.empty()) {
    msg += "; every peer published its Gloo address: a peer is hung or unreachable at it";
  }
  msg += "); transport error: " + detail;
  return deadline_exceeded(std::move(msg));
}

// Gloo's ReduceScatterHalvingDoubling keeps element counts and byte sizes in `int`.
constexpr size_t kReduceScatterMaxBytes = size_t{1} << 30;

class GlooCommunicator final : public BootstrappedCommunicator {
 public:
  GlooCommunicator(std::unique_ptr<Bootstrap> boot, std::unique_ptr<ThreadPool> queue,
                   std::shared_ptr<gloo::transport::Device> dev,
                   std::shared_ptr<gloo::rendezvous::Context> ctx)
      : BootstrappedCommunicator(std::move(boot)), dev_(std::move(dev)), ctx_(std::move(ctx)),
        queue_(std::move(queue)) {}

  ~GlooCommunicator() override {
    composite_.shutdown();  // finishes queued composites (they use queue_)
    queue_.reset();  // finishes queued operations
    ctx_.reset();
    dev_.reset();
  }

  Backend backend() const override { return Backend::kGloo; }
  int device() const override { return -1; }

  Future<void> all_gather_async(const void* send, void* recv, size_t count,
                                DType dtype) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_args("all_gather", send, recv, count, dtype));
    return submit("all_gather", count * dtype_size(dtype), [=, this] {
      const size_t nbytes = count * dtype_size(dtype);
      auto* out = static_cast<char*>(recv);
      char* mine = out + static_cast<size_t>(rank()) * nbytes;
      if (nbytes == 0) return;
      if (mine != send) std::memmove(mine, send, nbytes);
      if (size() == 1) return;
      gloo::AllgatherOptions opts(ctx_);
      opts.setOutput(out, nbytes * static_cast<size_t>(size()));  // in place: no input
      opts.setTimeout(options().timeout);
      gloo::allgather(opts);
    });
  }

  Future<void> all_reduce_async(const void* send, void* recv, size_t count, DType dtype,
                                ReduceOp op) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_args("all_reduce", send, recv, count, dtype));
    return submit("all_reduce", count * dtype_size(dtype), [=, this] {
      if (count == 0) return;
      if (send != recv) std::memmove(recv, send, count * dtype_size(dtype));
      if (size() == 1) return;
      visit_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        gloo::AllreduceOptions opts(ctx_);
        opts.setOutput(static_cast<T*>(recv), count);
        opts.setReduceFunction(op == ReduceOp::kSum ? &reduce3<T, ReduceOp::kSum>
                                                    : &reduce3<T, ReduceOp::kMax>);
        opts.setTimeout(options().timeout);
        gloo::allreduce(opts);
      });
    });
  }

  Future<void> reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dtype,
                                    ReduceOp op) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_args("reduce_scatter", send, recv, recv_count, dtype));
    const size_t n = static_cast<size_t>(size());
    return submit("reduce_scatter", recv_count * n * dtype_size(dtype), [=, this] {
      visit_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        run_reduce_scatter<T>(static_cast<const T*>(send), static_cast<T*>(recv), recv_count, op);
      });
    });
  }

  Future<void> broadcast_async(void* buf, size_t count, DType dtype, int root) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_broadcast_args(buf, count, dtype, root, size()));
    return submit("broadcast", count * dtype_size(dtype), [=, this] {
      if (count == 0 || size() == 1) return;
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<char*>(buf), count * dtype_size(dtype));
      opts.setRoot(root);
      opts.setTimeout(options().timeout);
      gloo::broadcast(opts);
    });
  }

  Future<void> barrier_async() override {
    return submit("barrier", 1, [this] {
      if (size() == 1) return;
      gloo::BarrierOptions opts(ctx_);
      opts.setTimeout(options().timeout);
      gloo::barrier(opts);
    });
  }

 private:
  template <class T>
  void run_reduce_scatter(const T* send, T* recv, size_t recv_count, ReduceOp op) {
    const size_t n = static_cast<size_t>(size());
    if (recv_count == 0) return;
    if (n == 1) {
      if (send != recv) std::memmove(recv, send, recv_count * sizeof(T));
      return;
    }
    static const gloo::ReductionFunction<T> sum_fn(gloo::CUSTOM,
                                                   &reduce_inplace<T, ReduceOp::kSum>);
    static const gloo::ReductionFunction<T> max_fn(gloo::CUSTOM,
                                                   &reduce_inplace<T, ReduceOp::kMax>);
    const gloo::ReductionFunction<T>* fn = op == ReduceOp::kSum ? &sum_fn : &max_fn;
    // Gloo's ReduceScatterHalvingDoubling works in place on one buffer of n blocks and
    // leaves this rank's block at its start. Large inputs go in pieces of `chunk` elements
    // per block: piece [a, a+len) of every block is packed into `work`.
    const size_t limit = std::min(kReduceScatterMaxBytes, options().gloo_reduce_scatter_chunk_bytes);
    const size_t chunk = std::max<size_t>(1, std::min(recv_count, limit / sizeof(T) / n));
    std::vector<T> work(chunk * n);
    for (size_t a = 0; a < recv_count; a += chunk) {
      const size_t len = std::min(chunk, recv_count - a);
      for (size_t b = 0; b < n; ++b)
        std::memcpy(&work[b * len], send + b * recv_count + a, len * sizeof(T));
      std::vector<int> recv_elems(n, static_cast<int>(len));
      gloo::ReduceScatterHalvingDoubling<T> algo(ctx_, std::vector<T*>{work.data()},
                                                 static_cast<int>(len * n), recv_elems, fn);
      algo.run();
      std::memcpy(recv + a, work.data(), len * sizeof(T));
    }
  }

  Future<void> submit(std::string_view what, size_t nbytes, std::function<void()> body) {
    std::string label = std::string(what) + " of " + std::to_string(nbytes) + " bytes";
    return queue_->async([this, label, body = std::move(body)]() -> Status {
      if (!broken_.ok())
        return failed_precondition("rank " + std::to_string(rank()) + ": " + label +
                                   ": the communicator is broken by an earlier error: " +
                                   broken_.message());
      std::string detail;
      try {
        body();
        return Status::OK();
      } catch (const gloo::Exception& e) {
        detail = e.what();
      } catch (const std::exception& e) {
        detail = e.what();
      }
      broken_ = describe_gloo_failure(*boot_, label, detail, looks_like_timeout(detail),
                                      /*all_joined=*/true);
      return broken_;
    });
  }

  std::shared_ptr<gloo::transport::Device> dev_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  Status broken_;  // touched only on the queue thread
  std::unique_ptr<ThreadPool> queue_;  // one worker: operations in submission order
};

}  // namespace

Result<std::unique_ptr<Communicator>> create_gloo(std::unique_ptr<Bootstrap> boot) {
  const auto& env = boot->env;
  const auto& opt = boot->options;
  gloo::transport::tcp::attr attr;
  if (!opt.gloo_interface.empty()) {
    attr.iface = opt.gloo_interface;
  } else if (!opt.gloo_hostname.empty()) {
    attr.hostname = opt.gloo_hostname;
  } else if (is_loopback(env.master_addr)) {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0)
      return errno_status(errno, "rank " + std::to_string(env.rank) + ": gethostname");
    attr.hostname = host;
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ThreadPool> queue, make_op_queue());
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  ignore_default_sigpipe();
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
    ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world_size);
    ctx->setTimeout(opt.timeout);
    GlooStore store(*boot->client, boot->prefix + "gloo/", opt.timeout);
    ctx->connectFullMesh(store, dev);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::string where = attr.iface.empty() ? "host '" + attr.hostname + "'" : "interface '" + attr.iface + "'";
    return describe_gloo_failure(*boot, "Gloo rendezvous on " + where, msg,
                                 msg.find("DeadlineExceeded") != std::string::npos ||
                                     looks_like_timeout(msg),
                                 /*all_joined=*/false);
  }
  // Every rank connected: agree on it before the first collective, so a rank that fails
  // later is reported as a collective failure rather than a rendezvous one.
  STRATA_RETURN_IF_ERROR(boot->client->barrier(boot->prefix + "ready", env.world_size, opt.timeout));
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(std::move(boot), std::move(queue), std::move(dev), std::move(ctx)));
}

}  // namespace strata::detail
