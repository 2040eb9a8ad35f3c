/* A C99 program using strata's installed C API: store, futures, errors, the offloaded
 * optimizer (create, step, checkpoint, resume, hyperparameters after create, the resume
 * rule: strata_optimizer_free / close vs. a killed child process) and the communicator.
 * Prints "c consumer ok". Run as `strata_c_consumer child DIR TIER ENDING` it is the
 * child of test_resume_rule. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "strata/strata.h"

int failures = 0;

/* Sets `o` for the store at `dir`: `host_mib` MiB of host tier, `staging_mib` MiB of staging
 * buffers, 1 MiB chunks and `workers` pool threads (0: the default). */
static void set_store_options(strata_store_options_t* o, const char* dir, uint64_t host_mib,
                              uint64_t staging_mib, int workers) {
  o->path = dir;
  o->host_budget_bytes = host_mib << 20;
  o->staging_bytes = staging_mib << 20;
  o->chunk_bytes = 1u << 20;
  if (workers > 0) o->worker_threads = workers;
}

static void test_store(const char* dir) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  strata_store_t* store = NULL;
  float src[6] = {1.0f, 2.5f, -3.0f, 4.0f, 1e-3f, 6.0f};
  float dst[6] = {0};
  int64_t shape[2] = {2, 3};
  strata_object_info_t info = STRATA_OBJECT_INFO_INIT;
  strata_key_list_t* keys = NULL;
  strata_future_t* fut = NULL;
  int ready = 0;
  int32_t ibuf[1000];
  int32_t iout[1000];
  int64_t ishape[1] = {1000};
  int i;

  EXPECT(o.struct_size == sizeof(strata_store_options_t));
  EXPECT(o.version == STRATA_C_API_VERSION);
  EXPECT(strata_c_api_version() == STRATA_C_API_VERSION);
  /* Missing path: InvalidArgument with a message. */
  EXPECT_RC(strata_store_open(&o, &store), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(store == NULL);
  EXPECT(strstr(strata_last_error(), "path") != NULL);

  set_store_options(&o, dir, 64, 16, 2);
  EXPECT_RC(strata_store_open(&o, &store), STRATA_OK);
  if (store == NULL) return;

  EXPECT_RC(strata_store_put(store, "w", src, STRATA_FLOAT32, 2, shape, STRATA_TIER_NVME, 0),
            STRATA_OK);
  /* Second put without overwrite: AlreadyExists naming the key. */
  EXPECT_RC(strata_store_put(store, "w", src, STRATA_FLOAT32, 2, shape, STRATA_TIER_NVME, 0),
            STRATA_ERR_ALREADY_EXISTS);
  EXPECT(strstr(strata_last_error(), "'w'") != NULL);
  EXPECT_RC(strata_store_get(store, "w", dst, sizeof dst), STRATA_OK);
  EXPECT(memcmp(src, dst, sizeof src) == 0);
  /* Wrong size: InvalidArgument. */
  EXPECT_RC(strata_store_get(store, "w", dst, 8), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_store_stat(store, "w", &info), STRATA_OK);
  EXPECT(info.dtype == STRATA_FLOAT32);
  EXPECT(info.ndim == 2 && info.shape[0] == 2 && info.shape[1] == 3);
  EXPECT(info.nbytes == 24);
  EXPECT(info.tier == STRATA_TIER_NVME && info.on_nvme == 1 && info.dirty == 0);
  EXPECT(strcmp(strata_tier_name(info.tier), "nvme") == 0);
  /* Bad put arguments: the message names the key and the value at fault. */
  {
    int64_t neg[2] = {-3, 2};
    EXPECT_RC(strata_store_put(store, "bad", src, (strata_dtype_t)42, 2, shape, STRATA_TIER_NVME,
                               0),
              STRATA_ERR_INVALID_ARGUMENT);
    EXPECT(strcmp(strata_last_error(),
                  "InvalidArgument: put 'bad': dtype value 42 is not a strata_dtype_t") == 0);
    EXPECT_RC(strata_store_put(store, "bad", src, STRATA_FLOAT32, 2, neg, STRATA_TIER_NVME, 0),
              STRATA_ERR_INVALID_ARGUMENT);
    EXPECT(strcmp(strata_last_error(), "InvalidArgument: put 'bad': shape[0] = -3 is negative") ==
           0);
    EXPECT_RC(strata_store_put(store, "bad", src, STRATA_FLOAT32, 2, shape, (strata_tier_t)9, 0),
              STRATA_ERR_INVALID_ARGUMENT);
    EXPECT(strcmp(strata_last_error(),
                  "InvalidArgument: put 'bad': tier value 9 is not a strata_tier_t") == 0);
    EXPECT_RC(strata_store_stat(store, "bad", &info), STRATA_ERR_NOT_FOUND);
  }

  /* Async put into the host tier, poll, wait. */
  for (i = 0; i < 1000; ++i) ibuf[i] = i * 7 - 3;
  EXPECT_RC(strata_store_put_async(store, "grp/ints", ibuf, STRATA_INT32, 1, ishape,
                                   STRATA_TIER_HOST, STRATA_PUT_OVERWRITE, &fut),
            STRATA_OK);
  EXPECT_RC(strata_future_wait(fut), STRATA_OK);
  EXPECT_RC(strata_future_poll(fut, &ready), STRATA_OK);
  EXPECT(ready == 1);
  strata_future_free(fut);
  fut = NULL;
  EXPECT_RC(strata_store_stat(store, "grp/ints", &info), STRATA_OK);
  EXPECT(info.tier == STRATA_TIER_HOST && info.dtype == STRATA_INT32 && info.nbytes == 4000);
  EXPECT_RC(strata_store_move(store, "grp/ints", STRATA_TIER_NVME), STRATA_OK);
  EXPECT_RC(strata_store_stat(store, "grp/ints", &info), STRATA_OK);
  EXPECT(info.tier == STRATA_TIER_NVME);
  EXPECT_RC(strata_store_prefetch_async(store, "grp/ints", STRATA_TIER_HOST, &fut), STRATA_OK);
  EXPECT_RC(strata_future_wait_for(fut, 60000), STRATA_OK);
  strata_future_free(fut);
  fut = NULL;
  EXPECT_RC(strata_store_get_async(store, "grp/ints", iout, sizeof iout, &fut), STRATA_OK);
  EXPECT_RC(strata_future_wait(fut), STRATA_OK);
  strata_future_free(fut);
  EXPECT(memcmp(ibuf, iout, sizeof ibuf) == 0);

  EXPECT_RC(strata_store_list(store, "grp/", &keys), STRATA_OK);
  EXPECT(strata_key_list_size(keys) == 1);
  EXPECT(strata_key_list_get(keys, 0) != NULL && strcmp(strata_key_list_get(keys, 0), "grp/ints") == 0);
  EXPECT(strata_key_list_get(keys, 1) == NULL);
  strata_key_list_free(keys);
  EXPECT_RC(strata_store_list(store, NULL, &keys), STRATA_OK);
  EXPECT(strata_key_list_size(keys) == 2);
  strata_key_list_free(keys);

  EXPECT_RC(strata_store_delete(store, "grp/ints"), STRATA_OK);
  EXPECT_RC(strata_store_get(store, "grp/ints", iout, sizeof iout), STRATA_ERR_NOT_FOUND);
  EXPECT(strstr(strata_last_error(), "grp/ints") != NULL);
  EXPECT_RC(strata_store_delete(store, "grp/ints"), STRATA_ERR_NOT_FOUND);
  EXPECT_RC(strata_store_put(NULL, "x", src, STRATA_FLOAT32, 2, shape, STRATA_TIER_NVME, 0),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_store_close(store), STRATA_OK);

  /* Reopen: the NVMe object survived. */
  store = NULL;
  EXPECT_RC(strata_store_open(&o, &store), STRATA_OK);
  if (store == NULL) return;
  memset(dst, 0, sizeof dst);
  EXPECT_RC(strata_store_get(store, "w", dst, sizeof dst), STRATA_OK);
  EXPECT(memcmp(src, dst, sizeof src) == 0);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

/* A damaged catalog row: stat reports `damaged`, strata_store_object_damage the reason, a
 * version-1 info struct (which ends at `pinned`) is still accepted. The row is damaged the
 * way tests/store does it: nbytes edited in the closed store's SQLite catalog (here with
 * Debian's python3, whose sqlite3 module needs no extra link flags in this C99 program). */
static void test_damage(const char* dir) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  strata_store_t* store = NULL;
  strata_object_info_t info = STRATA_OBJECT_INFO_INIT;
  float a[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  float b[6] = {5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f};
  float out[6];
  int64_t sa[1] = {4};
  int64_t sb[1] = {6};
  char cmd[1024];
  char reason[128];
  size_t len = 0;
  const char* want = "object 'b' chunks hold 24 bytes, expected 18446744073709551600";

  EXPECT(info.struct_size == sizeof(strata_object_info_t) && info.damaged == 0);
  set_store_options(&o, dir, 16, 4, 1);
  EXPECT_RC(strata_store_open(&o, &store), STRATA_OK);
  if (store == NULL) return;
  EXPECT_RC(strata_store_put(store, "a", a, STRATA_FLOAT32, 1, sa, STRATA_TIER_NVME, 0), STRATA_OK);
  EXPECT_RC(strata_store_put(store, "b", b, STRATA_FLOAT32, 1, sb, STRATA_TIER_NVME, 0), STRATA_OK);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
  store = NULL;
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c \"import sqlite3; c = sqlite3.connect('%s/catalog.db'); "
           "c.execute(\\\"UPDATE objects SET nbytes=-16 WHERE key=CAST('b' AS BLOB)\\\"); "
           "c.commit()\"", dir);
  EXPECT(system(cmd) == 0);

  EXPECT_RC(strata_store_open(&o, &store), STRATA_OK); /* a damaged row does not fail the open */
  if (store == NULL) return;
  EXPECT_RC(strata_store_stat(store, "a", &info), STRATA_OK);
  EXPECT(info.damaged == 0 && info.nbytes == 16);
  EXPECT_RC(strata_store_object_damage(store, "a", reason, sizeof reason, &len), STRATA_OK);
  EXPECT(len == 0 && strcmp(reason, "") == 0);
  EXPECT_RC(strata_store_stat(store, "b", &info), STRATA_OK);
  EXPECT(info.damaged == 1);
  EXPECT(info.nbytes == 18446744073709551600u); /* what the row claims: -16 as uint64 */
  EXPECT_RC(strata_store_object_damage(store, "b", reason, sizeof reason, &len), STRATA_OK);
  EXPECT(len == strlen(want) && strcmp(reason, want) == 0);
  /* Too small a buffer: truncated and NUL-terminated, *length is the full length. */
  EXPECT_RC(strata_store_object_damage(store, "b", reason, 8, &len), STRATA_OK);
  EXPECT(len == strlen(want) && strcmp(reason, "object ") == 0);
  EXPECT_RC(strata_store_object_damage(store, "b", NULL, 0, &len), STRATA_OK);
  EXPECT(len == strlen(want));
  EXPECT_RC(strata_store_object_damage(store, "b", NULL, 8, &len), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_store_object_damage(store, "nope", reason, sizeof reason, &len),
            STRATA_ERR_NOT_FOUND);
  EXPECT(strstr(strata_last_error(), "nope") != NULL);
  EXPECT_RC(strata_store_get(store, "b", out, sizeof out), STRATA_ERR_DATA_LOSS);
  EXPECT(strstr(strata_last_error(), want) != NULL);
  /* A version-1 struct: accepted, nothing past `pinned` is written. */
  info.damaged = 7;
  info.struct_size = offsetof(strata_object_info_t, damaged);
  EXPECT_RC(strata_store_stat(store, "b", &info), STRATA_OK);
  EXPECT(info.damaged == 7 && info.dtype == STRATA_FLOAT32 && info.ndim == 1 && info.shape[0] == 6);
  info.struct_size = offsetof(strata_object_info_t, pinned);
  EXPECT_RC(strata_store_stat(store, "b", &info), STRATA_ERR_INVALID_ARGUMENT);
  info.struct_size = sizeof(strata_object_info_t);
  /* Overwriting replaces the damaged object. */
  EXPECT_RC(strata_store_put(store, "b", b, STRATA_FLOAT32, 1, sb, STRATA_TIER_NVME,
                             STRATA_PUT_OVERWRITE),
            STRATA_OK);
  EXPECT_RC(strata_store_stat(store, "b", &info), STRATA_OK);
  EXPECT(info.damaged == 0 && info.nbytes == 24);
  EXPECT_RC(strata_store_get(store, "b", out, sizeof out), STRATA_OK);
  EXPECT(memcmp(out, b, sizeof b) == 0);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

/* torch.optim.AdamW, one tensor, in double (the reference). */
static void adamw_ref(double* p, double* m, double* v, const float* g, int n, int step,
                      double lr, double b1, double b2, double eps, double wd) {
  int i;
  double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
  for (i = 0; i < n; ++i) {
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
    v[i] = b2 * v[i] + (1.0 - b2) * (double)g[i] * g[i];
    p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
  }
}

/* torch.optim.AdamW's fp32 sequence (torch 1.13 `_single_tensor_adamw`): the arithmetic of
 * strata's "torch" option, which must match it bit for bit. Only the explicit fmaf are fused
 * (ISO C contracts nothing else). */
static void adamw_torch_ref(float* p, float* m, float* v, const float* g, int n, int step,
                            double lr, double b1, double b2, double eps, double wd) {
  const double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
  const float decay = (float)(1.0 - lr * wd), fb1 = (float)b1, omb1 = (float)(1.0 - b1);
  const float fb2 = (float)b2, omb2 = (float)(1.0 - b2), bc2s = (float)sqrt(bc2);
  const float feps = (float)eps, neg_ss = (float)(-(lr / bc1));
  int i;
  for (i = 0; i < n; ++i) {
    float den;
    p[i] = p[i] * decay;
    m[i] = fmaf(g[i], omb1, m[i] * fb1);
    v[i] = fmaf(omb2 * g[i], g[i], v[i] * fb2);
    den = sqrtf(v[i]) / bc2s + feps;
    p[i] = p[i] + (neg_ss * m[i]) / den;
  }
}

/* The store's counters: exact after a put and a get, a struct from an older header filled
 * only as far as its struct_size, reset. */
static void test_stats(const char* dir) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  strata_store_t* store = NULL;
  strata_store_stats_t st = STRATA_STORE_STATS_INIT;
  strata_store_stats_t old;
  int32_t buf[1000];
  int64_t shape[1] = {1000};
  int i;
  set_store_options(&o, dir, 8, 4, 2);
  EXPECT_RC(strata_store_open(&o, &store), STRATA_OK);
  if (store == NULL) return;
  for (i = 0; i < 1000; ++i) buf[i] = i;
  EXPECT_RC(strata_store_put(store, "s", buf, STRATA_INT32, 1, shape, STRATA_TIER_NVME, 0),
            STRATA_OK);
  EXPECT_RC(strata_store_get(store, "s", buf, sizeof buf), STRATA_OK);
  EXPECT_RC(strata_store_stats(store, &st), STRATA_OK);
  /* 4000 bytes: one chunk, 4096 bytes on disk each way. */
  EXPECT(st.nvme_write_ops == 1 && st.nvme_write_bytes == 4096);
  EXPECT(st.nvme_read_ops == 1 && st.nvme_read_bytes == 4096);
  EXPECT(st.prefetch_misses == 1 && st.prefetch_hits == 0 && st.checksum_failures == 0);
  EXPECT(st.host_write_ops == 0 && st.evictions == 0);
  EXPECT(st.host_pool_capacity_bytes == 8u << 20 && st.staging_pool_capacity_bytes == 4u << 20);
  EXPECT(st.nvme_read_wait_seconds > 0.0 && st.elapsed_seconds > 0.0);
  /* An older, shorter struct: only the fields it has are written. */
  memset(&old, 0xAB, sizeof old);
  old.struct_size = offsetof(strata_store_stats_t, host_read_bytes);
  EXPECT_RC(strata_store_stats(store, &old), STRATA_OK);
  EXPECT(old.device_write_ops == 0 && old.host_read_bytes == 0xABABABABABABABABull);
  EXPECT_RC(strata_store_reset_stats(store), STRATA_OK);
  EXPECT_RC(strata_store_stats(store, &st), STRATA_OK);
  EXPECT(st.nvme_write_ops == 0 && st.nvme_read_bytes == 0);
  st.struct_size = 0;
  EXPECT_RC(strata_store_stats(store, &st), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_store_stats(NULL, &st), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

/* arithmetic = "torch" (optimizers under "torch/" and "v2/" in `store`): bit-identical to
 * torch's sequence; bad values refused; a struct from a version-2 header (no arithmetic
 * field) gets the default. */
static void test_optimizer_torch_arithmetic(strata_store_t* store) {
  enum { N = 3000 };
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_optimizer_t* opt = NULL;
  static float p[N], m[N], v[N], g[N], out[N];
  uint32_t h = 99;
  int i, s, same = 1;

  EXPECT(oo.arithmetic == NULL);
  oo.optimizer = "sgd";
  oo.arithmetic = "torch";
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  oo.optimizer = "adamw";
  oo.arithmetic = "fast";
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(strata_last_error(), "arithmetic") != NULL);
  /* A version-2 struct ends before `arithmetic`: the bad value there is not read. */
  oo.struct_size = offsetof(strata_optimizer_options_t, arithmetic);
  oo.key_prefix = "v2/";
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_OK);
  strata_optimizer_free(opt);
  opt = NULL;
  oo.struct_size = sizeof oo;
  oo.key_prefix = "torch/";
  oo.arithmetic = "torch";
  oo.lr = 0.01;
  oo.weight_decay = 0.1;
  oo.sub_group_numel = 1000;
  oo.num_threads = 2;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_OK);
  if (opt == NULL) return;
  for (i = 0; i < N; ++i) {
    p[i] = (float)((i % 89) - 44) / 40.0f;
    m[i] = v[i] = 0.0f;
  }
  EXPECT_RC(strata_optimizer_add_param(opt, "w", N, p, STRATA_PLACEMENT_NVME, &h), STRATA_OK);
  for (s = 1; s <= 4; ++s) {
    for (i = 0; i < N; ++i) g[i] = (float)(((i * 37 + s * 11) % 103) - 51) / 97.0f;
    EXPECT_RC(strata_optimizer_set_grad(opt, h, g, (strata_dtype_t)STRATA_INT32),
              STRATA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(strata_last_error(), "set_grad of parameter ") != NULL &&
           strstr(strata_last_error(), "is not STRATA_FLOAT32, STRATA_FLOAT16 or STRATA_BFLOAT16") !=
               NULL);
    EXPECT_RC(strata_optimizer_set_grad(opt, h, g, STRATA_FLOAT32), STRATA_OK);
    EXPECT_RC(strata_optimizer_step(opt, 0.0, 1.0f, NULL), STRATA_OK);
    adamw_torch_ref(p, m, v, g, N, s, 0.01, 0.9, 0.999, 1e-8, 0.1);
  }
  EXPECT_RC(strata_optimizer_read_param(opt, h, out, 0, N), STRATA_OK);
  for (i = 0; i < N; ++i) same &= memcmp(&out[i], &p[i], sizeof(float)) == 0;
  EXPECT(same);
  {
    /* 4 steps of 3 sub-groups of 1000 elements, master + 2 states of fp32 each. */
    strata_optimizer_stats_t os = STRATA_OPTIMIZER_STATS_INIT;
    EXPECT_RC(strata_optimizer_stats(opt, &os, 1), STRATA_OK);
    EXPECT(os.steps == 4 && os.steps_skipped == 0 && os.sub_groups == 12);
    EXPECT(os.bytes_read == 4u * 3u * N * 4u && os.bytes_written == os.bytes_read);
    EXPECT(os.numel_updated == 4u * N);
    EXPECT(os.update_seconds > 0.0 && os.overlap > 0.0 && os.overlap <= 1.0);
    EXPECT_RC(strata_optimizer_stats(opt, &os, 0), STRATA_OK);
    EXPECT(os.steps == 0 && os.bytes_read == 0);
    EXPECT_RC(strata_optimizer_stats(opt, NULL, 0), STRATA_ERR_INVALID_ARGUMENT);
  }
  strata_optimizer_free(opt);
}

