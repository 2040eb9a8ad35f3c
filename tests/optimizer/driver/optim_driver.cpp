// Test-only driver: runs the real strata optimizer kernels on data from files, so that
// tests/optimizer/test_torch_parity.py can compare them with torch.optim step by step.
//
//   optim_driver --optimizer adam --numel N --steps S --params p.bin --grads g.bin
//                --out out.bin [hyperparameters] [--grad-dtype fp32|fp16|bf16]
//                [--threads T] [--chunks K] [--arithmetic simd|torch]
// p.bin: N fp32; g.bin: S*N gradients of --grad-dtype (step-major); out.bin: the N final
// fp32 params followed by each state stream (N fp32 each, in rule.state_name() order).
// --chunks K updates each step in K sub-groups (apply_update per chunk, one step count).
// --arithmetic torch (adam, adamw): make_torch_exact_adam instead of the SIMD make_adam.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "strata/base/dtype.hpp"
#include "strata/optimizer/optimizers.hpp"
#include "strata/base/thread_pool.hpp"
#include "strata/optimizer/update.hpp"

namespace opt = strata::optimizer;

namespace {

bool read_file(const std::string& path, void* dst, size_t nbytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in.read(static_cast<char*>(dst), static_cast<std::streamsize>(nbytes))) {
    std::fprintf(stderr, "optim_driver: cannot read %zu bytes from %s\n", nbytes, path.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata optimizer test driver"};
  std::string optimizer = "adam", params_path, grads_path, out_path, grad_dtype = "fp32";
  std::string arithmetic = "simd";
  size_t numel = 0;
  int steps = 1, threads = 1, chunks = 1;
  opt::AdamOptions adam;
  opt::AdagradOptions adagrad;
  opt::SgdOptions sgd;
  opt::LionOptions lion;
  double lr = -1, weight_decay = -1, eps = -1, beta1 = -1, beta2 = -1;
  bool maximize = false;
  app.add_option("--optimizer", optimizer)->required();
  app.add_option("--numel", numel)->required();
  app.add_option("--steps", steps);
  app.add_option("--params", params_path)->required();
  app.add_option("--grads", grads_path)->required();
  app.add_option("--out", out_path)->required();
  app.add_option("--grad-dtype", grad_dtype);
  app.add_option("--threads", threads);
  app.add_option("--chunks", chunks);
  app.add_option("--arithmetic", arithmetic)->check(CLI::IsMember({"simd", "torch"}));
  app.add_option("--lr", lr);
  app.add_option("--weight-decay", weight_decay);
  app.add_option("--eps", eps);
  app.add_option("--beta1", beta1);
  app.add_option("--beta2", beta2);
  app.add_flag("--maximize", maximize);
  app.add_flag("--amsgrad", adam.amsgrad);
  app.add_option("--lr-decay", adagrad.lr_decay);
  app.add_option("--initial-accumulator-value", adagrad.initial_accumulator_value);
  app.add_option("--momentum", sgd.momentum);
  app.add_option("--dampening", sgd.dampening);
  app.add_flag("--nesterov", sgd.nesterov);
  CLI11_PARSE(app, argc, argv);

  auto set = [](double v, double& field) {
    if (v >= 0) field = v;
  };
  strata::Result<std::unique_ptr<opt::UpdateRule>> rule = strata::invalid_argument("optimizer");
  if (optimizer == "adam" || optimizer == "adamw") {
    set(lr, adam.lr);
    set(weight_decay, adam.weight_decay);
    set(eps, adam.eps);
    set(beta1, adam.beta1);
    set(beta2, adam.beta2);
    adam.maximize = maximize;
    adam.decoupled_weight_decay = optimizer == "adamw";
    rule = arithmetic == "torch" ? opt::make_torch_exact_adam(adam) : opt::make_adam(adam);
  } else if (arithmetic == "torch") {
    rule = strata::invalid_argument("--arithmetic torch is for adam and adamw");
  } else if (optimizer == "adagrad") {
    set(lr, adagrad.lr);
    set(weight_decay, adagrad.weight_decay);
    set(eps, adagrad.eps);
    adagrad.maximize = maximize;
    rule = opt::make_adagrad(adagrad);
  } else if (optimizer == "sgd") {
    set(lr, sgd.lr);
    set(weight_decay, sgd.weight_decay);
    sgd.maximize = maximize;
    rule = opt::make_sgd(sgd);
  } else if (optimizer == "lion") {
    set(lr, lion.lr);
    set(weight_decay, lion.weight_decay);
    set(beta1, lion.beta1);
    set(beta2, lion.beta2);
    lion.maximize = maximize;
    rule = opt::make_lion(lion);
  }
  if (!rule.ok()) {
    std::fprintf(stderr, "optim_driver: %s\n", rule.status().to_string().c_str());
    return 2;
  }
  auto gt = strata::parse_dtype(grad_dtype);
  if (!gt.ok()) {
    std::fprintf(stderr, "optim_driver: %s\n", gt.status().to_string().c_str());
    return 2;
  }
  const size_t gsize = strata::dtype_size(*gt);
  const int ns = (*rule)->num_states();
  std::vector<float> p(numel);
  std::vector<char> grads(static_cast<size_t>(steps) * numel * gsize);
  std::vector<std::vector<float>> st(ns, std::vector<float>(numel));
  if (!read_file(params_path, p.data(), numel * 4)) return 1;
  if (!read_file(grads_path, grads.data(), grads.size())) return 1;
  auto pool = strata::ThreadPool::create(threads);
  if (!pool.ok()) {
    std::fprintf(stderr, "optim_driver: %s\n", pool.status().to_string().c_str());
    return 1;
  }
  opt::UpdateSpans spans;
  spans.param = p.data();
  spans.grad_type = *gt;
  for (int k = 0; k < ns; ++k) spans.states[k] = st[k].data();
  spans.numel = numel;
  if (auto s = opt::init_states(**rule, spans, pool->get()); !s.ok()) return 1;
  opt::ParamState state;
  for (int t = 0; t < steps; ++t) {
    spans.grad = grads.data() + static_cast<size_t>(t) * numel * gsize;
    const opt::StepInfo info{state.advance(), 1.0f};
    const size_t chunk = (numel + chunks - 1) / std::max(chunks, 1);
    for (size_t b = 0; b < numel; b += chunk) {
      const size_t n = std::min(chunk, numel - b);
      if (auto s = opt::apply_update(**rule, spans.slice(b, n), info, pool->get()); !s.ok()) {
        std::fprintf(stderr, "optim_driver: %s\n", s.to_string().c_str());
        return 1;
      }
    }
  }
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(numel * 4));
  for (auto& s : st) out.write(reinterpret_cast<const char*>(s.data()), static_cast<std::streamsize>(numel * 4));
  if (!out) {
    std::fprintf(stderr, "optim_driver: cannot write %s\n", out_path.c_str());
    return 1;
  }
  return 0;
}
