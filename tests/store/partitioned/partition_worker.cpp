// Helper process of the partitioned-object tests (tests/store/test_partitioned.cpp), started
// N times by launch_local(): real processes, each with its own store DIR/rank<r>, talking
// over loopback (Gloo). Exits 0 only when every result matched exactly.
//
//   partition_worker check DIR     put/fetch for many dtypes, shapes and awkward numels
//                                  (0, 1, < N, not divisible by N, multi-piece), exact
//                                  bytes, pipelined and sequential, error agreement,
//                                  reduce_scatter_grads; prints "CHECKS_PASSED <n>"
//   partition_worker put DIR       stores object "w" (fp32[1000]) over this world size
//   partition_worker refetch DIR   fetches "w": prints "EXPECTED_FAILURE <code> <message>"
//   partition_worker killed DIR    the last rank SIGKILLs itself before a fetch; the others
//                                  print "EXPECTED_FAILURE <code> <ms> <message>"
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
#include "strata/store/partitioned.hpp"
#include "strata/store/store.hpp"

using namespace strata;
using namespace strata::multiprocess;

namespace {

// Byte i of tensor `seed`: independent of the world size, so every rank can check.
uint8_t pat(uint64_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED03ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 56);
}
std::vector<uint8_t> full_pattern(uint64_t seed, uint64_t nbytes) {
  std::vector<uint8_t> v(nbytes);
  for (uint64_t i = 0; i < nbytes; ++i) v[i] = pat(seed, i);
  return v;
}

std::unique_ptr<Store> open_store(const std::string& dir, int rank) {
  StoreOptions o;
  o.path = dir + "/rank" + std::to_string(rank);
  o.host_budget_bytes = 8ull << 20;
  o.staging_bytes = 4ull << 20;
  o.chunk_bytes = 16ull << 10;  // pieces of fetch_partitioned are whole chunks
  o.worker_threads = 2;
  o.durability = Durability::kOnFlush;  // the test is about data movement, not fsync
  auto s = Store::open(o);
  ok_or_die(s.status(), "Store::open " + o.path);
  return std::move(s).value();
}

std::unique_ptr<Communicator> make_comm() {
  auto c = create_communicator_from_env(Backend::kGloo);
  ok_or_die(c.status(), "create_communicator_from_env");
  g_rank = (*c)->rank();
  return std::move(c).value();
}

// One put + fetches of `desc` under `key`; exact bytes after each fetch.
void roundtrip(Store& st, Communicator& c, const std::string& key, const TensorDesc& desc,
               uint64_t seed, bool slice_put, std::vector<uint64_t> pieces) {
  const int n = c.size(), r = c.rank();
  const uint64_t es = dtype_size(desc.dtype), nb = desc.nbytes();
  std::vector<uint8_t> full = full_pattern(seed, nb);
  auto l = partition_layout(desc.numel(), n);
  ok_or_die(l.status(), "layout");
  PartitionOptions po;
  Status ps;
  if (slice_put) {
    std::vector<uint8_t> mine(full.begin() + l->begin(r) * es, full.begin() + l->end(r) * es);
    ps = put_partitioned_slice_async(st, c, key, mine.empty() ? nullptr : mine.data(), desc, po)
             .result()
             .status();
  } else {
    ps = put_partitioned(st, c, key, full.data(), desc, po);
  }
  ok_or_die(ps, "put " + key);
  auto info = stat_partitioned(st, key);
  ok_or_die(info.status(), "stat_partitioned " + key);
  expect(info->world_size == n && info->rank == r && info->numel == desc.numel() &&
             info->owned_begin == l->begin(r) && info->owned_numel == l->owned_numel(r) &&
             info->desc.dtype == desc.dtype && info->desc.shape == desc.shape,
         "stat_partitioned " + key);
  // The slice object holds exactly the owned bytes.
  if (l->owned_numel(r) > 0) {
    auto oi = st.stat(key + kPartitionDataSuffix);
    ok_or_die(oi.status(), "stat slice");
    expect(oi->nbytes == l->owned_numel(r) * es, "slice size of " + key);
  } else {
    expect(!st.contains(key + kPartitionDataSuffix), "no slice object for an empty slice");
  }
  for (uint64_t piece : pieces) {
    for (bool pipelined : {true, false}) {
      PartitionOptions fo;
      fo.piece_bytes = piece;
      fo.pipelined = pipelined;
      std::vector<uint8_t> dst(nb + 64, 0xEE);  // guard bytes after the tensor
      Status fs = fetch_partitioned(st, c, key, dst.data(), desc, fo);
      ok_or_die(fs, "fetch " + key + " piece " + std::to_string(piece));
      expect(nb == 0 || std::memcmp(dst.data(), full.data(), nb) == 0,
             "bytes of " + key + " piece " + std::to_string(piece) +
                 (pipelined ? " pipelined" : " sequential"));
      bool guard = true;
      for (uint64_t i = nb; i < nb + 64; ++i) guard &= dst[i] == 0xEE;
      expect(guard, "no write past the end of dst for " + key);
    }
  }
}