/* An LR schedule from C: strata_optimizer_set_hyperparams before each step, bit-identical
 * to torch's sequence with that lr; refusals; the value kept by a checkpoint. */
static void test_set_hyperparams(strata_store_t* store) {
  enum { N = 2000 };
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_optimizer_t* opt = NULL;
  static float p[N], m[N], v[N], g[N], out[N];
  const char* keys[2] = {"lr", "weight_decay"};
  double vals[2];
  double got = 0.0;
  uint32_t h = 99;
  int i, s, same = 1;

  oo.key_prefix = "sched/";
  oo.arithmetic = "torch";
  oo.num_threads = 1;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_OK);
  if (opt == NULL) return;
  EXPECT_RC(strata_optimizer_hyperparam(opt, 0, "lr", &got), STRATA_OK);
  EXPECT(got == 1e-3); /* adamw's default */
  for (i = 0; i < N; ++i) {
    p[i] = (float)((i % 71) - 35) / 30.0f;
    m[i] = v[i] = 0.0f;
  }
  EXPECT_RC(strata_optimizer_add_param(opt, "w", N, p, STRATA_PLACEMENT_AUTO, &h), STRATA_OK);
  for (s = 1; s <= 4; ++s) {
    vals[0] = 0.02 / s; /* lr schedule */
    vals[1] = 0.05;
    EXPECT_RC(strata_optimizer_set_hyperparams(opt, 0, keys, vals, 2), STRATA_OK);
    for (i = 0; i < N; ++i) g[i] = (float)(((i * 13 + s * 7) % 89) - 44) / 77.0f;
    EXPECT_RC(strata_optimizer_set_grad(opt, h, g, STRATA_FLOAT32), STRATA_OK);
    EXPECT_RC(strata_optimizer_step(opt, 0.0, 1.0f, NULL), STRATA_OK);
    adamw_torch_ref(p, m, v, g, N, s, 0.02 / s, 0.9, 0.999, 1e-8, 0.05);
  }
  EXPECT_RC(strata_optimizer_read_param(opt, h, out, 0, N), STRATA_OK);
  for (i = 0; i < N; ++i) same &= memcmp(&out[i], &p[i], sizeof(float)) == 0;
  EXPECT(same);
  /* Refusals change nothing: unknown key, lr < 0 (with a good key), no such group. */
  keys[1] = "momentum";
  EXPECT_RC(strata_optimizer_set_hyperparams(opt, 0, keys, vals, 2), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(strata_last_error(), "momentum") != NULL);
  keys[1] = "weight_decay";
  vals[0] = -1.0;
  EXPECT_RC(strata_optimizer_set_hyperparams(opt, 0, keys, vals, 2), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_optimizer_set_hyperparams(opt, 1, keys, vals, 1), STRATA_ERR_OUT_OF_RANGE);
  EXPECT_RC(strata_optimizer_set_hyperparams(opt, 0, NULL, vals, 1), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_optimizer_hyperparam(opt, 0, "lr", &got), STRATA_OK);
  EXPECT(got == 0.02 / 4);
  EXPECT_RC(strata_optimizer_hyperparam(opt, 0, "nope", &got), STRATA_ERR_NOT_FOUND);
  vals[0] = 0.125;
  EXPECT_RC(strata_optimizer_set_hyperparams(opt, 0, keys, vals, 1), STRATA_OK);
  EXPECT_RC(strata_optimizer_close(opt), STRATA_OK); /* close: the checkpoint keeps lr */
  opt = NULL;
  EXPECT_RC(strata_optimizer_create(store, &oo, 1, &opt), STRATA_OK);
  if (opt == NULL) return;
  EXPECT_RC(strata_optimizer_hyperparam(opt, 0, "lr", &got), STRATA_OK);
  EXPECT(got == 0.125);
  EXPECT_RC(strata_optimizer_hyperparam(opt, 0, "weight_decay", &got), STRATA_OK);
  EXPECT(got == 0.05);
  strata_optimizer_free(opt);
}

