// Helper process of the collectives tests, started N times by launch_local() (see
// test_gloo_multiprocess.cpp). Reads the torchrun variables, runs one scenario and exits 0
// only when every result matched exactly.
//
//   coll_worker check        all collectives, all dtypes, awkward counts; prints
//                            "CHECKS_PASSED <n>"
//   coll_worker killed       the last rank SIGKILLs itself after setup; the others must get
//                            Unavailable naming it within the timeout; prints
//                            "EXPECTED_FAILURE <code> <ms> <message>"
//   coll_worker hung         the last rank stops answering (sleeps); the others must get
//                            DeadlineExceeded within the timeout
//   coll_worker nccl         world size 1 NCCL checks (GPU machines)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/multiprocess_worker.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/rendezvous.hpp"

#ifdef STRATA_HAVE_CUDA
#include "strata/base/detail/cuda_api.hpp"  // the CUDA runtime, loaded at run time
#endif

using namespace strata;
using namespace strata::multiprocess;

namespace {

uint16_t fp16_of(int v) {
  _Float16 h = static_cast<_Float16>(static_cast<float>(v));
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
uint16_t bf16_of(int v) {  // exact for |v| < 256
  float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// Writes the small integer `v` as one element of `dtype` at `p`. For bool, v != 0.
void store_int(DType t, void* p, int64_t v) {
  switch (t) {
    case DType::kFloat32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case DType::kFloat64: { double x = static_cast<double>(v); std::memcpy(p, &x, 8); break; }
    case DType::kFloat16: { uint16_t x = fp16_of(static_cast<int>(v)); std::memcpy(p, &x, 2); break; }
    case DType::kBFloat16: { uint16_t x = bf16_of(static_cast<int>(v)); std::memcpy(p, &x, 2); break; }
    case DType::kInt8: { int8_t x = static_cast<int8_t>(v); std::memcpy(p, &x, 1); break; }
    case DType::kInt16: { int16_t x = static_cast<int16_t>(v); std::memcpy(p, &x, 2); break; }
    case DType::kInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DType::kInt64: { std::memcpy(p, &v, 8); break; }
    case DType::kUInt8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(p, &x, 1); break; }
    case DType::kBool: { uint8_t x = v != 0; std::memcpy(p, &x, 1); break; }
  }
}

std::vector<char> make(DType t, size_t n, const std::function<int64_t(size_t)>& f) {
  std::vector<char> b(n * dtype_size(t) + 1);  // +1: never a null data() for n == 0
  for (size_t i = 0; i < n; ++i) store_int(t, b.data() + i * dtype_size(t), f(i));
  return b;
}

void expect_equal(const std::vector<char>& got, const std::vector<char>& want, size_t n, DType t,
                  const std::string& what) {
  size_t es = dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), " (%s): first mismatch at element %zu of %zu", 
                    std::string(dtype_name(t)).c_str(), i, n);
      die(what + buf);
    }
  }
  ++g_checks;
}

const DType kAll[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                      DType::kInt8,    DType::kInt16,   DType::kInt32,    DType::kInt64,
                      DType::kUInt8,   DType::kBool};

// Value of element i on rank r: small non-negative integers, exact in every dtype after
// summing over <= 4 ranks (max sum 4 * 10 = 40).
int64_t val(DType t, int r, size_t i) {
  if (t == DType::kBool) return (static_cast<size_t>(r) + i) % 3 == 0;
  return static_cast<int64_t>((static_cast<size_t>(r) * 3 + i) % 11);
}

void check_all_gather(Communicator& c, DType t, size_t count) {
  const int n = c.size(), r = c.rank();
  auto send = make(t, count, [&](size_t i) { return val(t, r, i); });
  auto want = make(t, count * n, [&](size_t j) { return val(t, static_cast<int>(j / count), j % count); });
  std::vector<char> recv(want.size(), 0x5a);
  ok_or_die(c.all_gather(send.data(), recv.data(), count, t), "all_gather");
  expect_equal(recv, want, count * n, t, "all_gather count " + std::to_string(count));
}

void check_all_gather_in_place(Communicator& c, size_t count) {
  const DType t = DType::kFloat32;
  const int n = c.size(), r = c.rank();
  auto want = make(t, count * n, [&](size_t j) { return val(t, static_cast<int>(j / count), j % count); });
  std::vector<char> buf(want.size(), 0);
  std::memcpy(buf.data() + r * count * 4, want.data() + r * count * 4, count * 4);
  ok_or_die(c.all_gather(buf.data() + r * count * 4, buf.data(), count, t), "all_gather in place");
  expect_equal(buf, want, count * n, t, "all_gather in place count " + std::to_string(count));
}

int64_t reduce_expected(DType t, ReduceOp op, int n, size_t i,
                        const std::function<int64_t(int, size_t)>& f) {
  int64_t acc = f(0, i);
  for (int s = 1; s < n; ++s) {
    int64_t v = f(s, i);
    if (t == DType::kBool) acc = acc || v;
    else acc = op == ReduceOp::kSum ? acc + v : std::max(acc, v);
  }
  return acc;
}

