// A framework's use of the installed strata C++ libraries: a store, an offloaded optimizer
// with the framework's own element-wise rule (SGD with momentum, torch.optim.SGD's rule with
// dampening 0), three steps on two tensors compared bit for bit with the same arithmetic in a
// loop, a checkpoint and a resume. Built as a program (strata_optimizer_consumer DIR) and,
// with STRATA_CONSUMER_PLUGIN, as a shared plugin exporting strata_consumer_train(dir) that a
// C host loads with dlopen (plugin_host.c).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "strata/optimizer/offload.hpp"
#include "strata/optimizer/update.hpp"
#include "strata/store/store.hpp"

namespace {

namespace so = strata::optimizer;

void sgdm(float* p, float* buf, float g, int64_t step, float lr, float mom) {
  *buf = step == 1 ? g : mom * *buf + g;
  *p = *p - lr * *buf;
}

class Sgdm final : public so::UpdateRule {
 public:
  Sgdm(float lr, float mom) : lr_(lr), mom_(mom) {}
  std::string_view name() const override { return "consumer_sgdm"; }
  int num_states() const override { return 1; }
  std::string_view state_name(int) const override { return "momentum_buffer"; }
  void update(const so::UpdateSpans& s, const so::StepInfo& info) const override {
    const float* g = static_cast<const float*>(s.grad);
    for (size_t i = 0; i < s.numel; ++i) sgdm(&s.param[i], &s.states[0][i], g[i], info.step, lr_, mom_);
  }

 private:
  float lr_, mom_;
};

so::RuleFactory sgdm_factory() {
  return [](const so::Hyperparams& hp) -> strata::Result<std::unique_ptr<so::UpdateRule>> {
    auto get = [&](const char* k, double d) {
      auto it = hp.find(k);
      return static_cast<float>(it == hp.end() ? d : it->second);
    };
    return std::unique_ptr<so::UpdateRule>(new Sgdm(get("lr", 0.1), get("momentum", 0.9)));
  };
}

int fail(const char* what, const strata::Status& st) {
  std::printf("%s: %s\n", what, st.to_string().c_str());
  return 1;
}

float init_of(int t, size_t i) { return static_cast<float>((i * 7 + t * 3) % 89) / 41.0f - 1.0f; }
float grad_of(int t, int s, size_t i) {
  return static_cast<float>((i * 31 + s * 17 + t * 11) % 101) / 67.0f - 0.75f;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int strata_consumer_train(const char* dir) {
  constexpr size_t kNumel[2] = {5000, 123};
  constexpr int kSteps = 3;
  strata::StoreOptions opts;
  opts.path = dir;
  opts.host_budget_bytes = 8ull << 20;
  opts.staging_bytes = 4ull << 20;
  opts.chunk_bytes = 64ull << 10;
  auto opened = strata::Store::open(opts);
  if (!opened.ok()) return fail("open", opened.status());
  std::shared_ptr<strata::Store> store = std::move(opened).value();
  so::OffloadOptions oo;
  oo.default_placement = so::Placement::kNvme;
  oo.sub_group_numel = 1024;
  oo.pinned_budget_bytes = 4ull << 20;
  std::vector<float> ref_p[2], ref_m[2], g[2];
  {
    auto created = so::OffloadedOptimizer::create(store, sgdm_factory(), {{"lr", 0.05}}, oo);
    if (!created.ok()) return fail("create", created.status());
    auto opt = std::move(created).value();
    for (int t = 0; t < 2; ++t) {
      ref_p[t].resize(kNumel[t]);
      ref_m[t].assign(kNumel[t], 0.0f);
      g[t].resize(kNumel[t]);
      for (size_t i = 0; i < kNumel[t]; ++i) ref_p[t][i] = init_of(t, i);
      auto h = opt->add_param(t == 0 ? "w" : "b", kNumel[t], ref_p[t].data());
      if (!h.ok()) return fail("add_param", h.status());
    }
    for (int s = 1; s <= kSteps; ++s) {
      for (int t = 0; t < 2; ++t) {
        for (size_t i = 0; i < kNumel[t]; ++i) g[t][i] = grad_of(t, s, i);
        if (auto st = opt->set_grad(t, g[t].data(), strata::DType::kFloat32); !st.ok())
          return fail("set_grad", st);
        for (size_t i = 0; i < kNumel[t]; ++i) sgdm(&ref_p[t][i], &ref_m[t][i], g[t][i], s, 0.05f, 0.9f);
      }
      auto stats = opt->step();
      if (!stats.ok()) return fail("step", stats.status());
    }
    if (auto st = opt->close(); !st.ok()) return fail("close", st);  // checkpoints
  }
  auto reopened = so::OffloadedOptimizer::open(store, sgdm_factory(), oo);
  if (!reopened.ok()) return fail("open optimizer", reopened.status());
  auto opt = std::move(reopened).value();
  for (int t = 0; t < 2; ++t) {
    std::vector<float> p(kNumel[t]), m(kNumel[t]);
    if (auto st = opt->read_param(t, p.data()); !st.ok()) return fail("read_param", st);
    if (auto st = opt->read_state(t, 0, m.data()); !st.ok()) return fail("read_state", st);
    auto step = opt->step_count(t);
    if (std::memcmp(p.data(), ref_p[t].data(), p.size() * 4) != 0 ||
        std::memcmp(m.data(), ref_m[t].data(), m.size() * 4) != 0 || !step.ok() || *step != kSteps) {
      std::printf("tensor %d differs from the reference after the resume\n", t);
      return 1;
    }
  }
  if (auto st = opt->close(); !st.ok()) return fail("close", st);
  if (auto st = store->close(); !st.ok()) return fail("close store", st);
  return 0;
}

#ifndef STRATA_CONSUMER_PLUGIN
int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("usage: %s DIR\n", argv[0]);
    return 2;
  }
  const int rc = strata_consumer_train(argv[1]);
  if (rc == 0) std::printf("optimizer consumer ok\n");
  return rc;
}
#endif