/* The resume rule: a child process trains K steps, checkpoints, trains M more, then ends by
 * `ending`: "free" (strata_optimizer_free, store close, exit 0), "close" (likewise with
 * strata_optimizer_close), "kill" (SIGKILL). Two parameters placed by `tier` ("auto":
 * host_budget fits the second only). */
enum { RK = 2, RM = 2, RN0 = 3000, RN1 = 500 };

static float rule_init(int t, int i) { return (float)(((i + 7 * t) % 83) - 41) / 37.0f; }
static float rule_grad(int t, int s, int i) {
  return (float)(((i * 29 + s * 13 + t * 5) % 97) - 48) / 91.0f;
}

static strata_status_t rule_open(const char* dir, strata_store_t** store) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  set_store_options(&o, dir, 16, 8, 0);
  o.chunk_bytes = 64u << 10;
  return strata_store_open(&o, store);
}

static void rule_options(strata_optimizer_options_t* oo, const char* tier) {
  oo->arithmetic = "torch";
  oo->lr = 0.01;
  oo->num_threads = 1;
  oo->sub_group_numel = 1000;
  oo->host_budget_bytes = strcmp(tier, "auto") == 0 ? (uint64_t)RN1 * 12 : 0;
}

static int rule_child(const char* dir, const char* tier, const char* ending) {
  static float init[RN0];
  static float gb[2][RN0];
  strata_store_t* store = NULL;
  strata_optimizer_t* opt = NULL;
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_placement_t pl = strcmp(tier, "host") == 0   ? STRATA_PLACEMENT_HOST
                          : strcmp(tier, "nvme") == 0 ? STRATA_PLACEMENT_NVME
                                                      : STRATA_PLACEMENT_AUTO;
  const int n[2] = {RN0, RN1};
  uint32_t h;
  int t, s, i;
  if (rule_open(dir, &store) != STRATA_OK) return 10;
  rule_options(&oo, tier);
  if (strata_optimizer_create(store, &oo, 0, &opt) != STRATA_OK) return 11;
  for (t = 0; t < 2; ++t) {
    for (i = 0; i < n[t]; ++i) init[i] = rule_init(t, i);
    if (strata_optimizer_add_param(opt, t == 0 ? "a" : "b", (uint64_t)n[t], init, pl, &h) !=
        STRATA_OK)
      return 12;
  }
  for (s = 1; s <= RK + RM; ++s) {
    for (t = 0; t < 2; ++t) {
      for (i = 0; i < n[t]; ++i) gb[t][i] = rule_grad(t, s, i);
      if (strata_optimizer_set_grad(opt, (uint32_t)t, gb[t], STRATA_FLOAT32) != STRATA_OK)
        return 13;
    }
    if (strata_optimizer_step(opt, 0.0, 1.0f, NULL) != STRATA_OK) return 14;
    if (s == RK && strata_optimizer_checkpoint(opt) != STRATA_OK) return 15;
  }
  if (strcmp(ending, "kill") == 0) raise(SIGKILL);
  if (strcmp(ending, "close") == 0) {
    if (strata_optimizer_close(opt) != STRATA_OK) return 16;
  } else {
    strata_optimizer_free(opt);
  }
  return strata_store_close(store) == STRATA_OK ? 0 : 17;
}