void check_all_reduce(Communicator& c, DType t, ReduceOp op, size_t count, bool in_place) {
  const int n = c.size(), r = c.rank();
  auto f = [&](int s, size_t i) { return val(t, s, i); };
  auto send = make(t, count, [&](size_t i) { return f(r, i); });
  auto want = make(t, count, [&](size_t i) { return reduce_expected(t, op, n, i, f); });
  std::vector<char> recv(send.size(), 0x5a);
  void* out = in_place ? send.data() : recv.data();
  ok_or_die(c.all_reduce(send.data(), out, count, t, op), "all_reduce");
  expect_equal(in_place ? send : recv, want, count, t,
               std::string("all_reduce ") + std::string(reduce_op_name(op)) + " count " +
                   std::to_string(count) + (in_place ? " in place" : ""));
}

void check_reduce_scatter(Communicator& c, DType t, ReduceOp op, size_t recv_count) {
  const int n = c.size(), r = c.rank();
  auto f = [&](int s, size_t j) { return val(t, s, j * 7 + 1); };
  auto send = make(t, recv_count * n, [&](size_t j) { return f(r, j); });
  auto want = make(t, recv_count, [&](size_t i) {
    return reduce_expected(t, op, n, static_cast<size_t>(r) * recv_count + i, f);
  });
  std::vector<char> recv(want.size(), 0x5a);
  ok_or_die(c.reduce_scatter(send.data(), recv.data(), recv_count, t, op), "reduce_scatter");
  expect_equal(recv, want, recv_count, t,
               std::string("reduce_scatter ") + std::string(reduce_op_name(op)) + " recv_count " +
                   std::to_string(recv_count));
}

void check_broadcast(Communicator& c, DType t, size_t count, int root) {
  const int r = c.rank();
  auto want = make(t, count, [&](size_t i) { return val(t, root, i); });
  auto buf = r == root ? want : std::vector<char>(want.size(), 0x5a);
  ok_or_die(c.broadcast(buf.data(), count, t, root), "broadcast");
  expect_equal(buf, want, count, t, "broadcast root " + std::to_string(root));
}

void check_async(Communicator& c) {
  const DType t = DType::kInt32;
  const int n = c.size(), r = c.rank();
  const size_t count = 777;
  std::vector<std::vector<char>> sends, recvs;
  std::vector<Future<void>> fs;
  for (int k = 0; k < 3; ++k) {
    sends.push_back(make(t, count, [&](size_t i) { return val(t, r, i + k); }));
    recvs.emplace_back(count * n * 4 + 1, 0);
  }
  for (int k = 0; k < 3; ++k)
    fs.push_back(c.all_gather_async(sends[k].data(), recvs[k].data(), count, t));
  ok_or_die(when_all(fs).result().status(), "async all_gathers");
  for (int k = 0; k < 3; ++k) {
    auto want = make(t, count * n, [&](size_t j) { return val(t, static_cast<int>(j / count), j % count + k); });
    expect_equal(recvs[k], want, count * n, t, "async all_gather #" + std::to_string(k));
  }
}

int run_check() {
  auto comm_r = create_communicator_from_env(Backend::kGloo);
  ok_or_die(comm_r.status(), "create_communicator_from_env");
  Communicator& c = **comm_r;
  const int n = c.size();
  g_rank = c.rank();
  for (DType t : kAll) {
    for (size_t count : {size_t{1}, size_t{5}, size_t{1003}}) check_all_gather(c, t, count);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (size_t count : {size_t{1}, size_t{3}, size_t{1001}}) check_all_reduce(c, t, op, count, false);
      for (size_t rc : {size_t{1}, size_t{2}, size_t{333}}) check_reduce_scatter(c, t, op, rc);
    }
  }
  check_all_gather(c, DType::kFloat32, 0);
  check_all_gather(c, DType::kUInt8, (1 << 20) + 3);  // several MiB: many ring segments
  check_all_gather_in_place(c, 1001);
  check_all_reduce(c, DType::kFloat32, ReduceOp::kSum, (1 << 18) + 7, true);
  check_all_reduce(c, DType::kInt64, ReduceOp::kMax, 0, false);
  if (n > 1) check_all_reduce(c, DType::kFloat32, ReduceOp::kSum, static_cast<size_t>(n - 1), false);
  check_reduce_scatter(c, DType::kFloat32, ReduceOp::kSum, (1 << 16) + 5);
  for (int root = 0; root < n; ++root) {
    check_broadcast(c, DType::kFloat32, 1001, root);
    check_broadcast(c, DType::kInt8, 1, root);
  }
  check_async(c);
  for (int k = 0; k < 3; ++k) ok_or_die(c.barrier(), "barrier");
  ++g_checks;

  // Errors that need no peer.
  Status bad_root = c.broadcast(nullptr, 0, DType::kFloat32, n);
  if (bad_root.code() != StatusCode::kInvalidArgument) die("bad root gave " + bad_root.to_string());
  ++g_checks;

  // The store is usable by the application.
  auto k = c.store().add("app/counter", 1);
  ok_or_die(k.status(), "store add");
  ok_or_die(c.barrier(), "barrier");
  auto total = c.store().add("app/counter", 0);
  ok_or_die(total.status(), "store add 0");
  if (*total != n) die("app/counter is " + std::to_string(*total));
  ++g_checks;

  // A second communicator on the same store, with tiny reduce-scatter pieces.
  auto opts = communicator_options_from_env();
  ok_or_die(opts.status(), "options");
  opts->gloo_reduce_scatter_chunk_bytes = 256;
  auto env = read_distributed_env();
  ok_or_die(env.status(), "env");
  opts->rank0_hosts_store = false;  // rank 0's first communicator still serves
  auto c2 = create_communicator(*env, *opts);
  ok_or_die(c2.status(), "second communicator");
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kInt64})
    check_reduce_scatter(**c2, t, ReduceOp::kSum, 1001);
  check_all_gather(**c2, DType::kInt16, 129);
  ok_or_die((*c2)->barrier(), "barrier 2");
  c2->reset();

  print_checks_passed();
  return 0;
}

