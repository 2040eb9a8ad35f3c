// Child of tests/reliability/test_crash_loop.cpp:
//
//   crash_loop_child DIR SEED [MAX_OPS]
//
// Opens (creates) the store at DIR with an offloaded AdamW optimizer over three tensors
// (two NVMe, one host) under "optim/", checkpoints it and prints "H 0 <hash>" and "R".
// Then runs Workload(SEED)'s operations one after the other (puts, overwrites, write_range,
// removes and flushes of kv/*, optimizer steps and checkpoints), printing "C <i>" (flushed)
// once operation i has returned, and before each checkpoint "H <step> <hash>": the FNV-1a
// of every master and state as the checkpoint will make them durable. Runs until killed, or
// MAX_OPS operations (then exits 0). Any error: a message on stderr and exit status 2.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "reliability/crash_loop.hpp"

using namespace strata;
using namespace strata::crash_loop;
using strata::optimizer::OffloadedOptimizer;

namespace {

[[noreturn]] void die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "crash_loop_child: %s: %s\n", what.c_str(), st.to_string().c_str());
  std::exit(2);
}

uint64_t hash_or_die(OffloadedOptimizer& opt) {
  auto h = optimizer_hash(opt);
  if (!h.ok()) die("reading the optimizer", h.status());
  return *h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: crash_loop_child DIR SEED [MAX_OPS]\n");
    return 2;
  }
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const uint64_t max_ops = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : ~0ull;
  auto sr = Store::open(store_options(argv[1]));
  if (!sr.ok()) die("Store::open", sr.status());
  std::shared_ptr<Store> store = std::move(sr).value();
  auto orr = OffloadedOptimizer::create(store, *optimizer::builtin_rule_factory("adamw"),
                                        {{"lr", 1e-2}, {"weight_decay", 0.05}},
                                        offload_options());
  if (!orr.ok()) die("OffloadedOptimizer::create", orr.status());
  std::unique_ptr<OffloadedOptimizer> opt = std::move(orr).value();
  std::vector<std::vector<float>> grads(3);
  for (uint32_t t = 0; t < 3; ++t) {
    auto init = floats_of(kParamNumel[t], 100 + t, 2.0f);
    auto h = opt->add_param("w" + std::to_string(t), kParamNumel[t], init.data(), 0,
                            kParamOnHost[t] ? optimizer::Placement::kHost
                                            : optimizer::Placement::kNvme);
    if (!h.ok()) die("add_param", h.status());
  }
  Status st = opt->checkpoint();
  if (!st.ok()) die("checkpoint", st);
  std::printf("H 0 %llu\nR\n", static_cast<unsigned long long>(hash_or_die(*opt)));
  std::fflush(stdout);

  Workload w(seed);
  for (uint64_t i = 0; i < max_ops; ++i) {
    const Op op = w.next();
    const auto desc = TensorDesc::bytes(op.size);
    switch (op.kind) {
      case OpKind::kPut:
      case OpKind::kOverwrite: {
        auto b = bytes_of(op.size, op.seed);
        PutOptions po;
        po.overwrite = op.kind == OpKind::kOverwrite;
        st = store->put(op.key, b.data(), desc, po);
        break;
      }
      case OpKind::kWriteRange: {
        auto b = bytes_of(op.size, op.seed);
        st = store->write_range(op.key, op.offset, op.size, b.data());
        break;
      }
      case OpKind::kRemove: st = store->remove(op.key); break;
      case OpKind::kFlush: st = store->flush(); break;
      case OpKind::kStep: {
        const int64_t s = w.state().steps;
        for (uint32_t t = 0; t < 3; ++t) {
          grads[t] = floats_of(kParamNumel[t], 1000 * (t + 1) + static_cast<uint64_t>(s), 1.0f);
          st = opt->set_grad(t, grads[t].data(), DType::kFloat32);
          if (!st.ok()) die("set_grad", st);
        }
        st = opt->step().status();
        break;
      }
      case OpKind::kCheckpoint:
        std::printf("H %lld %llu\n", static_cast<long long>(w.state().steps),
                    static_cast<unsigned long long>(hash_or_die(*opt)));
        std::fflush(stdout);
        st = opt->checkpoint();
        break;
    }
    if (!st.ok()) die(std::string("op ") + std::to_string(i) + " " + op_name(op.kind) + " " + op.key, st);
    std::printf("C %llu\n", static_cast<unsigned long long>(i));
    std::fflush(stdout);
  }
  opt.reset();
  st = store->close();
  if (!st.ok()) die("close", st);
  return 0;
}