static void test_resume_rule(const char* self, const char* base) {
  const char* tiers[3] = {"nvme", "host", "auto"};
  const char* endings[3] = {"free", "close", "kill"};
  static float p[2][RN0], m[2][RN0], v[2][RN0], g[RN0], out[RN0];
  const int n[2] = {RN0, RN1};
  int ti, ei, t, s, i;
  for (ti = 0; ti < 3; ++ti) {
    for (ei = 0; ei < 3; ++ei) {
      char dir[300];
      pid_t pid;
      int status = 0, steps, same = 1;
      strata_store_t* store = NULL;
      strata_optimizer_t* opt = NULL;
      strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
      int64_t step = -1;
      snprintf(dir, sizeof dir, "%s/rule-%s-%s", base, tiers[ti], endings[ei]);
      pid = fork();
      if (pid == 0) {
        execl(self, self, "child", dir, tiers[ti], endings[ei], (char*)NULL);
        _exit(127);
      }
      EXPECT(pid > 0 && waitpid(pid, &status, 0) == pid);
      if (ei == 2) {
        EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
      } else {
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      }
      steps = ei == 2 ? RK : RK + RM; /* killed: the checkpoint; else: the close */
      for (t = 0; t < 2; ++t) {
        for (i = 0; i < n[t]; ++i) {
          p[t][i] = rule_init(t, i);
          m[t][i] = v[t][i] = 0.0f;
        }
        for (s = 1; s <= steps; ++s) {
          for (i = 0; i < n[t]; ++i) g[i] = rule_grad(t, s, i);
          adamw_torch_ref(p[t], m[t], v[t], g, n[t], s, 0.01, 0.9, 0.999, 1e-8, 1e-2);
        }
      }
      EXPECT_RC(rule_open(dir, &store), STRATA_OK);
      if (store == NULL) continue;
      rule_options(&oo, tiers[ti]);
      EXPECT_RC(strata_optimizer_create(store, &oo, 1, &opt), STRATA_OK);
      if (opt != NULL) {
        for (t = 0; t < 2; ++t) {
          EXPECT_RC(strata_optimizer_step_count(opt, (uint32_t)t, &step), STRATA_OK);
          EXPECT(step == steps);
          EXPECT_RC(strata_optimizer_read_param(opt, (uint32_t)t, out, 0, (uint64_t)n[t]),
                    STRATA_OK);
          for (i = 0; i < n[t]; ++i) same &= memcmp(&out[i], &p[t][i], sizeof(float)) == 0;
        }
        if (!same) fprintf(stderr, "resume rule: %s/%s differs\n", tiers[ti], endings[ei]);
        EXPECT(same);
        EXPECT_RC(strata_optimizer_close(opt), STRATA_OK);
      }
      EXPECT_RC(strata_store_close(store), STRATA_OK);
    }
  }
}

