/* The C API's version-7 surface, as a C99 client uses it: pinned pools that grow on demand
 * (pinned_initial_bytes, pinned_grow_bytes; committed bytes in the stats), a framework's
 * pinned-memory allocator (every segment from it with exact sizes, each freed by close;
 * bad allocators give their errors) and a framework's CUDA stream (its checks: no GPU
 * here means INVALID_ARGUMENT naming the option). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "strata/strata.h"

#define MIB ((uint64_t)1 << 20)

/* A counting allocator over posix_memalign; mode 1 returns NULL. */
typedef struct counting {
  int mode;
  int allocs, frees;
  size_t alloc_sizes[32], free_sizes[32];
  void* blocks[32];
  int bad_free; /* a free of a block it never gave, or with another size */
} counting_t;

static void* counting_alloc(size_t nbytes, int numa_node, void* ctx) {
  counting_t* c = (counting_t*)ctx;
  void* p = NULL;
  (void)numa_node;
  if (c->allocs < 32) c->alloc_sizes[c->allocs] = nbytes;
  if (c->mode == 1) {
    ++c->allocs;
    return NULL;
  }
  if (posix_memalign(&p, 2 * MIB, nbytes) != 0) p = NULL;
  if (c->allocs < 32) c->blocks[c->allocs] = p;
  ++c->allocs;
  return p;
}

static void counting_free(void* p, size_t nbytes, void* ctx) {
  counting_t* c = (counting_t*)ctx;
  int i, found = 0;
  for (i = 0; i < c->allocs && i < 32; ++i) {
    if (c->blocks[i] == p && p != NULL) {
      found = c->alloc_sizes[i] == nbytes;
      c->blocks[i] = NULL;
    }
  }
  if (!found) ++c->bad_free;
  if (c->frees < 32) c->free_sizes[c->frees] = nbytes;
  ++c->frees;
  free(p);
}

static void v7_options(strata_store_options_t* o, const char* dir, counting_t* c) {
  strata_store_options_t init = STRATA_STORE_OPTIONS_INIT;
  *o = init;
  o->path = dir;
  o->host_budget_bytes = 16 * MIB;
  o->staging_bytes = 4 * MIB;
  o->chunk_bytes = MIB;
  o->worker_threads = 2;
  o->pinned_initial_bytes = 2 * MIB;
  o->pinned_grow_bytes = 4 * MIB;
  if (c != NULL) {
    o->pinned_alloc = counting_alloc;
    o->pinned_free = counting_free;
    o->pinned_alloc_ctx = c;
  }
}

void test_api_v7(const char* dir) {
  strata_store_options_t o;
  strata_store_t* store = NULL;
  strata_store_stats_t st = STRATA_STORE_STATS_INIT;
  counting_t c;
  static uint8_t data[3 << 20], back[3 << 20];
  int64_t shape[1];
  int i, at_open, dummy_stream = 0;
  uint64_t groups;
  strata_status_t rc;

  EXPECT(STRATA_C_API_VERSION >= 7 && strata_c_api_version() == STRATA_C_API_VERSION);

  /* Defaults: the fields start undefined and the library's defaults apply. */
  {
    strata_store_options_t d = STRATA_STORE_OPTIONS_INIT;
    EXPECT(d.pinned_initial_bytes == STRATA_UNDEF_U64 && d.pinned_grow_bytes == STRATA_UNDEF_U64);
    EXPECT(d.pinned_alloc == NULL && d.pinned_free == NULL && d.cuda_stream == NULL);
  }

  /* Growth and the allocator. */
  memset(&c, 0, sizeof c);
  v7_options(&o, dir, &c);
  EXPECT_RC(strata_store_open(&o, &store), STRATA_OK);
  if (store == NULL) return;
  EXPECT_RC(strata_store_stats(store, &st), STRATA_OK);
  groups = st.staging_pool_capacity_bytes / (4 * MIB);
  EXPECT(groups >= 1 && st.staging_pool_capacity_bytes == groups * 4 * MIB);
  EXPECT(st.host_pool_committed_bytes == 2 * MIB);
  EXPECT(st.staging_pool_committed_bytes == groups * 2 * MIB);
  at_open = c.allocs;
  EXPECT(at_open == (int)groups + 1);
  for (i = 0; i < at_open; ++i) EXPECT(c.alloc_sizes[i] == 2 * MIB);
  for (i = 0; i < (int)sizeof data; ++i) data[i] = (uint8_t)(i * 7 + (i >> 11));
  shape[0] = (int64_t)sizeof data;
  EXPECT_RC(strata_store_put(store, "h", data, STRATA_UINT8, 1, shape, STRATA_TIER_HOST, 0),
            STRATA_OK);
  EXPECT_RC(strata_store_stats(store, &st), STRATA_OK);
  EXPECT(st.host_pool_committed_bytes == 6 * MIB); /* + one 4 MiB segment */
  EXPECT(c.allocs == at_open + 1 && c.alloc_sizes[at_open] == 4 * MIB);
  EXPECT_RC(strata_store_get(store, "h", back, sizeof back), STRATA_OK);
  EXPECT(memcmp(data, back, sizeof data) == 0);
  /* No GPU here: a stream is refused; NULL (strata's own streams) is fine. */
  EXPECT_RC(strata_store_set_cuda_stream(store, NULL), STRATA_OK);
  EXPECT_RC(strata_store_set_cuda_stream(NULL, NULL), STRATA_ERR_INVALID_ARGUMENT);
  rc = strata_store_set_cuda_stream(store, &dummy_stream);
  if (rc != STRATA_OK) {
    EXPECT(rc == STRATA_ERR_INVALID_ARGUMENT && LAST_ERROR_HAS("device_stream"));
  } else {
    EXPECT_RC(strata_store_set_cuda_stream(store, NULL), STRATA_OK);
  }
  EXPECT(c.frees == 0);
  EXPECT_RC(strata_store_close(store), STRATA_OK);
  store = NULL;
  EXPECT(c.frees == c.allocs && c.bad_free == 0);

  /* Bad allocators. */
  memset(&c, 0, sizeof c);
  v7_options(&o, dir, &c);
  o.pinned_free = NULL;
  EXPECT_RC(strata_store_open(&o, &store), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(store == NULL && LAST_ERROR_HAS("pinned_free"));
  v7_options(&o, dir, &c);
  c.mode = 1;
  EXPECT_RC(strata_store_open(&o, &store), STRATA_ERR_RESOURCE_EXHAUSTED);
  EXPECT(store == NULL && LAST_ERROR_HAS("staging pool") && LAST_ERROR_HAS("2097152 bytes"));
  EXPECT(c.frees == 0);
  v7_options(&o, dir, NULL);
  o.pinned_grow_bytes = 0;
  EXPECT_RC(strata_store_open(&o, &store), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT(store == NULL && LAST_ERROR_HAS("pinned_grow_bytes"));

  /* A stream at open, without a GPU. */
  v7_options(&o, dir, NULL);
  o.cuda_stream = &dummy_stream;
  rc = strata_store_open(&o, &store);
  if (rc != STRATA_OK) {
    EXPECT(rc == STRATA_ERR_INVALID_ARGUMENT && LAST_ERROR_HAS("device_stream"));
  }
  EXPECT_RC(strata_store_close(store), STRATA_OK);
}
