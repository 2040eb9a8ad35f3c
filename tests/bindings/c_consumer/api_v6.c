/* The C API's version-6 surface, as a C99 client uses it: a custom update rule written in C
 * (SGD with momentum, torch.optim.SGD's rule with dampening 0) stepped over two param groups
 * on the NVMe and host tiers and compared bit for bit with the same arithmetic in a plain
 * loop; step options (grad_scale) and the async step; a failing rule (the step is a
 * transaction: nothing changes); state access (read/write of masters, states and step
 * counts: a load_state_dict into a second optimizer continues identically); parameter and
 * rule information; bad rules; byte ranges, eviction and pinning of store objects. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "strata/strata.h"

enum { VA = 3000, VB = 777, VSTEPS = 6 };

/* What the rule's user_data points at: a parameter name and step on which it fails. */
typedef struct fail_at {
  const char* param; /* NULL: never fails */
  int64_t step;
} fail_at_t;

/* One element of SGD with momentum (torch.optim.SGD, dampening 0, nesterov off): the rule's
 * call and the reference loop run this same function, so results must be identical. */
static void sgdm_element(float* p, float* buf, float g, int64_t step, float lr, float mom) {
  *buf = step == 1 ? g : mom * *buf + g;
  *p = *p - lr * *buf;
}

static strata_status_t sgdm_update(const strata_update_spans_t* s, const strata_update_info_t* info,
                                   void* user_data) {
  const fail_at_t* fail = (const fail_at_t*)user_data;
  const float lr = (float)info->hyperparams[0];
  const float mom = (float)info->hyperparams[1];
  uint64_t i;
  if (fail != NULL && fail->param != NULL && strcmp(fail->param, info->param_name) == 0 &&
      fail->step == info->step) {
    snprintf(info->error, info->error_size, "injected failure at element %llu",
             (unsigned long long)info->offset);
    return STRATA_ERR_OUT_OF_RANGE;
  }
  for (i = 0; i < s->numel; ++i) sgdm_element(&s->param[i], &s->states[0][i], s->grad[i],
                                              info->step, lr, mom);
  return STRATA_OK;
}

static const char* const kStates[1] = {"momentum_buffer"};
static const char* const kHyper[2] = {"lr", "momentum"};
static const double kHyperDefaults[2] = {0.1, 0.9};

static void sgdm_rule(strata_rule_t* r, fail_at_t* fail) {
  strata_rule_t init = STRATA_RULE_INIT;
  *r = init;
  r->name = "sgdm_c";
  r->num_states = 1;
  r->state_names = kStates;
  r->num_hyperparams = 2;
  r->hyperparam_names = kHyper;
  r->hyperparam_defaults = kHyperDefaults;
  r->update = sgdm_update;
  r->user_data = fail;
}

static float v6_init(int t, int i) { return (float)(((i * 7 + t * 3) % 89) - 44) / 41.0f; }
static float v6_grad(int t, int s, int i) {
  return (float)(((i * 31 + s * 17 + t * 11) % 101) - 50) / 67.0f;
}

static strata_status_t v6_open(const char* dir, strata_store_t** store) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  o.path = dir;
  o.host_budget_bytes = 16u << 20;
  o.staging_bytes = 8u << 20;
  o.chunk_bytes = 64u << 10;
  return strata_store_open(&o, store);
}

/* The reference: params, momentum buffers and step counts of both tensors. */
typedef struct v6_ref {
  float p[2][VA], buf[2][VA];
  int64_t step;
} v6_ref_t;

static const int kNumel[2] = {VA, VB};
static const float kLr[2] = {0.05f, 0.02f};
static const float kMom[2] = {0.9f, 0.5f};

static void ref_step(v6_ref_t* r, int s, float scale) {
  int t, i;
  ++r->step;
  for (t = 0; t < 2; ++t)
    for (i = 0; i < kNumel[t]; ++i)
      sgdm_element(&r->p[t][i], &r->buf[t][i], v6_grad(t, s, i) * scale, r->step, kLr[t],
                   kMom[t]);
}

static void set_grads(strata_optimizer_t* opt, int s, float (*g)[VA]) {
  int t, i;
  for (t = 0; t < 2; ++t) {
    for (i = 0; i < kNumel[t]; ++i) g[t][i] = v6_grad(t, s, i);
    EXPECT_RC(strata_optimizer_set_grad(opt, (uint32_t)t, g[t], STRATA_FLOAT32), STRATA_OK);
  }
}