static void test_optimizer(const char* dir) {
  enum { N = 5000 };
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_store_t* store = NULL;
  strata_optimizer_t* opt = NULL;
  strata_step_stats_t stats;
  static float init[N], grad[N], out[N];
  static double p[N], m[N], v[N];
  uint32_t h = 99;
  int64_t step = -1;
  int i, s;
  double maxdiff = 0.0;

  set_store_options(&o, dir, 64, 16, 0);
  EXPECT_RC(strata_store_open(&o, &store), STRATA_OK);
  if (store == NULL) return;
  oo.optimizer = "adamw";
  oo.lr = 0.01;
  oo.weight_decay = 0.1;
  oo.sub_group_numel = 1024; /* does not divide N: 5 sub-groups, the last partial */
  oo.num_buffers = 2;
  oo.num_threads = 1;
  oo.lr = -1.0;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_INVALID_ARGUMENT);
  oo.lr = 0.01;
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_OK);
  if (opt == NULL) return;
  for (i = 0; i < N; ++i) {
    init[i] = (float)((i % 97) - 48) / 50.0f;
    p[i] = init[i];
    m[i] = v[i] = 0.0;
  }
  EXPECT_RC(strata_optimizer_add_param(opt, "layer.weight", N, init, STRATA_PLACEMENT_NVME, &h),
            STRATA_OK);
  EXPECT(h == 0);
  /* numel * 4 bytes overflows 64 bits: refused, nothing added (h unchanged). */
  EXPECT_RC(strata_optimizer_add_param(opt, "huge", (uint64_t)1 << 62, NULL,
                                       STRATA_PLACEMENT_NVME, &h),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(strata_last_error(), "'huge' has numel 4611686018427387904") != NULL);
  EXPECT(h == 0);
  EXPECT_RC(strata_optimizer_find_param(opt, "huge", &h), STRATA_ERR_NOT_FOUND);
  h = 0;
  for (s = 1; s <= 3; ++s) {
    for (i = 0; i < N; ++i) grad[i] = (float)(((i * 31 + s * 17) % 101) - 50) / 100.0f;
    EXPECT_RC(strata_optimizer_set_grad(opt, h, grad, STRATA_FLOAT32), STRATA_OK);
    EXPECT_RC(strata_optimizer_step(opt, 0.0, 1.0f, &stats), STRATA_OK);
    EXPECT(stats.skipped == 0 && stats.numel_updated == N);
    EXPECT(stats.bytes_read == (uint64_t)N * 12 && stats.bytes_written == (uint64_t)N * 12);
    adamw_ref(p, m, v, grad, N, s, 0.01, 0.9, 0.999, 1e-8, 0.1);
  }
  EXPECT_RC(strata_optimizer_read_param(opt, h, out, 0, N), STRATA_OK);
  for (i = 0; i < N; ++i) {
    double d = fabs(out[i] - p[i]);
    if (d > maxdiff) maxdiff = d;
  }
  EXPECT(maxdiff <= 2e-6);
  EXPECT_RC(strata_optimizer_step_count(opt, h, &step), STRATA_OK);
  EXPECT(step == 3);
  EXPECT_RC(strata_optimizer_set_grad(opt, 7, grad, STRATA_FLOAT32), STRATA_ERR_OUT_OF_RANGE);
  EXPECT_RC(strata_optimizer_set_grad(opt, h, grad, STRATA_INT32), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(strata_optimizer_checkpoint(opt), STRATA_OK);
  strata_optimizer_free(opt);
  opt = NULL;
  /* A second create under the same prefix: the checkpoint exists. */
  EXPECT_RC(strata_optimizer_create(store, &oo, 0, &opt), STRATA_ERR_ALREADY_EXISTS);
  /* the message names the C call that resumes it, not a C++ one */
  EXPECT(strstr(strata_last_error(), "strata_optimizer_create with resume = 1") != NULL);
  EXPECT(strstr(strata_last_error(), "::") == NULL);
  EXPECT_RC(strata_optimizer_create(store, &oo, 1, &opt), STRATA_OK);
  if (opt != NULL) {
    h = 99;
    EXPECT_RC(strata_optimizer_find_param(opt, "layer.weight", &h), STRATA_OK);
    EXPECT(h == 0);
    EXPECT_RC(strata_optimizer_find_param(opt, "nope", &h), STRATA_ERR_NOT_FOUND);
    EXPECT_RC(strata_optimizer_step_count(opt, 0, &step), STRATA_OK);
    EXPECT(step == 3);
    memset(init, 0, sizeof init);
    EXPECT_RC(strata_optimizer_read_param(opt, 0, init, 0, N), STRATA_OK);
    EXPECT(memcmp(init, out, sizeof out) == 0);
    strata_optimizer_free(opt);
  }
  test_optimizer_torch_arithmetic(store);
  test_set_hyperparams(store);
  EXPECT_RC(strata_optimizer_close(NULL), STRATA_OK);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}