int run_peer_failure(bool kill) {
  auto opts = communicator_options_from_env();
  ok_or_die(opts.status(), "options");
  auto env = read_distributed_env();
  ok_or_die(env.status(), "env");
  g_rank = env->rank;
  auto comm_r = create_communicator(*env, *opts);
  ok_or_die(comm_r.status(), "create_communicator");
  Communicator& c = **comm_r;
  const int victim = c.size() - 1;
  const size_t count = 4096;
  std::vector<float> send(count, 1.0f), recv(count * c.size());
  ok_or_die(c.all_gather(send.data(), recv.data(), count, DType::kFloat32), "first all_gather");
  if (c.rank() == victim) {
    if (kill) raise(SIGKILL);
    // Hung: keep every socket open and answer nothing until the others have given up.
    std::this_thread::sleep_for(opts->timeout + std::chrono::milliseconds(1500));
    std::_Exit(0);
  }
  auto t0 = std::chrono::steady_clock::now();
  Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i)
    s = c.all_gather(send.data(), recv.data(), count, DType::kFloat32);
  const long long ms = ms_since(t0);
  if (s.ok()) die("collectives kept succeeding with rank " + std::to_string(victim) + " gone");
  print_expected_failure(s, ms);
  // A broken communicator refuses further work at once.
  Status again = c.barrier();
  std::printf("AFTER %s\n", std::string(status_code_name(again.code())).c_str());
  std::fflush(stdout);
  // Rank 0 hosts the store: keep it until every survivor has made its diagnosis.
  ok_or_die(c.store().barrier("survivors", c.size() - 1, opts->timeout), "survivor barrier");
  // Normal teardown: rank 0 keeps the store until the other survivor has disconnected.
  return 0;
}

int run_nccl() {
#ifdef STRATA_HAVE_CUDA
  auto comm_r = create_communicator_from_env(Backend::kNccl);
  ok_or_die(comm_r.status(), "create_communicator_from_env(nccl)");
  Communicator& c = **comm_r;
  g_rank = c.rank();
  const size_t count = 1001;
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 11);
  const detail::CudartApi& cu = *detail::cudart();  // loaded: the communicator exists
  float *d_in = nullptr, *d_out = nullptr;
  cu.cudaMalloc(reinterpret_cast<void**>(&d_in), count * 4 * c.size());
  cu.cudaMalloc(reinterpret_cast<void**>(&d_out), count * 4 * c.size());
  cu.cudaMemcpy(d_in, host.data(), count * 4, cudaMemcpyHostToDevice);
  std::vector<float> back(count * c.size());
  ok_or_die(c.all_gather(d_in, d_out, count, DType::kFloat32), "nccl all_gather");
  cu.cudaMemcpy(back.data(), d_out, count * 4 * c.size(), cudaMemcpyDeviceToHost);
  for (int r = 0; r < c.size(); ++r)
    if (std::memcmp(back.data() + r * count, host.data(), count * 4) != 0) die("nccl all_gather mismatch");
  ++g_checks;
  ok_or_die(c.all_reduce(d_in, d_out, count, DType::kFloat32, ReduceOp::kSum), "nccl all_reduce");
  cu.cudaMemcpy(back.data(), d_out, count * 4, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < count; ++i)
    if (back[i] != host[i] * c.size()) die("nccl all_reduce mismatch");
  ++g_checks;
  ok_or_die(c.barrier(), "nccl barrier");
  ++g_checks;
  cu.cudaFree(d_in);
  cu.cudaFree(d_out);
  print_checks_passed();
  return 0;
#else
  std::printf("NCCL not built\n");
  return 2;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "check") return run_check();
  if (mode == "killed") return run_peer_failure(true);
  if (mode == "hung") return run_peer_failure(false);
  if (mode == "nccl") return run_nccl();
  std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
  return 2;
}
