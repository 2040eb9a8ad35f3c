/* The C API's version-8 surface, as a C99 client uses it: strata_optimizer_options_t's
 * state_dtype (bf16 optimizer states). A custom C rule (SGD with momentum) with bf16 states
 * on the NVMe and host tiers is bit-identical to a plain loop that rounds the momentum
 * buffer to bf16 (nearest even) after every step, also across a close and resume; the
 * state objects take 2 bytes per element; the built-in AdamW moves exactly 8 bytes per
 * parameter each way per step with bf16 states and 12 with fp32; a resume with the other
 * dtype, a bad dtype, a struct from an older header and the configuration file's
 * "optimizer.state_dtype". */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "strata/strata.h"

enum { V8N = 5000, V8STEPS = 4, V8CHUNK_NUMEL = (64 << 10) / 4 };

/* fp32 -> bf16 -> fp32, round to nearest even (NaN -> 0x7FC0), as strata and torch. */
static float round_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    u = 0x7FC00000u;
  } else {
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
  }
  memcpy(&x, &u, sizeof x);
  return x;
}

/* torch.optim.SGD's momentum step (dampening 0), one element; rule and reference share it. */
static void v8_element(float* p, float* buf, float g, int64_t step, float lr, float mom) {
  *buf = step == 1 ? g : mom * *buf + g;
  *p = *p - lr * *buf;
}

static strata_status_t v8_update(const strata_update_spans_t* s, const strata_update_info_t* info,
                                 void* user_data) {
  const float lr = (float)info->hyperparams[0];
  const float mom = (float)info->hyperparams[1];
  uint64_t i;
  (void)user_data;
  for (i = 0; i < s->numel; ++i)
    v8_element(&s->param[i], &s->states[0][i], s->grad[i], info->step, lr, mom);
  return STRATA_OK;
}

static const char* const kV8States[1] = {"momentum_buffer"};
static const char* const kV8Hyper[2] = {"lr", "momentum"};
static const double kV8Defaults[2] = {0.05, 0.9};

static void v8_rule(strata_rule_t* r) {
  strata_rule_t init = STRATA_RULE_INIT;
  *r = init;
  r->name = "sgdm_c_v8";
  r->num_states = 1;
  r->state_names = kV8States;
  r->num_hyperparams = 2;
  r->hyperparam_names = kV8Hyper;
  r->hyperparam_defaults = kV8Defaults;
  r->update = v8_update;
}

static float v8_init(int t, int i) { return (float)(((i * 13 + t * 5) % 97) - 48) / 37.0f; }
static float v8_grad(int t, int s, int i) {
  return (float)(((i * 29 + s * 19 + t * 7) % 103) - 51) / 59.0f;
}

static strata_status_t v8_open(const char* dir, const char* config, strata_store_t** store) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  o.path = dir;
  o.host_budget_bytes = 16u << 20;
  o.staging_bytes = 8u << 20;
  o.chunk_bytes = 64u << 10;
  return config ? strata_store_open_config(config, &o, store) : strata_store_open(&o, store);
}

/* Two tensors: 0 on NVMe, 1 on the host tier; both V8N elements. */
typedef struct v8_ref {
  float p[2][V8N], buf[2][V8N];
  int64_t step;
} v8_ref_t;

static void v8_ref_step(v8_ref_t* r, int s) {
  int t, i;
  ++r->step;
  for (t = 0; t < 2; ++t) {
    for (i = 0; i < V8N; ++i) {
      v8_element(&r->p[t][i], &r->buf[t][i], v8_grad(t, s, i), r->step, 0.05f, 0.9f);
      r->buf[t][i] = round_bf16(r->buf[t][i]);
    }
  }
}

static void v8_step(strata_optimizer_t* opt, int s) {
  static float g[2][V8N];
  int t, i;
  for (t = 0; t < 2; ++t) {
    for (i = 0; i < V8N; ++i) g[t][i] = v8_grad(t, s, i);
    EXPECT_RC(strata_optimizer_set_grad(opt, (uint32_t)t, g[t], STRATA_FLOAT32), STRATA_OK);
  }
  EXPECT_RC(strata_optimizer_step(opt, 0.0, 1.0f, NULL), STRATA_OK);
}

/* 1 when masters and (widened) bf16 momentum buffers equal the reference bit for bit. */
static int v8_same(strata_optimizer_t* opt, const v8_ref_t* r) {
  static float out[V8N];
  int t, same = 1;
  for (t = 0; t < 2; ++t) {
    EXPECT_RC(strata_optimizer_read_param(opt, (uint32_t)t, out, 0, V8N), STRATA_OK);
    same &= memcmp(out, r->p[t], sizeof out) == 0;
    EXPECT_RC(strata_optimizer_read_state(opt, (uint32_t)t, 0, out, 0, V8N), STRATA_OK);
    same &= memcmp(out, r->buf[t], sizeof out) == 0;
  }
  return same;
}