static void test_comm(void) {
  strata_comm_t* comm = NULL;
  char port[16];
  float a[3] = {1.0f, 2.0f, 3.0f}, b[3] = {0};
  unsetenv("MASTER_ADDR");
  EXPECT_RC(strata_comm_init_from_env(STRATA_BACKEND_GLOO, &comm), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(strata_last_error(), "MASTER_ADDR") != NULL);
  snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  EXPECT_RC(strata_comm_init_from_env(STRATA_BACKEND_GLOO, &comm), STRATA_OK);
  if (comm == NULL) return;
  EXPECT(strata_comm_rank(comm) == 0 && strata_comm_size(comm) == 1);
  EXPECT_RC(strata_comm_all_reduce(comm, a, b, 3, STRATA_FLOAT32, 0), STRATA_OK);
  EXPECT(b[0] == 1.0f && b[1] == 2.0f && b[2] == 3.0f);
  memset(b, 0, sizeof b);
  EXPECT_RC(strata_comm_all_gather(comm, a, b, 3, STRATA_FLOAT32), STRATA_OK);
  EXPECT(b[0] == 1.0f && b[1] == 2.0f && b[2] == 3.0f);
  EXPECT_RC(strata_comm_barrier(comm), STRATA_OK);
  strata_comm_free(comm);
}