/* 1 when both tensors' masters and momentum buffers equal the reference bit for bit. */
static int same_as_ref(strata_optimizer_t* opt, const v6_ref_t* r) {
  static float out[VA];
  int t, same = 1;
  for (t = 0; t < 2; ++t) {
    EXPECT_RC(strata_optimizer_read_param(opt, (uint32_t)t, out, 0, (uint64_t)kNumel[t]),
              STRATA_OK);
    same &= memcmp(out, r->p[t], sizeof(float) * (size_t)kNumel[t]) == 0;
    EXPECT_RC(strata_optimizer_read_state(opt, (uint32_t)t, 0, out, 0, (uint64_t)kNumel[t]),
              STRATA_OK);
    same &= memcmp(out, r->buf[t], sizeof(float) * (size_t)kNumel[t]) == 0;
  }
  return same;
}

/* A second optimizer (own store) loaded from `src` through the state calls: masters as the
 * initial values, state streams, step counts, group hyperparameters. */
static strata_optimizer_t* load_copy(const char* dir, strata_optimizer_t* src,
                                     strata_store_t** store, strata_rule_t* rule) {
  static float buf[VA];
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_optimizer_t* opt = NULL;
  double mom = 0.0;
  int group = -1, t;
  uint32_t h;
  int64_t step = -1;
  EXPECT_RC(v6_open(dir, store), STRATA_OK);
  if (*store == NULL) return NULL;
  oo.rule = rule;
  oo.lr = 0.05;
  oo.sub_group_numel = 512;
  EXPECT_RC(strata_optimizer_create(*store, &oo, 0, &opt), STRATA_OK);
  if (opt == NULL) return NULL;
  EXPECT_RC(strata_optimizer_hyperparam(src, 1, "momentum", &mom), STRATA_OK);
  {
    const char* keys[2] = {"lr", "momentum"};
    double lr1 = 0.0, vals[2];
    EXPECT_RC(strata_optimizer_hyperparam(src, 1, "lr", &lr1), STRATA_OK);
    vals[0] = lr1;
    vals[1] = mom;
    EXPECT_RC(strata_optimizer_add_param_group(opt, keys, vals, 2, &group), STRATA_OK);
  }
  for (t = 0; t < 2; ++t) {
    EXPECT_RC(strata_optimizer_read_param(src, (uint32_t)t, buf, 0, (uint64_t)kNumel[t]),
              STRATA_OK);
    EXPECT_RC(strata_optimizer_add_param_to_group(opt, t == 0 ? "a" : "b", (uint64_t)kNumel[t],
                                                  NULL, t, STRATA_PLACEMENT_NVME, &h),
              STRATA_OK);
    /* written in two ranges, as a loader reading a file piece by piece would */
    EXPECT_RC(strata_optimizer_write_param(opt, h, buf, 0, 100), STRATA_OK);
    EXPECT_RC(strata_optimizer_write_param(opt, h, buf + 100, 100, (uint64_t)kNumel[t] - 100),
              STRATA_OK);
    EXPECT_RC(strata_optimizer_read_state(src, (uint32_t)t, 0, buf, 0, (uint64_t)kNumel[t]),
              STRATA_OK);
    EXPECT_RC(strata_optimizer_write_state(opt, h, 0, buf, 0, (uint64_t)kNumel[t]), STRATA_OK);
    EXPECT_RC(strata_optimizer_step_count(src, (uint32_t)t, &step), STRATA_OK);
    EXPECT_RC(strata_optimizer_set_step_count(opt, h, step), STRATA_OK);
  }
  return opt;
}

static void test_rule_errors(strata_store_t* store) {
  strata_rule_t r;
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_optimizer_t* opt = NULL;
  const char* dup[2] = {"m", "m"};
  oo.rule = &r;
  sgdm_rule(&r, NULL);
  r.update = NULL;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(opt == NULL && LAST_ERROR_HAS("rule 'sgdm_c': update is NULL"));
  sgdm_rule(&r, NULL);
  r.name = "adamw";
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("the name of a built-in optimizer"));
  sgdm_rule(&r, NULL);
  r.name = "two words";
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("rule.name must be non-empty printable ASCII"));
  sgdm_rule(&r, NULL);
  r.num_states = 2;
  r.state_names = dup;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("state name 'm' appears twice"));
  sgdm_rule(&r, NULL);
  r.num_states = 5;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("num_states 5 is outside 0..4"));
  sgdm_rule(&r, NULL);
  r.struct_size = 8;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("STRATA_RULE_INIT"));
  sgdm_rule(&r, NULL);
  oo.beta1 = 0.9; /* a field the rule does not take */
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("custom rule 'sgdm_c' has no hyperparameter 'beta1' (it takes: lr, "
                        "momentum)"));
  EXPECT(opt == NULL);
}

