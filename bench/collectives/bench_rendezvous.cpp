// Micro-benchmarks of the rendezvous store (round trips over loopback TCP) and of a
// world-size-1 Gloo all-reduce (the fixed per-call cost of the communicator queue).
#include <benchmark/benchmark.h>

#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/launcher.hpp"
#include "strata/collectives/rendezvous.hpp"

namespace {

void BM_RendezvousSetGet(benchmark::State& state) {
  auto server = strata::RendezvousServer::start("127.0.0.1", 0);
  if (!server.ok()) return state.SkipWithError(server.status().to_string().c_str());
  auto client = strata::RendezvousClient::connect("127.0.0.1", (*server)->port());
  if (!client.ok()) return state.SkipWithError(client.status().to_string().c_str());
  std::string value(static_cast<size_t>(state.range(0)), 'x');
  for (auto _ : state) {
    if (!(*client)->set("k", value).ok()) return state.SkipWithError("set failed");
    auto v = (*client)->get("k");
    benchmark::DoNotOptimize(v);
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(BM_RendezvousSetGet)->Arg(16)->Arg(4096)->Arg(1 << 20)->UseRealTime();

void BM_RendezvousAdd(benchmark::State& state) {
  auto server = strata::RendezvousServer::start("127.0.0.1", 0);
  if (!server.ok()) return state.SkipWithError(server.status().to_string().c_str());
  auto client = strata::RendezvousClient::connect("127.0.0.1", (*server)->port());
  if (!client.ok()) return state.SkipWithError(client.status().to_string().c_str());
  for (auto _ : state) benchmark::DoNotOptimize((*client)->add("counter", 1));
}
BENCHMARK(BM_RendezvousAdd)->UseRealTime();

void BM_GlooAllReduceWorldOne(benchmark::State& state) {
  strata::DistributedEnv env;
  env.master_addr = "127.0.0.1";
  auto port = strata::find_free_port();
  if (!port.ok()) return state.SkipWithError("no free port");
  env.master_port = *port;
  auto comm = strata::create_communicator(env, strata::CommunicatorOptions{});
  if (!comm.ok()) return state.SkipWithError(comm.status().to_string().c_str());
  std::vector<float> a(static_cast<size_t>(state.range(0)), 1.0f), b(a.size());
  for (auto _ : state) {
    auto s = (*comm)->all_reduce(a.data(), b.data(), a.size(), strata::DType::kFloat32,
                                 strata::ReduceOp::kSum);
    if (!s.ok()) return state.SkipWithError(s.to_string().c_str());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}
BENCHMARK(BM_GlooAllReduceWorldOne)->Arg(1)->Arg(1 << 20)->UseRealTime();  // work runs on the queue thread

}  // namespace