void check_roundtrips(Store& st, Communicator& c) {
  const int n = c.size();
  struct Case {
    DType dtype;
    std::vector<int64_t> shape;
  };
  const int64_t N = n;
  std::vector<Case> cases = {
      {DType::kFloat32, {0}},            // empty
      {DType::kFloat32, {1}},            // smaller than N (for N > 1)
      {DType::kFloat64, {N > 1 ? N - 1 : 1}},
      {DType::kInt8, {N}},               // exactly one element each
      {DType::kFloat16, {N + 1}},        // not divisible
      {DType::kBFloat16, {3, 5, 7}},     // 105 elements, multi-dim
      {DType::kInt64, {7 * N + 3}},
      {DType::kUInt8, {4096 * N}},       // divisible: zero-copy path with one piece
      {DType::kFloat32, {50001}},        // 200 KB: many 4 KiB pieces
      {DType::kInt32, {16, 4096 * N}},   // divisible, multi-piece
      {DType::kBool, {}},                // scalar
  };
  int i = 0;
  for (const auto& cs : cases) {
    TensorDesc d{cs.dtype, cs.shape};
    std::string key = "t" + std::to_string(i) + "_" + std::string(dtype_name(cs.dtype));
    roundtrip(st, c, key, d, 1000 + i, /*slice_put=*/i % 2 == 1, {4096, 49152, 8ull << 20});
    ++i;
  }
}

void check_errors(Store& st, Communicator& c) {
  const int n = c.size(), r = c.rank();
  // Existing key without overwrite: AlreadyExists locally, agreed by every rank.
  std::vector<float> v(10 * n + 1, 1.5f);
  TensorDesc d{DType::kFloat32, {static_cast<int64_t>(v.size())}};
  ok_or_die(put_partitioned(st, c, "e1", v.data(), d), "put e1");
  Status again = put_partitioned(st, c, "e1", v.data(), d);
  expect(again.code() == StatusCode::kAlreadyExists, "second put without overwrite: " + again.to_string());
  PartitionOptions ow;
  ow.put.overwrite = true;
  for (auto& x : v) x = 2.5f;
  ok_or_die(put_partitioned(st, c, "e1", v.data(), d, ow), "overwrite e1");
  std::vector<float> back(v.size(), 0);
  ok_or_die(fetch_partitioned(st, c, "e1", back.data(), d), "fetch e1");
  expect(back == v, "overwritten values");

  // Wrong desc at fetch: InvalidArgument on every rank, naming both.
  TensorDesc wrong{DType::kInt32, d.shape};
  Status ws = fetch_partitioned(st, c, "e1", back.data(), wrong);
  expect(ws.code() == StatusCode::kInvalidArgument && ws.message().find("is fp32[") != std::string::npos &&
             ws.message().find("fetched as int32[") != std::string::npos,
         "desc mismatch: " + ws.to_string());

  // One rank lacks the object: that rank NotFound, the others Unavailable naming it.
  const int victim = n - 1;
  if (r == victim) ok_or_die(remove_partitioned(st, "e1"), "remove_partitioned");
  Status mf = fetch_partitioned(st, c, "e1", back.data(), d);
  if (r == victim) {
    expect(mf.code() == StatusCode::kNotFound, "missing on the victim: " + mf.to_string());
  } else {
    expect(mf.code() == StatusCode::kUnavailable &&
               mf.message().find("rank " + std::to_string(victim) + " failed") != std::string::npos &&
               mf.message().find("NotFound") != std::string::npos,
           "missing elsewhere: " + mf.to_string());
  }
  // The communicator is still healthy after an agreed error.
  expect(c.barrier().ok(), "barrier after agreed errors");
}