static void test_rule(const char* dir) {
  static float init[VA], g[2][VA], out[VA];
  static v6_ref_t ref, before;
  char sub[300], sub2[300];
  strata_store_t* store = NULL;
  strata_store_t* store2 = NULL;
  strata_optimizer_t* opt = NULL;
  strata_optimizer_t* copy = NULL;
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_step_options_t so = STRATA_STEP_OPTIONS_INIT;
  strata_step_stats_t stats;
  strata_param_info_t info = STRATA_PARAM_INFO_INIT;
  strata_future_t* fut = NULL;
  strata_rule_t rule;
  fail_at_t fail = {NULL, 0};
  const char* keys[2] = {"lr", "momentum"};
  const double vals[2] = {0.02, 0.5};
  const char* bad_key[1] = {"beta1"};
  const double bad_val[1] = {0.9};
  double hp = 0.0;
  uint32_t h = 99, n = 0;
  int group = -1, ngroups = 0, t, i, s;
  int64_t step = -1;

  snprintf(sub, sizeof sub, "%s/rule", dir);
  EXPECT_RC(v6_open(sub, &store), STRATA_OK);
  if (store == NULL) return;
  test_rule_errors(store);
  sgdm_rule(&rule, &fail);
  oo.rule = &rule;
  oo.lr = 0.05; /* group 0's lr; momentum takes the rule's default 0.9 */
  oo.sub_group_numel = 1000; /* 3 sub-groups of "a" */
  oo.num_threads = 2;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_OK);
  if (opt == NULL) return;
  EXPECT(strcmp(strata_optimizer_rule_name(opt), "sgdm_c") == 0);
  EXPECT(strata_optimizer_num_states(opt) == 1);
  EXPECT(strcmp(strata_optimizer_state_name(opt, 0), "momentum_buffer") == 0);
  EXPECT(strata_optimizer_state_name(opt, 1) == NULL);
  for (i = 0; i < VA; ++i) init[i] = ref.p[0][i] = v6_init(0, i);
  EXPECT_RC(strata_optimizer_add_param(opt, "a", VA, init, STRATA_PLACEMENT_NVME, &h), STRATA_OK);
  EXPECT(h == 0);
  EXPECT_RC(strata_optimizer_add_param_group(opt, bad_key, bad_val, 1, &group),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("has no hyperparameter 'beta1'"));
  EXPECT_RC(strata_optimizer_add_param_group(opt, keys, vals, 2, &group), STRATA_OK);
  EXPECT(group == 1);
  EXPECT_RC(strata_optimizer_num_param_groups(opt, &ngroups), STRATA_OK);
  EXPECT(ngroups == 2);
  for (i = 0; i < VB; ++i) init[i] = ref.p[1][i] = v6_init(1, i);
  EXPECT_RC(strata_optimizer_add_param_to_group(opt, "b", VB, init, 2, STRATA_PLACEMENT_HOST, &h),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_optimizer_add_param_to_group(opt, "b", VB, init, 1, STRATA_PLACEMENT_HOST, &h),
            STRATA_OK);
  EXPECT(h == 1);
  EXPECT_RC(strata_optimizer_num_params(opt, &n), STRATA_OK);
  EXPECT(n == 2);
  EXPECT_RC(strata_optimizer_hyperparam(opt, 0, "momentum", &hp), STRATA_OK);
  EXPECT(hp == 0.9);
  EXPECT_RC(strata_optimizer_hyperparam(opt, 1, "lr", &hp), STRATA_OK);
  EXPECT(hp == 0.02);

  /* steps 1..3: plain, a loss-scaled gradient (x 0.25, the rule sees it scaled), plain */
  for (s = 1; s <= 3; ++s) {
    const float scale = s == 2 ? 0.25f : 1.0f;
    set_grads(opt, s, g);
    so.grad_scale = scale;
    memset(&stats, 0, sizeof stats);
    EXPECT_RC(strata_optimizer_step_with(opt, &so, &stats), STRATA_OK);
    EXPECT(stats.skipped == 0 && stats.numel_updated == VA + VB);
    ref_step(&ref, s, scale);
  }
  EXPECT(same_as_ref(opt, &ref));
  EXPECT_RC(strata_optimizer_param_info(opt, 1, &info), STRATA_OK);
  EXPECT(info.name != NULL && strcmp(info.name, "b") == 0);
  EXPECT(info.numel == VB && info.placement == STRATA_PLACEMENT_HOST && info.group == 1);
  EXPECT(info.step == 3 && info.master_key != NULL && info.master_key[0] != '\0');
  EXPECT_RC(strata_optimizer_param_info(opt, 2, &info), STRATA_ERR_OUT_OF_RANGE);
  EXPECT_RC(strata_optimizer_read_state(opt, 0, 1, out, 0, 1), STRATA_ERR_OUT_OF_RANGE);
  EXPECT_RC(strata_optimizer_set_step_count(opt, 0, -1), STRATA_ERR_INVALID_ARGUMENT);

  /* step 4 asynchronously */
  set_grads(opt, 4, g);
  so.grad_scale = 1.0f;
  memset(&stats, 0, sizeof stats);
  EXPECT_RC(strata_optimizer_step_async(opt, &so, &stats, &fut), STRATA_OK);
  EXPECT(fut != NULL);
  if (fut != NULL) {
    EXPECT_RC(strata_future_wait(fut), STRATA_OK);
    strata_future_free(fut);
  }
  EXPECT(stats.numel_updated == VA + VB);
  ref_step(&ref, 4, 1.0f);
  EXPECT(same_as_ref(opt, &ref));

  /* step 5 fails in "b": nothing changes, "a" (stepped first) included */
  before = ref;
  fail.param = "b";
  fail.step = 5;
  set_grads(opt, 5, g);
  EXPECT_RC(strata_optimizer_step_with(opt, NULL, NULL), STRATA_ERR_OUT_OF_RANGE);
  EXPECT(LAST_ERROR_HAS("custom rule 'sgdm_c' returned OutOfRange on parameter 'b' "
                        "(elements [0, 777), step 5): injected failure at element 0"));
  EXPECT(same_as_ref(opt, &before));
  for (t = 0; t < 2; ++t) {
    EXPECT_RC(strata_optimizer_step_count(opt, (uint32_t)t, &step), STRATA_OK);
    EXPECT(step == 4);
  }
  fail.param = NULL;
  set_grads(opt, 5, g);
  EXPECT_RC(strata_optimizer_step_with(opt, NULL, NULL), STRATA_OK);
  ref_step(&ref, 5, 1.0f);
  EXPECT(same_as_ref(opt, &ref));

  /* bad step options, state streams and keys change nothing */
  so.grad_scale = -1.0f;
  EXPECT_RC(strata_optimizer_step_with(opt, &so, NULL), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("grad_scale finite and >= 0"));
  so.grad_scale = 1.0f;
  so.has_grad_summary = 1;
  so.summary_grad_norm = -5.0;
  EXPECT_RC(strata_optimizer_step_with(opt, &so, NULL), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(LAST_ERROR_HAS("grad_summary.grad_norm must be >= 0"));
  so.has_grad_summary = 0;
  EXPECT_RC(strata_optimizer_read_state(opt, 0, -1, out, 0, 1), STRATA_ERR_OUT_OF_RANGE);
  EXPECT(LAST_ERROR_HAS("state stream -1 is out of range (1 streams)"));
  EXPECT_RC(strata_optimizer_write_state(opt, 0, -1, out, 0, 1), STRATA_ERR_OUT_OF_RANGE);
  {
    const char* twice[2] = {"lr", "lr"};
    const double v2[2] = {0.1, 0.2};
    EXPECT_RC(strata_optimizer_add_param_group(opt, twice, v2, 2, &group),
              STRATA_ERR_INVALID_ARGUMENT);
    EXPECT(LAST_ERROR_HAS("key 'lr' is given twice"));
  }
  EXPECT(same_as_ref(opt, &ref));

  /* load_state_dict into a second optimizer; step 6 on both gives the same values */
  snprintf(sub2, sizeof sub2, "%s/copy", dir);
  copy = load_copy(sub2, opt, &store2, &rule);
  if (copy != NULL) {
    set_grads(opt, 6, g);
    set_grads(copy, 6, g);
    EXPECT_RC(strata_optimizer_step(opt, 0.0, 1.0f, NULL), STRATA_OK);
    EXPECT_RC(strata_optimizer_step(copy, 0.0, 1.0f, NULL), STRATA_OK);
    ref_step(&ref, 6, 1.0f);
    EXPECT(same_as_ref(opt, &ref));
    EXPECT(same_as_ref(copy, &ref));
    EXPECT_RC(strata_optimizer_close(copy), STRATA_OK);
  }
  if (store2 != NULL) EXPECT_RC(strata_store_close(store2), STRATA_OK);

  /* checkpoint, close, resume with the same rule */
  EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
  opt = NULL;
  EXPECT_RC(strata_optimizer_create(store, &oo, 1, &opt), STRATA_OK);
  if (opt != NULL) {
    EXPECT(same_as_ref(opt, &ref));
    EXPECT_RC(strata_optimizer_step_count(opt, 1, &step), STRATA_OK);
    EXPECT(step == VSTEPS);
    EXPECT_RC(strata_optimizer_num_param_groups(opt, &ngroups), STRATA_OK);
    EXPECT(ngroups == 2);
    EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
  }
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

/* A rule that promises not to fail (may_fail = 0) but fails: the step returns its status
 * (no transaction: the update may be partly applied), checkpoint and close refuse, and a
 * reopen resumes the last checkpoint exactly. */
static void test_rule_that_breaks_its_promise(const char* dir) {
  static float init[VA], g[2][VA], out[VA];
  char sub[300];
  strata_store_t* store = NULL;
  strata_optimizer_t* opt = NULL;
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_rule_t rule;
  fail_at_t fail = {"a", 2};
  uint32_t h;
  int64_t step = -1;
  int i, t;
  snprintf(sub, sizeof sub, "%s/promise", dir);
  EXPECT_RC(v6_open(sub, &store), STRATA_OK);
  if (store == NULL) return;
  sgdm_rule(&rule, &fail);
  rule.may_fail = 0;
  oo.rule = &rule;
  oo.lr = 0.05;
  oo.sub_group_numel = 1000;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_OK);
  if (opt == NULL) return;
  for (t = 0; t < 2; ++t) {
    for (i = 0; i < kNumel[t]; ++i) init[i] = v6_init(t, i);
    EXPECT_RC(strata_optimizer_add_param(opt, t == 0 ? "a" : "b", (uint64_t)kNumel[t], init,
                                         STRATA_PLACEMENT_NVME, &h),
              STRATA_OK);
  }
  set_grads(opt, 1, g);
  EXPECT_RC(strata_optimizer_step_with(opt, NULL, NULL), STRATA_OK);
  EXPECT_RC(strata_optimizer_checkpoint(opt), STRATA_OK);
  EXPECT_RC(strata_optimizer_read_param(opt, 0, out, 0, VA), STRATA_OK);
  set_grads(opt, 2, g);
  EXPECT_RC(strata_optimizer_step_with(opt, NULL, NULL), STRATA_ERR_OUT_OF_RANGE);
  EXPECT(LAST_ERROR_HAS("custom rule 'sgdm_c' returned OutOfRange on parameter 'a'"));
  EXPECT_RC(strata_optimizer_checkpoint(opt), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT(LAST_ERROR_HAS("a step failed after it may have changed some tensors"));
  EXPECT_RC(strata_optimizer_close(opt), STRATA_ERR_FAILED_PRECONDITION); /* frees it */
  opt = NULL;
  EXPECT_RC(strata_optimizer_create(store, &oo, 1, &opt), STRATA_OK);
  if (opt != NULL) {
    static float back[VA];
    EXPECT_RC(strata_optimizer_step_count(opt, 0, &step), STRATA_OK);
    EXPECT(step == 1);
    EXPECT_RC(strata_optimizer_read_param(opt, 0, back, 0, VA), STRATA_OK);
    EXPECT(memcmp(back, out, sizeof(float) * VA) == 0);
    EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
  }
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

static void test_ranges(const char* dir) {
  enum { RN = 200000 };
  static uint8_t data[RN], patch[5000], out[RN];
  char sub[300];
  strata_store_t* store = NULL;
  strata_object_info_t info = STRATA_OBJECT_INFO_INIT;
  strata_future_t* fut = NULL;
  int64_t shape[1] = {RN};
  int i;
  snprintf(sub, sizeof sub, "%s/ranges", dir);
  EXPECT_RC(v6_open(sub, &store), STRATA_OK);
  if (store == NULL) return;
  for (i = 0; i < RN; ++i) data[i] = (uint8_t)(i * 13 + 5);
  for (i = 0; i < 5000; ++i) patch[i] = (uint8_t)(255 - i);
  EXPECT_RC(strata_store_put(store, "r", data, STRATA_UINT8, 1, shape, STRATA_TIER_NVME, 0),
            STRATA_OK);
  /* a range across a chunk boundary (64 KiB chunks) */
  EXPECT_RC(strata_store_write_range(store, "r", 65000, 5000, patch), STRATA_OK);
  memcpy(data + 65000, patch, 5000);
  EXPECT_RC(strata_store_read_range(store, "r", 0, RN, out), STRATA_OK);
  EXPECT(memcmp(out, data, RN) == 0);
  memset(out, 0, 1000);
  EXPECT_RC(strata_store_read_range_async(store, "r", 65500, 1000, out, &fut), STRATA_OK);
  if (fut != NULL) {
    EXPECT_RC(strata_future_wait(fut), STRATA_OK);
    strata_future_free(fut);
  }
  EXPECT(memcmp(out, data + 65500, 1000) == 0);
  fut = NULL;
  EXPECT_RC(strata_store_write_range_async(store, "r", RN - 10, 10, patch, &fut), STRATA_OK);
  if (fut != NULL) {
    EXPECT_RC(strata_future_wait(fut), STRATA_OK);
    strata_future_free(fut);
  }
  memcpy(data + RN - 10, patch, 10);
  EXPECT_RC(strata_store_get(store, "r", out, RN), STRATA_OK);
  EXPECT(memcmp(out, data, RN) == 0);
  EXPECT_RC(strata_store_read_range(store, "r", RN - 10, 11, out), STRATA_ERR_OUT_OF_RANGE);
  EXPECT(LAST_ERROR_HAS("'r'"));
  EXPECT_RC(strata_store_write_range(store, "r", RN, 1, patch), STRATA_ERR_OUT_OF_RANGE);
  EXPECT_RC(strata_store_read_range(store, "absent", 0, 1, out), STRATA_ERR_NOT_FOUND);
  EXPECT(LAST_ERROR_HAS("'absent'"));
  EXPECT_RC(strata_store_read_range(store, "r", 0, 1, NULL), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_store_read_range(store, NULL, 0, 1, out), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_store_read_range_async(store, "r", 0, 1, out, NULL),
            STRATA_ERR_INVALID_ARGUMENT);

  /* pin: promoted to host, never evicted while pinned; pins nest */
  EXPECT_RC(strata_store_pin(store, "r"), STRATA_OK);
  EXPECT_RC(strata_store_pin(store, "r"), STRATA_OK);
  EXPECT_RC(strata_store_stat(store, "r", &info), STRATA_OK);
  EXPECT(info.pinned == 1 && info.tier == STRATA_TIER_HOST);
  EXPECT_RC(strata_store_evict(store, "r"), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_RC(strata_store_unpin(store, "r"), STRATA_OK);
  EXPECT_RC(strata_store_evict(store, "r"), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_RC(strata_store_unpin(store, "r"), STRATA_OK);
  EXPECT_RC(strata_store_unpin(store, "r"), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_RC(strata_store_evict(store, "r"), STRATA_OK);
  EXPECT_RC(strata_store_stat(store, "r", &info), STRATA_OK);
  EXPECT(info.pinned == 0 && info.tier == STRATA_TIER_NVME && info.on_nvme == 1);
  EXPECT_RC(strata_store_get(store, "r", out, RN), STRATA_OK);
  EXPECT(memcmp(out, data, RN) == 0);
  EXPECT_RC(strata_store_evict(store, "absent"), STRATA_ERR_NOT_FOUND);
  EXPECT_RC(strata_store_pin(store, "absent"), STRATA_ERR_NOT_FOUND);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

void test_api_v6(const char* dir) {
  EXPECT(STRATA_C_API_VERSION >= 6);
  EXPECT(mkdir(dir, 0700) == 0);
  test_rule(dir);
  test_rule_that_breaks_its_promise(dir);
  test_ranges(dir);
}
