/* A C API program for the CPU-only-host tests (tests/base/gpu_libraries/check.cmake): run
 * where the CUDA runtime and NCCL cannot be loaded, it must start (libstrata_c.so needs
 * neither) and do a store and optimizer round trip on the host and NVMe tiers, while a
 * device-tier put fails cleanly with a message containing argv[2] (why the CUDA runtime was
 * not loaded; "-" skips that check).
 *   cpu_only_host STORE_DIR EXPECTED_DEVICE_ERROR_SUBSTRING
 * Prints "cpu_only_host: OK" and exits 0, or prints what differed and exits 1. */
#include <stdio.h>
#include <string.h>

#include "strata/strata.h"

static int failures = 0;

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, strata_last_error());                                             \
      ++failures;                                                                      \
    }                                                                                  \
  } while (0)

int main(int argc, char** argv) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  strata_store_t* store = NULL;
  strata_optimizer_options_t oo = STRATA_OPTIMIZER_OPTIONS_INIT;
  strata_optimizer_t* opt = NULL;
  const float src[6] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  float dst[6];
  const int64_t shape[2] = {2, 3};
  const float init[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const float grad[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  const float want[4] = {0.5f, 1.5f, 2.5f, 3.5f}; /* SGD, lr 0.5: exact in fp32 */
  float got[4];
  uint32_t param = 0;
  strata_status_t rc;
  if (argc != 3) {
    fprintf(stderr, "usage: %s STORE_DIR EXPECTED_DEVICE_ERROR_SUBSTRING\n", argv[0]);
    return 2;
  }
  o.path = argv[1];
  o.host_budget_bytes = 16u << 20;
  o.staging_bytes = 8u << 20;
  CHECK(strata_store_open(&o, &store) == STRATA_OK);
  if (store == NULL) return 1;

  CHECK(strata_store_put(store, "nvme", src, STRATA_FLOAT32, 2, shape, STRATA_TIER_NVME, 0) ==
        STRATA_OK);
  memset(dst, 0, sizeof dst);
  CHECK(strata_store_get(store, "nvme", dst, sizeof dst) == STRATA_OK);
  CHECK(memcmp(src, dst, sizeof src) == 0);
  CHECK(strata_store_put(store, "host", src, STRATA_FLOAT32, 2, shape, STRATA_TIER_HOST, 0) ==
        STRATA_OK);
  memset(dst, 0, sizeof dst);
  CHECK(strata_store_get(store, "host", dst, sizeof dst) == STRATA_OK);
  CHECK(memcmp(src, dst, sizeof src) == 0);

  /* No GPU: the device tier refuses, saying why the CUDA runtime is not there. */
  rc = strata_store_put(store, "dev", src, STRATA_FLOAT32, 2, shape, STRATA_TIER_DEVICE, 0);
  CHECK(rc != STRATA_OK);
  printf("device-tier put: %s: %s\n", strata_status_name(rc), strata_last_error());
  if (strcmp(argv[2], "-") != 0) CHECK(strstr(strata_last_error(), argv[2]) != NULL);

  oo.optimizer = "sgd";
  oo.lr = 0.5;
  CHECK(strata_optimizer_create(store, &oo, 0, &opt) == STRATA_OK);
  if (opt != NULL) {
    CHECK(strata_optimizer_add_param(opt, "w", 4, init, STRATA_PLACEMENT_HOST, &param) ==
          STRATA_OK);
    CHECK(strata_optimizer_set_grad(opt, param, grad, STRATA_FLOAT32) == STRATA_OK);
    CHECK(strata_optimizer_step(opt, 0.0, 1.0f, NULL) == STRATA_OK);
    memset(got, 0, sizeof got);
    CHECK(strata_optimizer_read_param(opt, param, got, 0, 4) == STRATA_OK);
    CHECK(memcmp(got, want, sizeof want) == 0);
    CHECK(strata_optimizer_close(opt) == STRATA_OK);
  }
  CHECK(strata_store_close(store) == STRATA_OK);
  if (failures != 0) {
    fprintf(stderr, "cpu_only_host: %d check(s) failed\n", failures);
    return 1;
  }
  printf("cpu_only_host: OK\n");
  return 0;
}