/* nbytes of store object `key` (0 when absent). */
static uint64_t v8_nbytes(strata_store_t* store, const char* key) {
  strata_object_info_t info = STRATA_OBJECT_INFO_INIT;
  if (strata_store_stat(store, key, &info) != STRATA_OK) return 0;
  return info.nbytes;
}

/* The rule with bf16 states against the reference, across a close and a resume. */
static void v8_rule_bf16(const char* dir) {
  static v8_ref_t ref;
  strata_store_t* store = NULL;
  strata_optimizer_t* opt = NULL;
  strata_optimizer_options_t o = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_rule_t rule;
  uint32_t h = 99;
  int t, i, s;
  v8_rule(&rule);
  o.rule = &rule;
  o.sub_group_numel = 1024; /* 5 sub-groups, the last partial */
  o.state_dtype = STRATA_BFLOAT16;
  memset(&ref, 0, sizeof ref);
  for (t = 0; t < 2; ++t)
    for (i = 0; i < V8N; ++i) ref.p[t][i] = v8_init(t, i);
  EXPECT_RC(v8_open(dir, NULL, &store), STRATA_OK);
  if (store == NULL) return;
  EXPECT_RC(strata_optimizer_create(store, &o, 0, &opt), STRATA_OK);
  if (opt == NULL) {
    strata_store_close(store);
    return;
  }
  for (t = 0; t < 2; ++t) {
    char name[8];
    snprintf(name, sizeof name, "w%d", t);
    EXPECT_RC(strata_optimizer_add_param(opt, name, V8N, ref.p[t],
                                         t == 0 ? STRATA_PLACEMENT_NVME : STRATA_PLACEMENT_HOST,
                                         &h),
              STRATA_OK);
    EXPECT(h == (uint32_t)t);
  }
  for (s = 0; s < 2; ++s) {
    v8_step(opt, s);
    v8_ref_step(&ref, s);
  }
  EXPECT(v8_same(opt, &ref));
  EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
  opt = NULL;
  /* The state objects hold 2 bytes per element, the masters 4 (host tier: its backing). */
  EXPECT(v8_nbytes(store, "optim/p/w0/momentum_buffer") == 2u * V8N);
  EXPECT(v8_nbytes(store, "optim/p/w1/momentum_buffer") == 2u * V8N);
  EXPECT(v8_nbytes(store, "optim/p/w0/param") == 4u * V8N);
  /* A resume that leaves state_dtype unset (fp32 by default) is refused, naming both. */
  o.state_dtype = STRATA_UNDEF_INT;
  EXPECT_RC(strata_optimizer_create(store, &o, 1, &opt), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT(opt == NULL);
  EXPECT(LAST_ERROR_HAS("holds bf16 optimizer states, but OffloadOptions.state_dtype is fp32"));
  o.state_dtype = STRATA_FLOAT32;
  EXPECT_RC(strata_optimizer_create(store, &o, 1, &opt), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT(opt == NULL);
  /* With bf16 it continues bit-identically. */
  o.state_dtype = STRATA_BFLOAT16;
  EXPECT_RC(strata_optimizer_create(store, &o, 1, &opt), STRATA_OK);
  if (opt != NULL) {
    EXPECT(v8_same(opt, &ref));
    for (s = 2; s < V8STEPS; ++s) {
      v8_step(opt, s);
      v8_ref_step(&ref, s);
    }
    EXPECT(v8_same(opt, &ref));
    EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
  }
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

/* Store bytes of AdamW's second step on `n` NVMe parameters (sub-groups of whole chunks). */
static void v8_adamw_bytes(const char* dir, int state_dtype, uint64_t n, uint64_t* read,
                           uint64_t* written) {
  strata_store_t* store = NULL;
  strata_optimizer_t* opt = NULL;
  strata_optimizer_options_t o = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_step_stats_t st;
  float* g = (float*)calloc((size_t)n, sizeof(float));
  uint32_t h = 0;
  uint64_t i;
  *read = *written = 0;
  if (g == NULL) return;
  for (i = 0; i < n; ++i) g[i] = (float)((int)(i % 37) - 18) / 100.0f;
  o.optimizer = "adamw";
  o.sub_group_numel = V8CHUNK_NUMEL;
  o.num_buffers = 3;
  o.state_dtype = state_dtype;
  EXPECT_RC(v8_open(dir, NULL, &store), STRATA_OK);
  if (store != NULL) EXPECT_RC(strata_optimizer_create(store, &o, 0, &opt), STRATA_OK);
  if (opt != NULL) {
    EXPECT_RC(strata_optimizer_add_param(opt, "w", n, NULL, STRATA_PLACEMENT_NVME, &h),
              STRATA_OK);
    EXPECT_RC(strata_optimizer_set_grad(opt, h, g, STRATA_FLOAT32), STRATA_OK);
    EXPECT_RC(strata_optimizer_step(opt, 0.0, 1.0f, NULL), STRATA_OK); /* warm */
    EXPECT_RC(strata_optimizer_checkpoint(opt), STRATA_OK);
    memset(&st, 0, sizeof st);
    EXPECT_RC(strata_optimizer_step(opt, 0.0, 1.0f, &st), STRATA_OK);
    *read = st.bytes_read;
    *written = st.bytes_written;
    EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
  }
  EXPECT_RC(strata_store_close(store), STRATA_OK);
  free(g);
}

void test_api_v8(const char* dir) {
  char sub[300], file[320];
  strata_store_t* store = NULL;
  strata_optimizer_t* opt = NULL;
  strata_optimizer_options_t o;
  strata_optimizer_options_t init = STRATA_OPTIMIZER_OPTIONS_INIT;
  const uint64_t n = 8u * V8CHUNK_NUMEL; /* 131072 parameters */
  uint64_t r32 = 0, w32 = 0, r16 = 0, w16 = 0;
  uint32_t h = 0;
  FILE* f;
  EXPECT(STRATA_C_API_VERSION >= 8);
  EXPECT(strata_c_api_version() >= 8);
  EXPECT(init.state_dtype == STRATA_UNDEF_INT);

  snprintf(sub, sizeof sub, "%s/rule", dir);
  v8_rule_bf16(sub);

  /* Bytes per parameter and step, each way: 4 + 2 x 4 = 12 (fp32), 4 + 2 x 2 = 8 (bf16). */
  snprintf(sub, sizeof sub, "%s/bytes32", dir);
  v8_adamw_bytes(sub, STRATA_FLOAT32, n, &r32, &w32);
  snprintf(sub, sizeof sub, "%s/bytes16", dir);
  v8_adamw_bytes(sub, STRATA_BFLOAT16, n, &r16, &w16);
  EXPECT(r32 == 12u * n && w32 == 12u * n);
  EXPECT(r16 == 8u * n && w16 == 8u * n);

  /* Bad values, an older struct, the configuration file. */
  snprintf(sub, sizeof sub, "%s/misc", dir);
  EXPECT_RC(v8_open(sub, NULL, &store), STRATA_OK);
  if (store == NULL) return;
  o = init;
  o.state_dtype = STRATA_FLOAT16;
  EXPECT_RC(strata_optimizer_create(store, &o, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(opt == NULL);
  EXPECT(LAST_ERROR_HAS("state_dtype must be STRATA_FLOAT32 (0) or STRATA_BFLOAT16 (2), got 1"));
  o.state_dtype = 77;
  EXPECT_RC(strata_optimizer_create(store, &o, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("got 77"));
  /* A version-7 struct (ending at `rule`): state_dtype is not read (77 stays ignored). */
  o.struct_size = offsetof(strata_optimizer_options_t, state_dtype);
  o.key_prefix = "old/";
  EXPECT_RC(strata_optimizer_create(store, &o, 0, &opt), STRATA_OK);
  if (opt != NULL) {
    EXPECT_RC(strata_optimizer_add_param(opt, "w", 100, NULL, STRATA_PLACEMENT_NVME, &h),
              STRATA_OK);
    EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
    opt = NULL;
  }
  EXPECT(v8_nbytes(store, "old/p/w/exp_avg") == 400u);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
  store = NULL;

  /* "optimizer.state_dtype" of the store's configuration file is the default; a set field
   * wins; a bad value is refused naming the key and the value. */
  snprintf(file, sizeof file, "%s/v8.json", dir);
  f = fopen(file, "w");
  EXPECT(f != NULL);
  if (f == NULL) return;
  fputs("{\"optimizer\": {\"state_dtype\": \"bf16\"}}\n", f);
  fclose(f);
  snprintf(sub, sizeof sub, "%s/config", dir);
  EXPECT_RC(v8_open(sub, file, &store), STRATA_OK);
  if (store == NULL) return;
  o = init;
  o.key_prefix = "cfg/";
  EXPECT_RC(strata_optimizer_create(store, &o, 0, &opt), STRATA_OK);
  if (opt != NULL) {
    EXPECT_RC(strata_optimizer_add_param(opt, "w", 100, NULL, STRATA_PLACEMENT_NVME, &h),
              STRATA_OK);
    EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
    opt = NULL;
  }
  EXPECT(v8_nbytes(store, "cfg/p/w/exp_avg") == 200u);
  o.key_prefix = "set/";
  o.state_dtype = STRATA_FLOAT32;
  EXPECT_RC(strata_optimizer_create(store, &o, 0, &opt), STRATA_OK);
  if (opt != NULL) {
    EXPECT_RC(strata_optimizer_add_param(opt, "w", 100, NULL, STRATA_PLACEMENT_NVME, &h),
              STRATA_OK);
    EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
    opt = NULL;
  }
  EXPECT(v8_nbytes(store, "set/p/w/exp_avg") == 400u);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
  store = NULL;
  f = fopen(file, "w");
  if (f == NULL) return;
  fputs("{\"optimizer\": {\"state_dtype\": \"fp16\"}}\n", f);
  fclose(f);
  EXPECT_RC(v8_open(sub, file, &store), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(store == NULL);
  EXPECT(LAST_ERROR_HAS("optimizer.state_dtype: expected one of \"fp32\", \"bf16\", got \"fp16\""));
  EXPECT(LAST_ERROR_HAS(file));
  remove(file);
}
