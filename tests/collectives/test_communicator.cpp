// Communicators of one rank in this process: Gloo (collectives, argument errors, SIGPIPE,
// a port in use) and NCCL (on a GPU).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/launcher.hpp"

#ifdef STRATA_HAVE_CUDA
#include "strata/base/detail/cuda_api.hpp"  // the CUDA runtime, loaded at run time
#endif

using namespace strata;

namespace {
/// A world of one rank on loopback, at a free port.
DistributedEnv loopback_env() {
  DistributedEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = *find_free_port();
  return env;
}
CommunicatorOptions options_with_timeout(int ms) {
  CommunicatorOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}
}  // namespace

TEST(GlooCommunicator, WorldSizeOneInProcess) {
  auto c = create_communicator(loopback_env(), options_with_timeout(3000));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Communicator& comm = **c;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.backend(), Backend::kGloo);
  EXPECT_EQ(comm.device(), -1);  // host memory
  std::vector<int32_t> in{1, 2, 3}, out(3, 0);
  ASSERT_TRUE(comm.all_gather(in.data(), out.data(), 3, DType::kInt32).ok());
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), 0);
  ASSERT_TRUE(comm.all_reduce(in.data(), out.data(), 3, DType::kInt32, ReduceOp::kSum).ok());
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), 0);
  ASSERT_TRUE(comm.reduce_scatter(in.data(), out.data(), 3, DType::kInt32, ReduceOp::kMax).ok());
  EXPECT_EQ(out, in);
  ASSERT_TRUE(comm.broadcast(in.data(), 3, DType::kInt32, 0).ok());
  EXPECT_EQ(comm.broadcast(in.data(), 3, DType::kInt32, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.all_gather(nullptr, out.data(), 3, DType::kInt32).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(comm.barrier_async().result().ok());
}

TEST(GlooCommunicator, CompositesRunInOrderOnTheirOwnWorkerAndTheDestructorRunsThemAll) {
  auto c = create_communicator(loopback_env(), options_with_timeout(3000));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::unique_ptr<Communicator> comm = std::move(c).value();
  Communicator* raw = comm.get();  // reset() nulls `comm` before the destructor runs
  std::vector<int> order;  // written only by the composite worker, read after it is joined
  std::vector<int32_t> in{1, 2, 3}, out(3, 0);
  // A composite blocks on the communicator's own collectives (which never queue behind it).
  Future<void> f1 = comm->run_composite_async([&]() -> Status {
    order.push_back(1);
    return raw->all_gather(in.data(), out.data(), 3, DType::kInt32);
  });
  Future<void> f2 = comm->run_composite_async([&]() -> Status {
    order.push_back(2);
    return invalid_argument("second");  // its Status is the future's
  });
  std::vector<Future<void>> rest;
  for (int k = 3; k <= 8; ++k) {
    rest.push_back(comm->run_composite_async([&order, k]() -> Status {
      order.push_back(k);
      return Status::OK();
    }));
  }
  comm.reset();  // runs every queued composite first
  ASSERT_TRUE(f1.ready() && f2.ready());
  EXPECT_TRUE(f1.result().ok()) << f1.result().status().to_string();
  EXPECT_EQ(out, in);
  EXPECT_EQ(f2.result().status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f2.result().status().message(), "second");
  for (const auto& f : rest) {
    ASSERT_TRUE(f.ready());
    EXPECT_TRUE(f.result().ok());
  }
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
}

namespace {
std::atomic<int> g_sigpipes{0};
void count_sigpipe(int) { g_sigpipes.fetch_add(1); }
/// Writes one byte into a pipe whose read end is closed: EPIPE (and a SIGPIPE) expected.
int write_to_broken_pipe() {
  int fds[2];
  if (::pipe(fds) != 0) return errno;
  ::close(fds[0]);
  char c = 'x';
  ssize_t n = ::write(fds[1], &c, 1);
  int e = n < 0 ? errno : 0;
  ::close(fds[1]);
  return e;
}
std::unique_ptr<Communicator> world_of_one() {
  auto c = create_communicator(loopback_env(), options_with_timeout(3000));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : nullptr;
}
}  // namespace

/// SIGPIPE's handler once `before` is installed and a Gloo communicator has been created
/// (SIG_ERR when a step fails).
sighandler_t sigpipe_handler_after_communicator(sighandler_t before) {
  struct sigaction act {};
  act.sa_handler = before;
  sigemptyset(&act.sa_mask);
  if (::sigaction(SIGPIPE, &act, nullptr) != 0) return SIG_ERR;
  if (!world_of_one()) return SIG_ERR;
  struct sigaction now {};
  if (::sigaction(SIGPIPE, nullptr, &now) != 0) return SIG_ERR;
  return now.sa_handler;
}

TEST(GlooCommunicator, SigpipeIsIgnoredUnlessTheApplicationHandlesIt) {
  // Gloo writes with writev(): with SIGPIPE at its default action, a peer that dies
  // mid-collective would kill this process instead of failing the collective.
  struct sigaction saved {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &saved), 0);
  // 1. An application handler is kept.
  EXPECT_EQ(sigpipe_handler_after_communicator(count_sigpipe), &count_sigpipe);
  g_sigpipes = 0;
  EXPECT_EQ(write_to_broken_pipe(), EPIPE);
  EXPECT_EQ(g_sigpipes.load(), 1);
  // 2. The default action (terminate) becomes "ignore": the write fails with EPIPE and the
  //    process lives on.
  EXPECT_EQ(sigpipe_handler_after_communicator(SIG_DFL), SIG_IGN);
  EXPECT_EQ(write_to_broken_pipe(), EPIPE);
  ::sigaction(SIGPIPE, &saved, nullptr);
}