/* strata_store_open_config(): the file's values (a 4 KiB host budget: a 64 KiB host-tier put
 * is refused), an explicit field over them, and an unknown key refused naming it. */
static void test_config(const char* dir) {
  char file[300], root[300];
  FILE* f;
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  strata_store_t* store = NULL;
  static uint8_t buf[65536];
  int64_t shape[1] = {65536};
  snprintf(file, sizeof file, "%s.json", dir);
  snprintf(root, sizeof root, "%s/a", dir);
  f = fopen(file, "w");
  EXPECT(f != NULL);
  if (f == NULL) return;
  fputs("{\"strata_config\": 1, \"store\": {\"host_budget_bytes\": 4096, "
        "\"staging_bytes\": \"1MiB\"}}\n", f);
  fclose(f);
  o.path = root;
  EXPECT_RC(strata_store_open_config(file, &o, &store), STRATA_OK);
  EXPECT_RC(strata_store_put(store, "h", buf, STRATA_UINT8, 1, shape, STRATA_TIER_HOST, 0),
            STRATA_ERR_RESOURCE_EXHAUSTED);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
  o.host_budget_bytes = 1u << 20; /* the argument wins over the file */
  EXPECT_RC(strata_store_open_config(file, &o, &store), STRATA_OK);
  EXPECT_RC(strata_store_put(store, "h", buf, STRATA_UINT8, 1, shape, STRATA_TIER_HOST, 0),
            STRATA_OK);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
  f = fopen(file, "w");
  if (f == NULL) return;
  fputs("{\"store\": {\"host_budget\": 4096}}\n", f);
  fclose(f);
  store = NULL;
  EXPECT_RC(strata_store_open_config(file, &o, &store), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(store == NULL);
  EXPECT(strstr(strata_last_error(), "unknown key 'store.host_budget'") != NULL);
  EXPECT(strstr(strata_last_error(), file) != NULL);
  remove(file);
}

int main(int argc, char** argv) {
  char tmpl[] = "/tmp/strata-c-consumer-XXXXXX";
  char sub[256];
  char cmd[300];
  if (argc == 5 && strcmp(argv[1], "child") == 0) return rule_child(argv[2], argv[3], argv[4]);
  if (mkdtemp(tmpl) == NULL) return 1;
  EXPECT(strcmp(strata_status_name(STRATA_ERR_NOT_FOUND), "NotFound") == 0);
  EXPECT(strata_dtype_size(STRATA_BFLOAT16) == 2 && strata_dtype_size(STRATA_INT64) == 8);
  snprintf(sub, sizeof sub, "%s/store", tmpl);
  test_store(sub);
  snprintf(sub, sizeof sub, "%s/stats", tmpl);
  test_stats(sub);
  snprintf(sub, sizeof sub, "%s/damage", tmpl);
  test_damage(sub);
  snprintf(sub, sizeof sub, "%s/optim", tmpl);
  test_optimizer(sub);
  snprintf(sub, sizeof sub, "%s/config", tmpl);
  test_config(sub);
  test_resume_rule(argv[0], tmpl);
  snprintf(sub, sizeof sub, "%s/v6", tmpl);
  test_api_v6(sub);
  snprintf(sub, sizeof sub, "%s/v7", tmpl);
  test_api_v7(sub);
  snprintf(sub, sizeof sub, "%s/v8", tmpl);
  test_api_v8(sub);
  test_comm();
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpl);
  if (failures != 0) {
    printf("c consumer: %d failures\n", failures);
    return 1;
  }
  printf("c consumer ok\n");
  return 0;
}
