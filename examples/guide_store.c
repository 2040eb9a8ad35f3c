/* The C guide's example (docs/guide-c.md): a store with its tiers, an offloaded Adam
 * whose state lives in the store's NVMe tier, and a custom update rule (Lion) written in C.
 * Run: guide_store_c DIR (DIR is created; the store it holds is left there). Exit status 0 when every check holds. C99. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/strata.h"

static int check(strata_status_t st, const char* what) {
  if (st != STRATA_OK) {
    fprintf(stderr, "%s: %s: %s\n", what, strata_status_name(st), strata_last_error());
    return 1;
  }
  return 0;
}

/* Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2) as
 * a custom rule: one call per span of elements; state stream 0 is the momentum. */
static strata_status_t lion_update(const strata_update_spans_t* s,
                                   const strata_update_info_t* info, void* user_data) {
  const float lr = (float)info->hyperparams[0], beta1 = (float)info->hyperparams[1];
  const float beta2 = (float)info->hyperparams[2], wd = (float)info->hyperparams[3];
  (void)user_data;
  for (uint64_t i = 0; i < s->numel; ++i) {
    float* m = &s->states[0][i];
    const float c = beta1 * *m + (1.0f - beta1) * s->grad[i];
    const float sign = (float)((c > 0.0f) - (c < 0.0f));
    s->param[i] = s->param[i] * (1.0f - lr * wd) - lr * sign;
    *m = beta2 * *m + (1.0f - beta2) * s->grad[i];
  }
  return STRATA_OK;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  /* [open] */
  strata_store_options_t so = STRATA_STORE_OPTIONS_INIT;
  so.path = argv[1];
  so.host_budget_bytes = 64u << 20;
  so.staging_bytes = 16u << 20;
  so.chunk_bytes = 1u << 20;
  strata_store_t* store = NULL;
  if (check(strata_store_open(&so, &store), "open")) return 1;
  /* [open] */

  /* [put-get] */
  static float w[1000], back[1000];
  for (int i = 0; i < 1000; ++i) w[i] = 0.5f * (float)i;
  const int64_t shape[2] = {10, 100};
  if (check(strata_store_put(store, "layer0/w", w, STRATA_FLOAT32, 2, shape, STRATA_TIER_NVME,
                             STRATA_PUT_OVERWRITE), "put")) return 1;
  if (check(strata_store_get(store, "layer0/w", back, sizeof back), "get")) return 1;
  for (int i = 0; i < 1000; ++i) {
    if (back[i] != w[i]) {
      fprintf(stderr, "get: element %d is %g, expected %g\n", i, back[i], w[i]);
      return 1;
    }
  }
  /* [put-get] */

  /* [tiers] */
  if (check(strata_store_move(store, "layer0/w", STRATA_TIER_HOST), "move")) return 1;
  strata_object_info_t info = STRATA_OBJECT_INFO_INIT;
  if (check(strata_store_stat(store, "layer0/w", &info), "stat")) return 1;
  printf("layer0/w: %llu bytes, tier %s, NVMe copy %d\n", (unsigned long long)info.nbytes,
         strata_tier_name(info.tier), info.on_nvme);
  if (info.tier != STRATA_TIER_HOST || !info.on_nvme) return 1;
  /* [tiers] */

  /* [optimizer] */
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  oo.optimizer = "adam";
  oo.lr = 1e-3;
  strata_optimizer_t* adam = NULL;
  if (check(strata_optimizer_create(store, &oo, 0, &adam), "optimizer_create")) return 1;
  uint32_t p = 0;
  if (check(strata_optimizer_add_param(adam, "w", 4096, NULL, STRATA_PLACEMENT_NVME, &p),
            "add_param")) return 1;
  static float grad[4096];
  for (int i = 0; i < 4096; ++i) grad[i] = 1.0f;
  if (check(strata_optimizer_set_grad(adam, p, grad, STRATA_FLOAT32), "set_grad")) return 1;
  for (int step = 0; step < 2; ++step) {
    strata_step_stats_t stats;
    if (check(strata_optimizer_step(adam, 0.0, 1.0f, &stats), "step")) return 1;
  }
  float p0 = 0.0f;
  if (check(strata_optimizer_read_param(adam, p, &p0, 0, 1), "read_param")) return 1;
  /* Adam with a constant gradient g: each step moves p by -lr * g / (|g| + eps). */
  printf("w[0] after 2 Adam steps: %.6f (expected -0.002000)\n", p0);
  if (fabsf(p0 + 0.002f) > 1e-6f) return 1;
  if (check(strata_optimizer_close(adam), "optimizer_close")) return 1; /* checkpoints */
  /* [optimizer] */
  static const char* const lion_states[1] = {"exp_avg"};
  static const char* const lion_hp[4] = {"lr", "beta1", "beta2", "weight_decay"};
  static const double lion_defaults[4] = {1e-4, 0.9, 0.99, 0.0};
  strata_rule_t lion = STRATA_RULE_INIT;
  lion.name = "lion_c";
  lion.num_states = 1;
  lion.state_names = lion_states;
  lion.num_hyperparams = 4;
  lion.hyperparam_names = lion_hp;
  lion.hyperparam_defaults = lion_defaults;
  lion.update = lion_update;
  strata_optimizer_options_t lo = STRATA_OPTIMIZER_OPTIONS_INIT;
  lo.rule = &lion;
  lo.key_prefix = "lion/"; /* beside the Adam optimizer's "optim/" in the same store */
  lo.lr = 1e-3;
  strata_optimizer_t* opt = NULL;
  if (check(strata_optimizer_create(store, &lo, 0, &opt), "optimizer_create(lion_c)")) return 1;
  uint32_t q = 0;
  if (check(strata_optimizer_add_param(opt, "v", 4096, NULL, STRATA_PLACEMENT_NVME, &q),
            "add_param")) return 1;
  if (check(strata_optimizer_set_grad(opt, q, grad, STRATA_FLOAT32), "set_grad")) return 1;
  for (int step = 0; step < 2; ++step) {
    if (check(strata_optimizer_step_with(opt, NULL, NULL), "step")) return 1;
  }
  float q0 = 0.0f, m0 = 0.0f;
  if (check(strata_optimizer_read_param(opt, q, &q0, 0, 1), "read_param")) return 1;
  if (check(strata_optimizer_read_state(opt, q, 0, &m0, 0, 1), "read_state")) return 1;
  /* Lion with g = 1 from p = 0: each step moves p by -lr; the momentum is 1 - beta2^2. */
  printf("v[0] after 2 Lion steps: %.6f (expected -0.002000), exp_avg %.4f\n", q0, m0);
  if (fabsf(q0 + 0.002f) > 1e-7f || fabsf(m0 - 0.0199f) > 1e-6f) return 1;
  if (check(strata_optimizer_close(opt), "optimizer_close")) return 1;
  /* [rule] */
  if (check(strata_store_close(store), "close")) return 1;
  printf("guide_store: OK\n");
  return 0;
}
