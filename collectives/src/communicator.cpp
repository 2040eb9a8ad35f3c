// Communicator: environment contract, creation, blocking forms, shared helpers.
#include "strata/collectives/communicator.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>

#include "backend.hpp"
#include "strata/base/env.hpp"
#include "strata/base/logging.hpp"

namespace strata {

std::string_view backend_name(Backend b) noexcept {
  return b == Backend::kNccl ? "nccl" : "gloo";
}

Result<Backend> parse_backend(std::string_view text) {
  if (text == "gloo") return Backend::kGloo;
  if (text == "nccl") return Backend::kNccl;
  return invalid_argument("unknown backend '" + std::string(text) + "' (expected gloo or nccl)");
}

std::string_view reduce_op_name(ReduceOp op) noexcept {
  return op == ReduceOp::kMax ? "max" : "sum";
}

namespace {

Result<int64_t> env_int(const char* name, bool required, int64_t fallback) {
  auto v = env_string(name);
  if (!v) {
    if (required)
      return invalid_argument(std::string("environment variable ") + name +
                              " is not set (the torchrun contract needs MASTER_ADDR, "
                              "MASTER_PORT, RANK, WORLD_SIZE; LOCAL_RANK optional)");
    return fallback;
  }
  bool digits = !v->empty() && v->size() <= 18 &&
                std::all_of(v->begin(), v->end(),
                            [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (!digits)
    return invalid_argument(std::string("environment variable ") + name + "='" + *v +
                            "' is not a non-negative decimal integer");
  return static_cast<int64_t>(std::strtoll(v->c_str(), nullptr, 10));
}

}  // namespace

Result<DistributedEnv> read_distributed_env() {
  DistributedEnv e;
  auto addr = env_string("MASTER_ADDR");
  if (!addr || addr->empty())
    return invalid_argument(
        "environment variable MASTER_ADDR is not set (the torchrun contract needs "
        "MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; LOCAL_RANK optional)");
  e.master_addr = *addr;
  STRATA_ASSIGN_OR_RETURN(int64_t port, env_int("MASTER_PORT", true, 0));
  if (port < 1 || port > 65535)
    return invalid_argument("environment variable MASTER_PORT=" + std::to_string(port) +
                            " is not a TCP port (1..65535)");
  e.master_port = static_cast<uint16_t>(port);
  STRATA_ASSIGN_OR_RETURN(int64_t world, env_int("WORLD_SIZE", true, 1));
  if (world < 1 || world > 1 << 20)
    return invalid_argument("environment variable WORLD_SIZE=" + std::to_string(world) +
                            " must be between 1 and 1048576");
  STRATA_ASSIGN_OR_RETURN(int64_t rank, env_int("RANK", true, 0));
  if (rank >= world)
    return invalid_argument("environment variable RANK=" + std::to_string(rank) +
                            " is not below WORLD_SIZE=" + std::to_string(world));
  STRATA_ASSIGN_OR_RETURN(int64_t local, env_int("LOCAL_RANK", false, rank));
  if (local >= world)
    return invalid_argument("environment variable LOCAL_RANK=" + std::to_string(local) +
                            " is not below WORLD_SIZE=" + std::to_string(world));
  e.world_size = static_cast<int>(world);
  e.rank = static_cast<int>(rank);
  e.local_rank = static_cast<int>(local);
  return e;
}

Result<CommunicatorOptions> communicator_options_from_env() {
  CommunicatorOptions o;
  STRATA_ASSIGN_OR_RETURN(uint64_t ms, env_uint("STRATA_COLL_TIMEOUT_MS", 30000));
  if (ms == 0) return invalid_argument("environment variable STRATA_COLL_TIMEOUT_MS must be > 0");
  o.timeout = std::chrono::milliseconds(ms);
  if (auto iface = env_string("GLOO_SOCKET_IFNAME")) o.gloo_interface = *iface;
  return o;
}

Communicator::~Communicator() = default;

Result<std::unique_ptr<Communicator>> create_communicator(const DistributedEnv& env,
                                                          const CommunicatorOptions& options) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size)
    return invalid_argument("create_communicator: rank " + std::to_string(env.rank) +
                            " / world size " + std::to_string(env.world_size) + " is invalid");
  if (options.timeout.count() <= 0)
    return invalid_argument("create_communicator: options.timeout must be > 0");
  if (env.master_port == 0)
    return invalid_argument("create_communicator: master_port 0 is not a port");
  // Communicators created in the same order on every rank get the same key prefix.
  static std::atomic<int> seq{0};
  auto boot = std::make_unique<detail::Bootstrap>();
  boot->env = env;
  boot->options = options;
  boot->prefix = "strata/comm" + std::to_string(seq.fetch_add(1)) + "/";
  if (env.rank == 0 && options.rank0_hosts_store) {
    auto server = RendezvousServer::start("0.0.0.0", env.master_port);
    if (!server.ok())
      return server.status().with_context("rank 0: starting the rendezvous server (MASTER_PORT=" +
                                          std::to_string(env.master_port) + ")");
    boot->server = std::move(*server);
  }
  RendezvousClientOptions copt;
  copt.rank = env.rank;
  copt.connect_timeout = options.timeout;
  copt.timeout = options.timeout;
  auto client = RendezvousClient::connect(env.master_addr, env.master_port, copt);
  if (!client.ok()) return client.status();
  boot->client = std::move(*client);
  if (options.backend == Backend::kNccl) return detail::create_nccl(std::move(boot));
  return detail::create_gloo(std::move(boot));
}

Result<std::unique_ptr<Communicator>> create_communicator_from_env(Backend backend) {
  STRATA_ASSIGN_OR_RETURN(DistributedEnv env, read_distributed_env());
  STRATA_ASSIGN_OR_RETURN(CommunicatorOptions options, communicator_options_from_env());
  options.backend = backend;
  return create_communicator(env, options);
}

namespace detail {

Bootstrap::~Bootstrap() {
  if (server) {
    // Our own client still counts as connected: close it first.
    client.reset();
    auto bound = std::min(options.timeout, std::chrono::milliseconds(10000));
    if (!server->wait_until_disconnected({}, bound))
      log_warn("rank 0: closing the rendezvous server while ranks are still connected");
  }
}

Result<std::unique_ptr<ThreadPool>> make_op_queue() { return ThreadPool::create(1); }

Future<void> CompositeQueue::run(std::function<Status()> op) {
  std::lock_guard<std::mutex> lk(mu_);  // async() only queues: held briefly
  if (shut_down_) {
    return make_ready_future(
        Result<void>(failed_precondition("run_composite_async: the communicator is closing")));
  }
  if (pool_ == nullptr) {
    auto p = ThreadPool::create(1);
    if (!p.ok()) return make_ready_future(Result<void>(p.status()));
    pool_ = std::move(*p);
  }
  return pool_->async(std::move(op));
}

void CompositeQueue::shutdown() {
  std::unique_ptr<ThreadPool> pool;
  {
    std::lock_guard<std::mutex> lk(mu_);
    shut_down_ = true;
    pool = std::move(pool_);
  }
  pool.reset();  // runs the queued composites, joins the worker
}

Status describe_failure(RendezvousClient& store, int rank, std::string_view what,
                        const std::string& detail, bool timed_out,
                        std::chrono::milliseconds timeout) {
  const std::string head = "rank " + std::to_string(rank) + ": " + std::string(what) + " failed";
  // The peers notice a dead rank's closed sockets about when the server does; give it 1 s.
  std::vector<int> lost;
  bool store_ok = true;
  // After a timeout the server has long noticed any death: one query is enough.
  const int polls = timed_out ? 1 : 10;
  for (int i = 0; i < polls; ++i) {
    auto r = store.lost_ranks();
    if (!r.ok()) {
      store_ok = false;
      break;
    }
    lost = *r;
    if (!lost.empty() || i + 1 == polls) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!store_ok)
    return unavailable(head + ": rank 0 (host of the rendezvous server) is gone or unreachable; " +
                       "transport error: " + detail);
  if (!lost.empty()) {
    std::string ranks;
    for (size_t i = 0; i < lost.size(); ++i) ranks += (i ? ", " : "") + std::to_string(lost[i]);
    return unavailable(head + ": peer rank" + (lost.size() > 1 ? "s " : " ") + ranks +
                       (lost.size() > 1 ? " are" : " is") +
                       " gone (connection to the rendezvous server closed: exited or killed); "
                       "transport error: " + detail);
  }
  if (timed_out)
    return deadline_exceeded(head + ": no answer from a peer within " +
                             std::to_string(timeout.count()) +
                             " ms (every rank is still connected to the store: a peer is hung "
                             "or issued a different collective); transport error: " + detail);
  return unavailable(head + ": " + detail);
}

Status check_args(std::string_view what, const void* a, const void* b, size_t count,
                  DType dtype) {
  if (!dtype_is_valid(dtype))
    return invalid_argument(std::string(what) + ": invalid dtype value " +
                            std::to_string(static_cast<int>(dtype)));
  if (count > 0 && (a == nullptr || b == nullptr))
    return invalid_argument(std::string(what) + ": null buffer with count " + std::to_string(count));
  return Status::OK();
}

Status check_broadcast_args(void* buf, size_t count, DType dtype, int root, int size) {
  STRATA_RETURN_IF_ERROR(check_args("broadcast", buf, buf, count, dtype));
  if (root < 0 || root >= size)
    return invalid_argument("broadcast: root " + std::to_string(root) +
                            " is not a rank of a communicator of size " + std::to_string(size));
  return Status::OK();
}

#ifndef STRATA_HAVE_CUDA
Result<std::unique_ptr<Communicator>> create_nccl(std::unique_ptr<Bootstrap>) {
  return unimplemented("the NCCL backend is not built in (this build has no CUDA: "
                       "STRATA_HAVE_CUDA is off)");
}
#endif

}  // namespace detail

#ifndef STRATA_HAVE_CUDA
bool nccl_available() { return false; }
#endif

}  // namespace strata