// Reduce-scatter: rank q's gradient element i is (q + 1) * (i % 97) - 3 * q; the sum over
// q in [0, N) is (i % 97) * N(N+1)/2 - 3 * N(N-1)/2, exact in fp32 and int32.
void check_reduce_scatter(Communicator& c) {
  const int n = c.size(), r = c.rank();
  const int64_t tri = int64_t{n} * (n + 1) / 2, tri0 = 3 * int64_t{n} * (n - 1) / 2;
  for (uint64_t numel : {uint64_t{0}, uint64_t{1}, uint64_t(n + 1), uint64_t(4 * n),
                         uint64_t{10007}, uint64_t(3000 * n)}) {
    auto l = partition_layout(numel, n);
    const uint64_t own = l->owned_numel(r), b = l->begin(r);
    for (uint64_t piece : {uint64_t{1} << 12, uint64_t{8} << 20}) {
      std::vector<float> g(numel), out(own + 1, -7.0f);
      std::vector<int32_t> gi(numel), outi(own + 1, -7);
      for (uint64_t i = 0; i < numel; ++i) {
        g[i] = static_cast<float>((r + 1) * static_cast<int64_t>(i % 97) - 3 * r);
        gi[i] = static_cast<int32_t>(g[i]);
      }
      ok_or_die(reduce_scatter_grads(c, g.data(), out.data(), numel, DType::kFloat32,
                                     ReduceOp::kSum, piece),
                "reduce_scatter_grads fp32");
      ok_or_die(reduce_scatter_grads(c, gi.data(), outi.data(), numel, DType::kInt32,
                                     ReduceOp::kSum, piece),
                "reduce_scatter_grads int32");
      bool good = out[own] == -7.0f && outi[own] == -7;  // nothing written past the slice
      for (uint64_t j = 0; j < own; ++j) {
        int64_t want = static_cast<int64_t>((b + j) % 97) * tri - tri0;
        good &= out[j] == static_cast<float>(want) && outi[j] == want;
      }
      expect(good, "reduce_scatter_grads numel " + std::to_string(numel) + " piece " +
                       std::to_string(piece));
    }
  }
  // Max, fp64.
  const uint64_t numel = 2 * n + 1;
  auto l = partition_layout(numel, n);
  std::vector<double> g(numel), out(l->owned_numel(r));
  for (uint64_t i = 0; i < numel; ++i) g[i] = static_cast<double>((i * 7 + r * 13) % 17);
  ok_or_die(reduce_scatter_grads_async(c, g.data(), out.data(), numel, DType::kFloat64, ReduceOp::kMax)
                .result()
                .status(),
            "reduce_scatter_grads max");
  bool good = true;
  for (uint64_t j = 0; j < out.size(); ++j) {
    double want = 0;
    for (int q = 0; q < n; ++q)
      want = std::max(want, static_cast<double>(((l->begin(r) + j) * 7 + q * 13) % 17));
    good &= out[j] == want;
  }
  expect(good, "reduce_scatter_grads max fp64");
}

int run_check(const std::string& dir) {
  auto c = make_comm();
  auto st = open_store(dir, c->rank());
  auto l = partition_layout(10, 4);
  expect(l->chunk_numel == 3 && l->begin(3) == 9 && l->end(3) == 10, "layout 10/4");
  check_roundtrips(*st, *c);
  check_errors(*st, *c);
  check_reduce_scatter(*c);
  ok_or_die(st->close(), "close");
  print_checks_passed();
  return 0;
}

const TensorDesc kW{DType::kFloat32, {1000}};

int run_put(const std::string& dir) {
  auto c = make_comm();
  auto st = open_store(dir, c->rank());
  std::vector<uint8_t> full = full_pattern(7, kW.nbytes());
  ok_or_die(put_partitioned(*st, *c, "w", full.data(), kW), "put w");
  ok_or_die(st->close(), "close");
  return 0;
}

int run_refetch(const std::string& dir) {
  auto c = make_comm();
  auto st = open_store(dir, c->rank());
  std::vector<uint8_t> dst(kW.nbytes());
  Status s = fetch_partitioned(*st, *c, "w", dst.data(), kW);
  if (s.ok()) {
    expect(dst == full_pattern(7, kW.nbytes()), "refetched bytes");
    std::printf("FETCHED_OK\n");
  } else {
    print_expected_failure(s);
  }
  std::fflush(stdout);
  return 0;
}

int run_killed(const std::string& dir) {
  auto opts = communicator_options_from_env();
  ok_or_die(opts.status(), "options");
  auto c = make_comm();
  auto st = open_store(dir, c->rank());
  const int victim = c->size() - 1;
  TensorDesc d{DType::kFloat32, {1 << 20}};
  std::vector<uint8_t> full = full_pattern(3, d.nbytes()), dst(d.nbytes());
  ok_or_die(put_partitioned(*st, *c, "k", full.data(), d), "put k");
  ok_or_die(c->barrier(), "barrier");
  if (c->rank() == victim) raise(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  Status s;
  PartitionOptions po;
  po.piece_bytes = 64 << 10;
  for (int i = 0; i < 100 && s.ok(); ++i)
    s = fetch_partitioned(*st, *c, "k", dst.data(), d, po);
  const long long ms = ms_since(t0);
  if (s.ok()) die("fetch kept succeeding with rank " + std::to_string(victim) + " gone");
  print_expected_failure(s, ms);
  // Rank 0 hosts the rendezvous store: keep it until every survivor has diagnosed. A
  // survivor that was not talking to the victim may only notice through the collective
  // timeout, one timeout after the others: wait for it well past that.
  ok_or_die(c->store().barrier("survivors", c->size() - 1, 3 * opts->timeout),
            "survivor barrier");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: partition_worker check|put|refetch|killed DIR\n");
    return 2;
  }
  std::string mode = argv[1], dir = argv[2];
  if (mode == "check") return run_check(dir);
  if (mode == "put") return run_put(dir);
  if (mode == "refetch") return run_refetch(dir);
  if (mode == "killed") return run_killed(dir);
  std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
  return 2;
}