TEST(GlooCommunicator, PortInUseIsUnavailableNamingThePort) {
  const DistributedEnv env = loopback_env();
  const CommunicatorOptions o = options_with_timeout(2000);
  auto first = create_communicator(env, o);
  ASSERT_TRUE(first.ok());
  auto second = create_communicator(env, o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("MASTER_PORT=" + std::to_string(env.master_port)),
            std::string::npos)
      << second.status().message();
}

TEST(NcclCommunicator, WorldSizeOneOnGpu) {
  if (!nccl_available()) GTEST_SKIP() << "no GPU (or NCCL not built): NCCL test skipped";
#ifdef STRATA_HAVE_CUDA
  CommunicatorOptions o = options_with_timeout(20000);
  o.backend = Backend::kNccl;
  auto c = create_communicator(loopback_env(), o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->backend(), Backend::kNccl);
  Communicator& comm = **c;
  // cuda_device -1 picks LOCAL_RANK (0) modulo the number of devices: device 0.
  EXPECT_EQ(comm.device(), 0);
  const size_t n = 1001;
  std::vector<float> host(n), back(n, -1.0f);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 13);
  const detail::CudartApi& cu = *detail::cudart();  // loaded: nccl_available()
  float *d_a = nullptr, *d_b = nullptr;
  ASSERT_EQ(cu.cudaMalloc(reinterpret_cast<void**>(&d_a), n * 4), cudaSuccess);
  ASSERT_EQ(cu.cudaMalloc(reinterpret_cast<void**>(&d_b), n * 4), cudaSuccess);
  ASSERT_EQ(cu.cudaMemcpy(d_a, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(comm.all_gather(d_a, d_b, n, DType::kFloat32).ok());
  cu.cudaMemcpy(back.data(), d_b, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  cu.cudaMemset(d_b, 0, n * 4);
  ASSERT_TRUE(comm.all_reduce(d_a, d_b, n, DType::kFloat32, ReduceOp::kSum).ok());
  cu.cudaMemcpy(back.data(), d_b, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  cu.cudaMemset(d_b, 0, n * 4);
  ASSERT_TRUE(comm.reduce_scatter(d_a, d_b, n, DType::kFloat32, ReduceOp::kMax).ok());
  cu.cudaMemcpy(back.data(), d_b, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  ASSERT_TRUE(comm.broadcast(d_a, n, DType::kFloat32, 0).ok());
  ASSERT_TRUE(comm.barrier().ok());
  EXPECT_EQ(comm.all_reduce(d_a, d_b, 4, DType::kInt16, ReduceOp::kSum).code(),
            StatusCode::kUnimplemented);
  cu.cudaFree(d_a);
  cu.cudaFree(d_b);
#endif
}
