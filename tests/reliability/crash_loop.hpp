// The crash loop's workload (tests/reliability/test_crash_loop.cpp and its child,
// crash_child/crash_loop_child.cpp): a deterministic sequence of store and optimizer
// operations drawn from a seed, and the model of what each prefix of it has committed.
//
// The child runs the operations in order against a real store and prints "C <i>" once
// operation i has returned; the parent replays the same sequence on this model, so after a
// SIGKILL it knows the committed state after the last reported operation (A) and after the
// one that may have been in flight (B), and the reopened store must equal one of them whole.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/store_options.hpp"
#include "optimizer/offload_test_util.hpp"
#include "store/test_store_util.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/store/store.hpp"

namespace strata::crash_loop {

/// Keys of the store part: kv/0 .. kv/(kKeys-1). The optimizer lives under "optim/".
inline constexpr int kKeys = 10;
/// The store: 1 MiB chunks, 16 MiB host tier, 2 workers.
inline StoreOptions store_options(const std::string& path) {
  return strata::testing::test_store_options(path, 16ull << 20, 1ull << 20, 2);
}

/// The optimizer's tensors (numel, NVMe or host) and the gradient of tensor t at step s.
inline constexpr uint64_t kParamNumel[3] = {300007, 20000, 2 * 262144};
inline constexpr bool kParamOnHost[3] = {false, true, false};

/// Deterministic bytes (the store tests' pattern()).
inline std::vector<uint8_t> bytes_of(uint64_t n, uint64_t seed) { return store_test::pattern(n, seed); }

/// Deterministic floats in [-scale/2, scale/2) (the optimizer tests' values()).
inline std::vector<float> floats_of(uint64_t n, uint64_t seed, float scale) {
  return optimizer::offload_test::values(seed, n, -0.5f * scale, 0.5f * scale);
}

/// The value of the environment variable `name` as a number, `dflt` when unset or empty.
inline uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}

/// FNV-1a 64 of `n` bytes, continuing from `h`.
inline uint64_t fnv1a(const void* p, uint64_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (uint64_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/// The optimizer's options (child and parent open it alike).
inline optimizer::OffloadOptions offload_options() {
  optimizer::OffloadOptions oo;
  oo.sub_group_numel = 65536;
  oo.num_buffers = 3;
  oo.num_threads = 2;
  return oo;
}

/// FNV-1a of every master and state of the three tensors, in order.
inline Result<uint64_t> optimizer_hash(optimizer::OffloadedOptimizer& opt) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t t = 0; t < 3; ++t) {
    std::vector<float> v(kParamNumel[t]);
    STRATA_RETURN_IF_ERROR(opt.read_param(t, v.data()));
    h = fnv1a(v.data(), v.size() * 4, h);
    for (int k = 0; k < opt.num_states(); ++k) {
      STRATA_RETURN_IF_ERROR(opt.read_state(t, k, v.data()));
      h = fnv1a(v.data(), v.size() * 4, h);
    }
  }
  return h;
}

enum class OpKind { kPut, kOverwrite, kWriteRange, kRemove, kFlush, kStep, kCheckpoint };

inline const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kPut: return "put";
    case OpKind::kOverwrite: return "overwrite";
    case OpKind::kWriteRange: return "write_range";
    case OpKind::kRemove: return "remove";
    case OpKind::kFlush: return "flush";
    case OpKind::kStep: return "step";
    case OpKind::kCheckpoint: return "checkpoint";
  }
  return "?";
}

struct Op {
  OpKind kind = OpKind::kFlush;
  std::string key;
  uint64_t size = 0;    // put/overwrite: object size; write_range: length
  uint64_t offset = 0;  // write_range
  uint64_t seed = 0;    // the bytes: bytes_of(size, seed)
};

/// What the store holds: each key's current bytes (with write_range updates not yet
/// flushed) and its committed bytes (what a reopen after a crash finds), and the
/// optimizer's step count and checkpointed step.
struct State {
  std::map<std::string, std::vector<uint8_t>> current, committed;
  int64_t steps = 0, checkpointed = 0;
};

/// Draws operation after operation from `seed`, each valid in the state the previous
/// ones left, and applies it to the model.
class Workload {
 public:
  explicit Workload(uint64_t seed) : rng_(seed) {}

  const State& state() const { return s_; }

  Op next() {
    Op op;
    const int dice = static_cast<int>(pick(100));
    const std::string key = "kv/" + std::to_string(pick(kKeys));
    const bool present = s_.current.count(key) != 0;
    op.key = key;
    op.seed = rng_();
    if (dice < 12) {
      op.kind = OpKind::kStep;
    } else if (dice < 18) {
      op.kind = OpKind::kCheckpoint;
    } else if (dice < 24) {
      op.kind = OpKind::kFlush;
    } else if (!present || dice < 40) {
      op.kind = present ? OpKind::kOverwrite : OpKind::kPut;
      op.size = pick_size();
    } else if (dice < 80) {
      op.kind = OpKind::kWriteRange;
      const uint64_t n = s_.current[key].size();
      op.offset = pick(n);
      op.size = 1 + pick(std::min<uint64_t>(n - op.offset, 1500000));
    } else {
      op.kind = OpKind::kRemove;
    }
    apply(op);
    return op;
  }

 private:
  uint64_t pick(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  // Sizes from 1 byte to ~2.6 MiB: odd tails, one chunk, several chunks, aligned or not.
  uint64_t pick_size() {
    switch (pick(4)) {
      case 0: return 1 + pick(8191);
      case 1: return (1 + pick(3)) << 20;
      default: return 1 + pick(2700000);
    }
  }
  void apply(const Op& op) {
    switch (op.kind) {
      case OpKind::kPut:
      case OpKind::kOverwrite:
        s_.current[op.key] = bytes_of(op.size, op.seed);
        s_.committed[op.key] = s_.current[op.key];
        break;
      case OpKind::kWriteRange: {
        auto b = bytes_of(op.size, op.seed);
        std::memcpy(s_.current[op.key].data() + op.offset, b.data(), b.size());
        break;
      }
      case OpKind::kRemove:
        s_.current.erase(op.key);
        s_.committed.erase(op.key);
        break;
      case OpKind::kFlush: s_.committed = s_.current; break;
      case OpKind::kStep: ++s_.steps; break;
      case OpKind::kCheckpoint: s_.checkpointed = s_.steps; break;
    }
  }

  std::mt19937_64 rng_;
  State s_;
};

/// Adds two parameters to `opt` (70001 elements in NVMe, 20000 in DRAM) and attaches
/// constant gradients kept in `grads` (which must outlive the steps). Used by the tests
/// that step an optimizer beside other work (concurrency, resources).
inline Status add_two_params(optimizer::OffloadedOptimizer& opt,
                             std::vector<std::vector<float>>& grads) {
  const uint64_t numel[2] = {70001, 20000};
  grads.assign(2, {});
  for (uint32_t t = 0; t < 2; ++t) {
    auto init = floats_of(numel[t], t, 2.0f);
    STRATA_RETURN_IF_ERROR(opt.add_param("p" + std::to_string(t), numel[t], init.data(), 0,
                                         t ? optimizer::Placement::kHost
                                           : optimizer::Placement::kNvme)
                               .status());
    grads[t] = floats_of(numel[t], 10 + t, 0.2f);
    STRATA_RETURN_IF_ERROR(opt.set_grad(t, grads[t].data(), DType::kFloat32));
  }
  return Status::OK();
}

}  // namespace strata::crash_loop
