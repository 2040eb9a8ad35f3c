// The C++ guide's example (docs/guide-cpp.md): a store with its tiers, and an offloaded
// Adam whose state lives in the store's NVMe tier. Run: guide_store_cpp DIR (DIR is created;
// the store it holds is left there). Exit status 0 when every check holds.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "strata/optimizer/offload.hpp"
#include "strata/store/store.hpp"

namespace {
int fail(const char* what, const strata::Status& st) {
  std::fprintf(stderr, "%s: %s\n", what, st.to_string().c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  // [open]
  strata::StoreOptions so;
  so.path = argv[1];                  // catalog + data file (one NVMe directory)
  so.host_budget_bytes = 64ull << 20; // pinned DRAM of the host tier
  so.staging_bytes = 16ull << 20;
  so.chunk_bytes = 1ull << 20;
  auto opened = strata::Store::open(so);
  if (!opened.ok()) return fail("open", opened.status());
  std::shared_ptr<strata::Store> store = std::move(opened).value();
  // [open]

  // [put-get]
  std::vector<float> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * static_cast<float>(i);
  const strata::TensorDesc desc{strata::DType::kFloat32, {10, 100}};
  strata::PutOptions po;
  po.tier = strata::Tier::kNvme;      // durable when put() returns (O_DIRECT + fdatasync)
  po.overwrite = true;
  if (auto st = store->put("layer0/w", w.data(), desc, po); !st.ok()) return fail("put", st);
  std::vector<float> back(1000);
  if (auto st = store->get("layer0/w", back.data(), desc); !st.ok()) return fail("get", st);
  if (back != w) return fail("get", strata::internal_error("read back other values"));
  // [put-get]

  // [tiers]
  if (auto st = store->move("layer0/w", strata::Tier::kHost); !st.ok()) return fail("move", st);
  auto info = store->stat("layer0/w");
  if (!info.ok()) return fail("stat", info.status());
  std::printf("layer0/w: %s, %llu bytes, tier %s, NVMe copy %d\n", strata::to_string(desc).c_str(),
              static_cast<unsigned long long>(info->nbytes),
              std::string(strata::tier_name(info->tier)).c_str(), info->on_nvme ? 1 : 0);
  if (info->tier != strata::Tier::kHost || !info->on_nvme) {
    return fail("stat", strata::internal_error("expected host tier with an NVMe copy"));
  }
  // Asynchronous form: every x() has an x_async() returning a Future.
  auto evicted = store->evict_async("layer0/w");
  if (auto st = evicted.result().status(); !st.ok()) return fail("evict", st);
  // [tiers]

  // [optimizer]
  namespace opt = strata::optimizer;
  auto factory = opt::builtin_rule_factory("adam");
  if (!factory.ok()) return fail("factory", factory.status());
  opt::OffloadOptions oo;
  oo.key_prefix = "optim/";
  oo.default_placement = opt::Placement::kNvme;  // masters and moments in the NVMe tier
  oo.pinned_budget_bytes = 32ull << 20;
  auto created = opt::OffloadedOptimizer::create(store, *factory, {{"lr", 1e-3}}, oo);
  if (!created.ok()) return fail("create optimizer", created.status());
  auto adam = std::move(created).value();
  auto h = adam->add_param("w", 4096, nullptr);  // 4096 fp32 zeros
  if (!h.ok()) return fail("add_param", h.status());
  std::vector<float> grad(4096, 1.0f);
  if (auto st = adam->set_grad(*h, grad.data(), strata::DType::kFloat32); !st.ok()) {
    return fail("set_grad", st);
  }
  for (int step = 0; step < 2; ++step) {
    auto stats = adam->step();
    if (!stats.ok()) return fail("step", stats.status());
  }
  if (auto st = adam->checkpoint(); !st.ok()) return fail("checkpoint", st);
  float p = 0.0f;
  if (auto st = adam->read_param(*h, &p, 0, 1); !st.ok()) return fail("read_param", st);
  // Adam with a constant gradient g: each step moves p by -lr * g / (|g| + eps).
  std::printf("w[0] after 2 Adam steps: %.6f (expected -0.002000)\n", p);
  if (std::fabs(p + 0.002f) > 1e-6f) return fail("adam", strata::internal_error("wrong value"));
  // [optimizer]
  adam.reset();
  if (auto st = store->close(); !st.ok()) return fail("close", st);
  std::printf("guide_store: OK\n");
  return 0;
}
