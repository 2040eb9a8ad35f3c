/* The C consumer's checks (main.c, api_v6.c): EXPECT / EXPECT_RC count failures in
 * `failures` (defined in main.c) and print the expression, the codes and strata's last
 * error. */
#ifndef STRATA_C_CONSUMER_CHECK_H
#define STRATA_C_CONSUMER_CHECK_H

#include <stdio.h>

#include "strata/strata.h"

extern int failures;

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: expected %s (last error: %s)\n", __FILE__,      \
              __LINE__, #cond, strata_last_error());                          \
      ++failures;                                                             \
    }                                                                         \
  } while (0)

#define EXPECT_RC(expr, want)                                                 \
  do {                                                                        \
    strata_status_t rc_ = (expr);                                             \
    if (rc_ != (want)) {                                                      \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", \
              __FILE__, __LINE__, #expr, strata_status_name(rc_),             \
              strata_status_name(want), strata_last_error());                 \
      ++failures;                                                             \
    }                                                                         \
  } while (0)

/* True when strata's last error contains `part`. */
#define LAST_ERROR_HAS(part) (strstr(strata_last_error(), (part)) != NULL)

/* api_v6.c: the version-6 surface (custom rules, param groups, state access, step options
 * and the async step, byte ranges, eviction and pinning); `dir` is a fresh directory. */
void test_api_v6(const char* dir);
/* api_v7.c: the version-7 surface (growing pinned pools, a pinned-memory allocator, a CUDA
 * stream's checks); `dir` is a fresh directory. */
void test_api_v7(const char* dir);
/* api_v8.c: the version-8 surface (bf16 optimizer states: strata_optimizer_options_t's
 * state_dtype); `dir` is a fresh directory. */
void test_api_v8(const char* dir);

#endif
