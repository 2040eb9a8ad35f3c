/* strata — C API (C99). Link with -lstrata_c (CMake: strata::c). The library is shared:
 * with a prefix outside the loader's paths, link with -Wl,-rpath,$PREFIX/lib (or set
 * LD_LIBRARY_PATH) so that the program finds libstrata_c.so when it runs; CMake's
 * strata::c sets the build tree's RPATH itself.
 *
 * Conventions
 *  - Every fallible function returns a strata_status_t: STRATA_OK (0) on success, otherwise
 *    one of the codes below, which are 1:1 with the C++ strata::StatusCode values
 *    (docs/errors.md). On failure the calling thread's last-error message (what went wrong,
 *    naming the key, path, offset or option at fault) is available from strata_last_error()
 *    and the errno of a failed OS call from strata_last_errno(); both are thread-local and
 *    stay valid until the next strata call on the same thread that fails. A successful call
 *    does not clear them.
 *  - Objects are opaque handles created by *_open / *_create / *_init functions and released
 *    by the matching *_close / *_free / *_destroy function, which frees the handle (also
 *    when it returns an error). After that call the pointer is dangling, exactly like a
 *    pointer passed to free(): passing it to any strata function is undefined behaviour
 *    (no error code can be promised). Set your variable to NULL after closing; passing
 *    NULL where a handle is required returns STRATA_ERR_INVALID_ARGUMENT, and the
 *    close/free functions accept NULL as a no-op.
 *  - Options are versioned structs: always initialize them with their *_INIT macro, then set
 *    the fields you need. The first field, struct_size, lets a newer library accept a
 *    struct compiled against an older header. Fields left at STRATA_UNDEF_* take the
 *    library default (seeded from the STRATA_* environment variables, see each field).
 *  - Asynchronous calls (*_async) return a strata_future_t. Every buffer passed to them must
 *    stay valid (and, for sources, unmodified) until the future is ready (strata_future_poll
 *    reports 1 or strata_future_wait returned). Freeing a future does not cancel its work.
 *  - Thread-safety: a store, optimizer and communicator handle may be used from several
 *    threads at once unless stated otherwise; a handle must not be used concurrently with its
 *    own close/free call.
 */
#ifndef STRATA_STRATA_H_
#define STRATA_STRATA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define STRATA_C_API __attribute__((visibility("default")))
#else
#define STRATA_C_API
#endif

/** Version of this header's structs and functions.
 *  2: strata_object_info_t.damaged and strata_store_object_damage().
 *  3: strata_optimizer_options_t.arithmetic.
 *  4: strata_optimizer_close() (free returning the final checkpoint's status),
 *     strata_optimizer_set_hyperparams() and strata_optimizer_hyperparam().
 *  5: strata_store_stats(), strata_store_reset_stats(), strata_optimizer_stats().
 *  6: custom update rules (strata_rule_t, strata_optimizer_options_t.rule); param groups
 *     (strata_optimizer_add_param_group() and friends); optimizer state access
 *     (read/write of masters and states, step counters, param info); step options and
 *     strata_optimizer_step_async(); strata_store_read_range(), write_range(), evict(),
 *     pin() and unpin().
 *  7: strata_store_options_t.pinned_initial_bytes and pinned_grow_bytes (pinned pools that
 *     grow on demand), pinned_alloc / pinned_free / pinned_alloc_ctx /
 *     pinned_alloc_cuda_registered (a framework's pinned-memory allocator), cuda_stream
 *     and strata_store_set_cuda_stream() (a framework's CUDA stream for device-tier
 *     copies); strata_store_stats_t.host_pool_committed_bytes and
 *     staging_pool_committed_bytes.
 *  8: strata_optimizer_options_t.state_dtype (bf16 optimizer states). */
#define STRATA_C_API_VERSION 8

/* ---- status codes, errors ------------------------------------------------------------- */

/** Ends every enum of this API: two enumerators (not values to pass) that make every int a
 *  value of the type. A C caller may pass any int where an enum is expected, and the library
 *  (C++) then reports an invalid value instead of having undefined behaviour: in C++ an
 *  enum without them holds only the values its enumerators' bits span. */
#define STRATA_ENUM_SPANS_INT(prefix) \
  prefix##_INT_MIN_ = -2147483647 - 1, prefix##_INT_MAX_ = 2147483647

/** Status codes; values equal strata::StatusCode (docs/errors.md). */
typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_ERR_INVALID_ARGUMENT = 1,    /**< bad argument, option, dtype, shape or size */
  STRATA_ERR_NOT_FOUND = 2,           /**< key, path or object absent */
  STRATA_ERR_ALREADY_EXISTS = 3,      /**< key present and overwrite not requested */
  STRATA_ERR_OUT_OF_RANGE = 4,        /**< offset/length past the end */
  STRATA_ERR_RESOURCE_EXHAUSTED = 5,  /**< a budget or a device (ENOSPC) is full */
  STRATA_ERR_FAILED_PRECONDITION = 6, /**< wrong state: store locked by another process */
  STRATA_ERR_DATA_LOSS = 7,           /**< checksum mismatch, truncated file */
  STRATA_ERR_UNAVAILABLE = 8,         /**< peer or service gone */
  STRATA_ERR_IO = 9,                  /**< an OS call failed (strata_last_errno) */
  STRATA_ERR_DEADLINE_EXCEEDED = 10,  /**< a wait timed out */
  STRATA_ERR_CANCELLED = 11,          /**< work abandoned */
  STRATA_ERR_UNIMPLEMENTED = 12,      /**< feature not built (e.g. CUDA) */
  STRATA_ERR_INTERNAL = 13,           /**< a strata bug */
  STRATA_ERR_PERMISSION_DENIED = 14,  /**< EACCES / EPERM / EROFS */
  STRATA_ENUM_SPANS_INT(STRATA_STATUS)
} strata_status_t;

/** Message of the last failed strata call on this thread ("NotFound: key 'w' ..."), or ""
 *  when none failed yet. Valid until the next failing call on this thread. Never NULL. */
STRATA_C_API const char* strata_last_error(void);
/** errno of the last failed OS call reported on this thread (0 when none). */
STRATA_C_API int strata_last_errno(void);
/** Name of a status code ("OK", "NotFound", ...); "Unknown" for other values. Static. */
STRATA_C_API const char* strata_status_name(strata_status_t status);
/** STRATA_C_API_VERSION of the library that is linked (compare with the header's). */
STRATA_C_API int strata_c_api_version(void);

/* ---- element types, tiers --------------------------------------------------------------- */

/** Element types; values equal strata::DType. */
typedef enum strata_dtype {
  STRATA_FLOAT32 = 0,
  STRATA_FLOAT16 = 1,
  STRATA_BFLOAT16 = 2,
  STRATA_FLOAT64 = 3,
  STRATA_INT8 = 4,
  STRATA_INT16 = 5,
  STRATA_INT32 = 6,
  STRATA_INT64 = 7,
  STRATA_UINT8 = 8,
  STRATA_BOOL = 9,
  STRATA_ENUM_SPANS_INT(STRATA_DTYPE)
} strata_dtype_t;

/** Bytes per element of `dtype` (0 for an invalid value). */
STRATA_C_API size_t strata_dtype_size(strata_dtype_t dtype);

/** Memory tiers, fastest first; values equal strata::Tier. */
typedef enum strata_tier {
  STRATA_TIER_DEVICE = 0, /**< GPU HBM (CUDA builds with a GPU only) */
  STRATA_TIER_HOST = 1,   /**< pinned host DRAM */
  STRATA_TIER_NVME = 2,   /**< data files in the NVMe directories */
  STRATA_ENUM_SPANS_INT(STRATA_TIER)
} strata_tier_t;

/** "device" / "host" / "nvme" ("invalid" otherwise). Static. */
STRATA_C_API const char* strata_tier_name(strata_tier_t tier);

/** Most dimensions a tensor may have in this API. */
#define STRATA_MAX_NDIM 8

/** "Use the library default" markers of option fields. */
#define STRATA_UNDEF_U64 UINT64_MAX
#define STRATA_UNDEF_INT INT32_MIN
#define STRATA_UNDEF_DOUBLE (-1.0e300)

/* ---- futures ---------------------------------------------------------------------------- */

typedef struct strata_future strata_future_t;

/** Sets *ready to 1 when the future's result is available, else 0. Never blocks. */
STRATA_C_API strata_status_t strata_future_poll(strata_future_t* future, int* ready);
/** Blocks until the result is available and returns it: STRATA_OK or the operation's error
 *  (with strata_last_error set). May be called any number of times. */
STRATA_C_API strata_status_t strata_future_wait(strata_future_t* future);
/** As strata_future_wait, but waits at most `timeout_ms` milliseconds; returns
 *  STRATA_ERR_DEADLINE_EXCEEDED when the result is not available by then (the operation
 *  keeps running). */
STRATA_C_API strata_status_t strata_future_wait_for(strata_future_t* future, int64_t timeout_ms);
/** Releases the handle (NULL is a no-op). The operation is not cancelled: its buffers must
 *  stay valid until it completes, which can no longer be observed — wait first. */
STRATA_C_API void strata_future_free(strata_future_t* future);

/* ---- store ------------------------------------------------------------------------------ */

typedef struct strata_store strata_store_t;

/** Options of strata_store_open(). Initialize with STRATA_STORE_OPTIONS_INIT. */
typedef struct strata_store_options {
  size_t struct_size; /**< sizeof(strata_store_options_t); set by the INIT macro */
  int version;        /**< STRATA_C_API_VERSION; set by the INIT macro */
  /** Root directory (catalog, lock file); created when absent and `create`. Required. */
  const char* path;
  /** NVMe directories (one per drive) over which chunks are striped; NULL/0 = {path}. */
  const char* const* nvme_dirs;
  size_t num_nvme_dirs;
  /** Pinned DRAM for host-tier objects, bytes. Default 1 GiB (STRATA_HOST_BUDGET). */
  uint64_t host_budget_bytes;
  /** NVMe tier budget, bytes, 0 = unlimited. Default 0 (STRATA_NVME_BUDGET). */
  uint64_t nvme_budget_bytes;
  /** GPU budget, bytes, 0 = half the free memory. Default 0 (STRATA_DEVICE_BUDGET). */
  uint64_t device_budget_bytes;
  /** Chunk size of a new store, bytes, multiple of 4096. Default 64 MiB (STRATA_CHUNK_SIZE). */
  uint64_t chunk_bytes;
  /** Pinned staging memory, bytes. Default 256 MiB (STRATA_STAGING_BYTES). */
  uint64_t staging_bytes;
  /** 1/0: verify checksums on NVMe reads. Default 1 (STRATA_VERIFY). */
  int verify_checksums;
  /** 1: NVMe puts are committed by flush/close only; 0: each put. Default 0. */
  int durability_on_flush;
  /** 1: open without the write lock, mutating calls fail. Default 0. */
  int read_only;
  /** 1: create the store when absent. Default 1. */
  int create;
  /** Threads running store operations. Default 4. */
  int worker_threads;
  /** NUMA placement: -1 automatic (each NVMe directory's staging memory and I/O threads on
   *  its drive's node, the host tier near the GPU), -2 no binding, N everything on node N.
   *  Default -1. */
  int numa_node;
  /** CUDA device of the device tier. Default 0. */
  int device_id;
  /* ---- STRATA_C_API_VERSION 7 ---- */
  /** Pinned memory each of the store's pools (staging per NUMA node, host tier) commits at
   *  open, bytes, rounded up to 2 MiB; the pools grow on demand up to staging_bytes /
   *  host_budget_bytes. 0 = none until first use. Default 8 MiB (STRATA_PINNED_INITIAL). */
  uint64_t pinned_initial_bytes;
  /** Least bytes a pool commits when it grows, > 0. Default 64 MiB (STRATA_PINNED_GROW). */
  uint64_t pinned_grow_bytes;
  /** A framework's pinned-memory allocator, used for every segment of the store's pools
   *  instead of mmap: pinned_alloc(nbytes, numa_node, ctx) returns nbytes (a multiple of
   *  2 MiB) aligned to >= 4096 bytes, or NULL (the open or the operation that needed the
   *  memory then fails with RESOURCE_EXHAUSTED naming the pool and size); pinned_free(p,
   *  nbytes, ctx) gets each block back with the same nbytes, at strata_store_close() at the
   *  latest. Both or neither (INVALID_ARGUMENT); misaligned memory is freed again and is
   *  INVALID_ARGUMENT. strata does not mlock or touch the blocks; it registers them with
   *  io_uring, and with CUDA unless pinned_alloc_cuda_registered is 1 (cudaHostAlloc
   *  memory). Called from strata's threads, never concurrently for one pool. Default NULL. */
  void* (*pinned_alloc)(size_t nbytes, int numa_node, void* ctx);
  void (*pinned_free)(void* p, size_t nbytes, void* ctx);
  void* pinned_alloc_ctx; /**< passed to both, untouched. Default NULL */
  /** 1: the allocator's memory is already registered with CUDA. Default 0. */
  int pinned_alloc_cuda_registered;
  /** A cudaStream_t (as void*) on which the store orders its device-tier copies instead of
   *  its own streams; it must belong to device_id's context and outlive the store. NULL =
   *  the store's own. INVALID_ARGUMENT at open without a GPU / in a build without CUDA.
   *  Default NULL. See also strata_store_set_cuda_stream(). */
  void* cuda_stream;
} strata_store_options_t;

#define STRATA_STORE_OPTIONS_INIT                                                      \
  {                                                                                    \
    sizeof(strata_store_options_t), STRATA_C_API_VERSION, NULL, NULL, 0,               \
        STRATA_UNDEF_U64, STRATA_UNDEF_U64, STRATA_UNDEF_U64, STRATA_UNDEF_U64,        \
        STRATA_UNDEF_U64, STRATA_UNDEF_INT, STRATA_UNDEF_INT, STRATA_UNDEF_INT,        \
        STRATA_UNDEF_INT, STRATA_UNDEF_INT, STRATA_UNDEF_INT, STRATA_UNDEF_INT,        \
        STRATA_UNDEF_U64, STRATA_UNDEF_U64, NULL, NULL, NULL, 0, NULL                  \
  }

/** Opens (or creates) the store described by `options` and takes its write lock.
 *  \error INVALID_ARGUMENT (NULL/uninitialized options, bad values), FAILED_PRECONDITION
 *      (locked by another process), NOT_FOUND (absent and !create), DATA_LOSS, IO. */
STRATA_C_API strata_status_t strata_store_open(const strata_store_options_t* options,
                                               strata_store_t** store);
/** As strata_store_open(), with the options seeded from the configuration file
 *  `config_file` (JSON, docs/configuration.md; NULL or "" = $STRATA_CONFIG, which
 *  strata_store_open() reads too): built-in defaults < the file < STRATA_* variables < the
 *  fields of `options` that are set. strata_optimizer_create() on the store takes its
 *  defaults from the file's "optimizer" section.
 *  \error as strata_store_open(); INVALID_ARGUMENT naming the key path and the file for an
 *      unknown key or a bad value, or the line and column of malformed JSON; NOT_FOUND
 *      (IO, PERMISSION_DENIED) naming the file when it cannot be read. */
STRATA_C_API strata_status_t strata_store_open_config(const char* config_file,
                                                      const strata_store_options_t* options,
                                                      strata_store_t** store);
/** Orders the store's device-tier copies on `cuda_stream` (a cudaStream_t as void*) from the
 *  next copy on; NULL = back to the store's own streams (as options.cuda_stream at open).
 *  The stream must belong to the store's device and outlive its use. Since version 7.
 *  Thread-safe. \error INVALID_ARGUMENT (NULL store; a stream where the store has no GPU or
 *  strata was built without CUDA). */
STRATA_C_API strata_status_t strata_store_set_cuda_stream(strata_store_t* store, void* cuda_stream);
/** Flushes, releases the lock and frees the handle (NULL is a no-op returning OK). The
 *  handle is freed even when the flush fails (the error is returned, and dirty host/device
 *  objects that could not be written back are dropped): call strata_store_flush() first to
 *  handle a failed write-back (e.g. remove objects and flush again) while the store is open. */
STRATA_C_API strata_status_t strata_store_close(strata_store_t* store);

/** Put flags. */
#define STRATA_PUT_OVERWRITE 1u /**< replace an existing key */
#define STRATA_PUT_PIN 2u       /**< pin in its memory tier at once */

/** Writes the tensor at `src` (dtype, ndim <= STRATA_MAX_NDIM dims `shape`, row-major,
 *  numel * dtype_size bytes; ndim 0 = scalar) as object `key` into `tier`.
 *  \error ALREADY_EXISTS without STRATA_PUT_OVERWRITE; INVALID_ARGUMENT (empty key, bad
 *      dtype/shape, device tier without GPU); RESOURCE_EXHAUSTED (budget, ENOSPC); IO. */
STRATA_C_API strata_status_t strata_store_put(strata_store_t* store, const char* key,
                                              const void* src, strata_dtype_t dtype, int ndim,
                                              const int64_t* shape, strata_tier_t tier,
                                              uint32_t flags);
STRATA_C_API strata_status_t strata_store_put_async(strata_store_t* store, const char* key,
                                                    const void* src, strata_dtype_t dtype,
                                                    int ndim, const int64_t* shape,
                                                    strata_tier_t tier, uint32_t flags,
                                                    strata_future_t** future);
/** Reads object `key` (any dtype) into `dst`; `nbytes` must equal its size.
 *  \error NOT_FOUND; INVALID_ARGUMENT on a size mismatch; DATA_LOSS; IO. */
STRATA_C_API strata_status_t strata_store_get(strata_store_t* store, const char* key, void* dst,
                                              uint64_t nbytes);
STRATA_C_API strata_status_t strata_store_get_async(strata_store_t* store, const char* key,
                                                    void* dst, uint64_t nbytes,
                                                    strata_future_t** future);
/** Deletes `key` from every tier. \error NOT_FOUND. */
STRATA_C_API strata_status_t strata_store_delete(strata_store_t* store, const char* key);
/** Moves `key` to `tier` (promote keeps the NVMe copy; demote writes back).
 *  \error NOT_FOUND; RESOURCE_EXHAUSTED; FAILED_PRECONDITION (pinned object to nvme). */
STRATA_C_API strata_status_t strata_store_move(strata_store_t* store, const char* key,
                                               strata_tier_t tier);
/** Asynchronously promotes `key` to `tier` unless already there or faster. */
STRATA_C_API strata_status_t strata_store_prefetch_async(strata_store_t* store, const char* key,
                                                         strata_tier_t tier,
                                                         strata_future_t** future);
/** Makes every object durable (write-back, fdatasync, one catalog commit). */
STRATA_C_API strata_status_t strata_store_flush(strata_store_t* store);

/** Reads bytes [offset, offset + nbytes) of object `key` (any dtype; byte offsets) into
 *  `dst` from its fastest tier; whole chunks are read and verified. Since version 6.
 *  \error NOT_FOUND; OUT_OF_RANGE (the range passes the object's end, naming both);
 *      INVALID_ARGUMENT (NULL dst with nbytes > 0); DATA_LOSS; IO. */
STRATA_C_API strata_status_t strata_store_read_range(strata_store_t* store, const char* key,
                                                     uint64_t offset, uint64_t nbytes,
                                                     void* dst);
STRATA_C_API strata_status_t strata_store_read_range_async(strata_store_t* store,
                                                           const char* key, uint64_t offset,
                                                           uint64_t nbytes, void* dst,
                                                           strata_future_t** future);
/** Overwrites bytes [offset, offset + nbytes) of object `key` from `src` in whichever tier
 *  holds it (the object keeps its size, dtype and shape). Durable at the next
 *  strata_store_flush(); all or nothing: after an error the object reads as before.
 *  Cheapest when the range covers whole chunks. Since version 6.
 *  \error NOT_FOUND; OUT_OF_RANGE; INVALID_ARGUMENT (NULL src with nbytes > 0);
 *      RESOURCE_EXHAUSTED; IO; DATA_LOSS (reading a partly overwritten chunk). */
STRATA_C_API strata_status_t strata_store_write_range(strata_store_t* store, const char* key,
                                                      uint64_t offset, uint64_t nbytes,
                                                      const void* src);
STRATA_C_API strata_status_t strata_store_write_range_async(strata_store_t* store,
                                                            const char* key, uint64_t offset,
                                                            uint64_t nbytes, const void* src,
                                                            strata_future_t** future);
/** Demotes `key` to NVMe (writing back a dirty copy) and frees its memory. Since version 6.
 *  \error NOT_FOUND; FAILED_PRECONDITION (pinned); RESOURCE_EXHAUSTED; IO. */
STRATA_C_API strata_status_t strata_store_evict(strata_store_t* store, const char* key);
/** Pins `key` in its memory tier (never evicted by LRU; pins nest, counted); an NVMe-only
 *  object is first promoted to host. Since version 6.
 *  \error NOT_FOUND; RESOURCE_EXHAUSTED (no room in host memory). */
STRATA_C_API strata_status_t strata_store_pin(strata_store_t* store, const char* key);
/** Removes one pin of `key`. \error NOT_FOUND; FAILED_PRECONDITION (not pinned). */
STRATA_C_API strata_status_t strata_store_unpin(strata_store_t* store, const char* key);

/** Metadata of an object. Initialize with STRATA_OBJECT_INFO_INIT.
 *  Fields are only ever appended: the library fills the fields that `struct_size` covers,
 *  so a program compiled against an older header (a smaller struct_size) keeps working. */
typedef struct strata_object_info {
  size_t struct_size;       /**< sizeof(strata_object_info_t) */
  strata_dtype_t dtype;
  int ndim;
  int64_t shape[STRATA_MAX_NDIM];
  uint64_t nbytes;
  strata_tier_t tier;       /**< fastest tier holding the current bytes */
  int on_nvme;              /**< 1 when an NVMe copy exists */
  int dirty;                /**< 1 when the in-memory copy is not yet durable */
  int pinned;               /**< 1 when pinned */
  /* ---- STRATA_C_API_VERSION 2 ---- */
  /** 1 when the object's catalog row is damaged (e.g. chunk sizes that do not add up to
   *  nbytes, a shape whose size overflows): reading it fails with STRATA_ERR_DATA_LOSS,
   *  put with STRATA_PUT_OVERWRITE or delete replaces it. dtype/shape/nbytes are then what
   *  the row claims. The reason: strata_store_object_damage(). */
  int damaged;
} strata_object_info_t;
#define STRATA_OBJECT_INFO_INIT {sizeof(strata_object_info_t), STRATA_UINT8, 0, {0}, 0, STRATA_TIER_NVME, 0, 0, 0, 0}

/** Fills *info for `key` (the fields up to info->struct_size; a struct from a version-1
 *  header, which ends at `pinned`, is accepted and its memory past `pinned` untouched).
 *  A damaged object is not an error here: see `damaged`.
 *  \error NOT_FOUND; INVALID_ARGUMENT (uninitialized info, or more than STRATA_MAX_NDIM
 *  dims). */
STRATA_C_API strata_status_t strata_store_stat(strata_store_t* store, const char* key,
                                               strata_object_info_t* info);

/** Why the catalog row of `key` is damaged ("" when it is intact), as
 *  strata::ObjectInfo::damage: e.g. "object 'k' chunks hold 3000 bytes, expected 4096".
 *  Copies at most buf_size - 1 bytes of it plus a NUL into `buf` (like snprintf; `buf` may
 *  be NULL when buf_size is 0) and sets *length (if not NULL) to the full length in bytes
 *  without the NUL, so a caller whose buffer was too small can retry with *length + 1.
 *  Thread-safe. \error NOT_FOUND (no such key); INVALID_ARGUMENT (NULL store or key, NULL
 *  buf with buf_size > 0). Since STRATA_C_API_VERSION 2. */
STRATA_C_API strata_status_t strata_store_object_damage(strata_store_t* store, const char* key,
                                                        char* buf, size_t buf_size,
                                                        size_t* length);

/** A list of keys returned by strata_store_list(). */
typedef struct strata_key_list strata_key_list_t;
/** The keys starting with `prefix` (NULL or "" = all), sorted bytewise. Free the list with
 *  strata_key_list_free. */
STRATA_C_API strata_status_t strata_store_list(strata_store_t* store, const char* prefix,
                                               strata_key_list_t** list);
/** Number of keys in `list` (0 for NULL). */
STRATA_C_API size_t strata_key_list_size(const strata_key_list_t* list);
/** Key i (NUL-terminated, owned by the list), NULL when i is out of range. */
STRATA_C_API const char* strata_key_list_get(const strata_key_list_t* list, size_t i);
STRATA_C_API void strata_key_list_free(strata_key_list_t* list);

/** The store's counters since open or the last strata_store_reset_stats(): strata::StoreStats
 *  with flat names, the same as Python's Store.stats() keys (docs/store.md "Stats" defines
 *  each). Initialize with STRATA_STORE_STATS_INIT. Fields are only ever appended: the
 *  library fills the fields that `struct_size` covers. Since STRATA_C_API_VERSION 5. */
typedef struct strata_store_stats {
  size_t struct_size; /**< sizeof(strata_store_stats_t) */
  /* bytes and operations per tier and direction (nvme: chunk transfers of any cause) */
  uint64_t device_read_bytes, device_read_ops, device_write_bytes, device_write_ops;
  uint64_t host_read_bytes, host_read_ops, host_write_bytes, host_write_ops;
  uint64_t nvme_read_bytes, nvme_read_ops, nvme_write_bytes, nvme_write_ops;
  /* tier moves */
  uint64_t promotions, promotion_bytes, evictions, eviction_bytes, lru_evictions;
  uint64_t writebacks, writeback_bytes;
  uint64_t checksum_failures;
  uint64_t prefetches, prefetch_hits, prefetch_misses;
  double nvme_read_wait_seconds, nvme_write_wait_seconds; /**< summed over operations */
  /* pinned pools: bytes in use now, budget, peak since open / reset */
  uint64_t host_pool_in_use_bytes, host_pool_capacity_bytes, host_pool_peak_bytes;
  uint64_t staging_pool_in_use_bytes, staging_pool_capacity_bytes, staging_pool_peak_bytes;
  double elapsed_seconds; /**< the interval the counters cover */
  /* ---- STRATA_C_API_VERSION 7 ---- */
  /** pinned memory the pools hold now (they grow on demand up to their capacity) */
  uint64_t host_pool_committed_bytes, staging_pool_committed_bytes;
} strata_store_stats_t;
#define STRATA_STORE_STATS_INIT                                                           \
  {                                                                                       \
    sizeof(strata_store_stats_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0                                       \
  }

/** Fills *stats (the fields up to stats->struct_size). Thread-safe, cheap.
 *  \error INVALID_ARGUMENT (NULL store, NULL or uninitialized stats). */
STRATA_C_API strata_status_t strata_store_stats(strata_store_t* store, strata_store_stats_t* stats);
/** Zeroes the counters (the pools' peaks restart at their use now). \error INVALID_ARGUMENT. */
STRATA_C_API strata_status_t strata_store_reset_stats(strata_store_t* store);

/* ---- offloaded optimizer ---------------------------------------------------------------- */

typedef struct strata_optimizer strata_optimizer_t;

/* ---- custom update rules (since STRATA_C_API_VERSION 6) ---- */

/** Most state streams a rule may have (strata::optimizer::kMaxStateStreams). */
#define STRATA_MAX_STATES 4

/** The streams one call of a custom rule updates: `numel` consecutive elements of one
 *  parameter tensor (a sub-group slice, or a tile of it), host memory, valid during the call
 *  only. Element i of every stream belongs to the same parameter element. */
typedef struct strata_update_spans {
  float* param;       /**< fp32 master values: read, update in place */
  const float* grad;  /**< fp32 gradient, already multiplied by info->grad_scale (converted
                           from an fp16/bf16 gradient by the engine); read only */
  float* states[STRATA_MAX_STATES]; /**< fp32 state streams 0..num_states-1, in place */
  uint64_t numel;                   /**< elements in every stream (>= 1) */
} strata_update_spans_t;

/** What a custom rule's call is for, besides the streams. */
typedef struct strata_update_info {
  int64_t step;       /**< 1-based step number of the tensor after this step (torch's
                           state["step"]): drives bias corrections */
  float grad_scale;   /**< the factor the gradient was multiplied by (clip coefficient times
                           the step's grad_scale) */
  uint32_t param;     /**< the tensor's index in the optimizer */
  const char* param_name; /**< its name */
  uint64_t offset;    /**< element offset of spans->param[0] within the tensor */
  /** The param group's hyperparameter values, in the order of strata_rule_t's
   *  hyperparam_names (num_hyperparams values). */
  const double* hyperparams;
  /** A failing call may write a NUL-terminated reason here (error_size bytes, 256): the
   *  step's error message quotes it. */
  char* error;
  size_t error_size;
} strata_update_info_t;

/** A custom rule's update: returns STRATA_OK, or another strata_status_t that the step then
 *  returns (its message names the rule, the parameter, the elements and the step, and quotes
 *  info->error). Must not call into the optimizer that runs it. */
typedef strata_status_t (*strata_update_fn)(const strata_update_spans_t* spans,
                                            const strata_update_info_t* info, void* user_data);

/** An element-wise optimizer update written in C (strata::optimizer::UpdateRule): the new
 *  value of element i may depend only on element i of the streams, the step and the
 *  hyperparameters, so the engine can stream a tensor through it sub-group by sub-group,
 *  in any split, with the same result. Initialize with STRATA_RULE_INIT. The library copies
 *  the strings and arrays when the optimizer is created; `update` and `user_data` must stay
 *  valid until the optimizer is closed. */
typedef struct strata_rule {
  size_t struct_size;                  /**< sizeof(strata_rule_t); set by the INIT macro */
  /** Its name, recorded in checkpoints (a resume must pass a rule of the same name and
   *  state count); printable ASCII, not a built-in optimizer's name. Required. */
  const char* name;
  int num_states;                      /**< 0..STRATA_MAX_STATES */
  const char* const* state_names;      /**< num_states names (torch's state keys), unique */
  const float* state_inits;            /**< num_states initial values, or NULL for zeros */
  size_t num_hyperparams;
  const char* const* hyperparam_names; /**< the hyperparameters the rule takes, unique */
  const double* hyperparam_defaults;   /**< their defaults (num_hyperparams values) */
  strata_update_fn update;             /**< required */
  void* user_data;                     /**< passed to every call of update */
  /** 0 (default): update is called on tiles of at most STRATA_RULE_TILE_NUMEL elements,
   *  concurrently from the optimizer's kernel threads (it must be thread-safe); 1: once per
   *  sub-group slice on the thread running the step (for a rule with its own parallelism). */
  int whole_spans;
  /** 1 (default): update may fail, and a step is then a transaction: a failed call leaves
   *  every master, state and step counter as before the step. 0: the rule promises not to
   *  fail (a step skips that bookkeeping); if it fails anyway the step returns its status
   *  having failed part-way: tensors may be partly updated, strata_optimizer_checkpoint()
   *  and close refuse (FAILED_PRECONDITION), and a resume restores the last checkpoint. */
  int may_fail;
} strata_rule_t;

#define STRATA_RULE_TILE_NUMEL 16384
#define STRATA_RULE_INIT {sizeof(strata_rule_t), NULL, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, 1}

/** Options of strata_optimizer_create(). Initialize with STRATA_OPTIMIZER_OPTIONS_INIT.
 *  Hyperparameters use torch.optim's names and defaults of the chosen optimizer. */
typedef struct strata_optimizer_options {
  size_t struct_size;
  int version;
  /** "adam", "adamw", "adagrad", "sgd" or "lion". Default "adamw". */
  const char* optimizer;
  /** Prefix of the optimizer's store keys. Default "optim/". */
  const char* key_prefix;
  double lr;           /**< learning rate; default the optimizer's (adamw: 1e-3) */
  double beta1;        /**< adam/adamw/lion betas[0] */
  double beta2;        /**< adam/adamw/lion betas[1] */
  double eps;          /**< adam/adamw/adagrad eps */
  double weight_decay; /**< default the optimizer's (adamw: 1e-2, adam: 0) */
  int amsgrad;         /**< adam/adamw: 1 keeps max(v) */
  /** Elements per pipeline sub-group, 0 = auto. Default 0. */
  uint64_t sub_group_numel;
  /** Pinned pipeline slots, 1..16; 0 = as many as pinned_budget_bytes holds (4..64).
      Default 4. */
  int num_buffers;
  /** DRAM bytes host-resident tensors may take before new tensors go to NVMe. Default 0. */
  uint64_t host_budget_bytes;
  /** Kernel threads, 0 = one per core. Default 0. */
  int num_threads;
  /* ---- STRATA_C_API_VERSION 3 ---- */
  /** Update arithmetic: NULL or "simd" (default): the vectorized kernels, each step within
   *  1-2 ulp of torch.optim; "torch" (adam and adamw only): torch.optim.Adam / AdamW's exact
   *  rounding, bit-identical to torch, slower. Either resumes the other's checkpoint. A
   *  struct from an older header (smaller struct_size) gets the default. */
  const char* arithmetic;
  /* ---- STRATA_C_API_VERSION 6 ---- */
  /** A custom rule instead of `optimizer` (which is then ignored), or NULL. Its
   *  hyperparameters start from the rule's defaults; the fields above that are set (lr,
   *  beta1, ...) are passed by those names, so the rule must take them. `arithmetic` must be
   *  NULL or "simd". Pass the same rule again to resume its checkpoint. */
  const strata_rule_t* rule;
  /* ---- STRATA_C_API_VERSION 8 ---- */
  /** Element type of the optimizer's state streams in the store
   *  (strata::optimizer::OffloadOptions::state_dtype), a strata_dtype_t value:
   *  STRATA_FLOAT32 (4 bytes per element) or STRATA_BFLOAT16 (2 bytes per element, "bf16
   *  moments"; any rule, custom ones too). Masters stay fp32 and the rule still sees fp32
   *  spans: a step widens each state slice to fp32 (exact) and rounds the updated states
   *  back to bf16 to nearest even, i.e. the values of an fp32 run whose states are rounded
   *  to bf16 after every step. Adam/AdamW on the NVMe tier then read 8 bytes per parameter
   *  and step (4 master + 2 x 2 moments) instead of 12, and write the same.
   *  STRATA_UNDEF_INT (default) = the configuration file's "optimizer.state_dtype", else
   *  STRATA_FLOAT32; a struct from an older header gets that default too. Recorded in the
   *  checkpoint: a resume with another state dtype is FAILED_PRECONDITION naming both. Any
   *  other value: INVALID_ARGUMENT naming it. Any optimizer takes STRATA_BFLOAT16, but
   *  "adagrad"'s undecayed sum of squared gradients stops growing in bf16 once an
   *  increment is below sum * 2^-9 (Python's OffloadOptimizer refuses it for Adagrad).
   *  Since STRATA_C_API_VERSION 8. */
  int state_dtype;
} strata_optimizer_options_t;

#define STRATA_OPTIMIZER_OPTIONS_INIT                                                       \
  {                                                                                         \
    sizeof(strata_optimizer_options_t), STRATA_C_API_VERSION, NULL, NULL,                   \
        STRATA_UNDEF_DOUBLE, STRATA_UNDEF_DOUBLE, STRATA_UNDEF_DOUBLE, STRATA_UNDEF_DOUBLE, \
        STRATA_UNDEF_DOUBLE, STRATA_UNDEF_INT, STRATA_UNDEF_U64, STRATA_UNDEF_INT,          \
        STRATA_UNDEF_U64, STRATA_UNDEF_INT, NULL, NULL, STRATA_UNDEF_INT                    \
  }

/** Creates an offloaded optimizer whose fp32 masters and states live in `store` (which must
 *  stay open until strata_optimizer_close / free). With `resume` = 1 the optimizer
 *  checkpointed under key_prefix is reopened instead, as of its last checkpoint or close
 *  (hyperparameters then come from the checkpoint).
 *  \error INVALID_ARGUMENT (bad option or hyperparameter, an arithmetic other than "simd"
 *      or "torch", "torch" for an optimizer other than adam/adamw, a state_dtype other than
 *      STRATA_FLOAT32 / STRATA_BFLOAT16); ALREADY_EXISTS (a checkpoint exists and resume =
 *      0); NOT_FOUND (resume = 1 and none exists); FAILED_PRECONDITION (resume = 1 with
 *      another state_dtype than the checkpoint's); RESOURCE_EXHAUSTED. */
STRATA_C_API strata_status_t strata_optimizer_create(strata_store_t* store,
                                                     const strata_optimizer_options_t* options,
                                                     int resume, strata_optimizer_t** optimizer);
/** Closes the optimizer: its last checkpoint (one rule for every tier: a resume restores
 *  the state of the last strata_optimizer_checkpoint() or close; a process killed without
 *  closing resumes at the last of those). Checkpoints when anything changed since the last
 *  checkpoint, then frees the handle, also when it returns an error; NULL is a no-op.
 *  Close the optimizer before its store: a store closed first drops the state since the
 *  last checkpoint (this call then returns FAILED_PRECONDITION).
 *  \error what strata_optimizer_checkpoint() returns (RESOURCE_EXHAUSTED, IO,
 *      FAILED_PRECONDITION after a step that failed part-way or for a closed store); the
 *      last checkpoint then stays the resume point. */
STRATA_C_API strata_status_t strata_optimizer_close(strata_optimizer_t* optimizer);
/** strata_optimizer_close() without its status (an error is logged to stderr and left in
 *  strata_last_error()). */
STRATA_C_API void strata_optimizer_free(strata_optimizer_t* optimizer);

/** Sets `n` hyperparameters of param group `group` (0: the only group of the C API):
 *  keys[i] = values[i], torch.optim's names ("lr", "beta1", "beta2", "eps",
 *  "weight_decay", "amsgrad" 0/1, "maximize" 0/1, ...), effective from the next step and
 *  kept by checkpoints (e.g. a learning-rate schedule: set "lr" before each step). All or
 *  nothing: on error no value changes.
 *  \error OUT_OF_RANGE (no such group); INVALID_ARGUMENT (NULL keys/values with n > 0, a
 *      key the optimizer does not know, a value out of range, e.g. lr < 0, or one that
 *      would change its state streams, e.g. amsgrad switched on). */
STRATA_C_API strata_status_t strata_optimizer_set_hyperparams(strata_optimizer_t* optimizer,
                                                              int group,
                                                              const char* const* keys,
                                                              const double* values, size_t n);
/** The value of hyperparameter `key` of param group `group` in *value.
 *  \error OUT_OF_RANGE (no such group); NOT_FOUND (the group has no such key). */
STRATA_C_API strata_status_t strata_optimizer_hyperparam(strata_optimizer_t* optimizer,
                                                         int group, const char* key,
                                                         double* value);

/** Placement of a parameter's master and states. */
typedef enum strata_placement {
  STRATA_PLACEMENT_AUTO = 0, /**< host while within host_budget_bytes, else nvme */
  STRATA_PLACEMENT_HOST = 1,
  STRATA_PLACEMENT_NVME = 2,
  STRATA_ENUM_SPANS_INT(STRATA_PLACEMENT)
} strata_placement_t;

/** Adds a parameter of `numel` fp32 elements (`init`: numel values, or NULL for zeros) and
 *  returns its index in *param (0, 1, ... in call order). numel may be 0: the parameter has
 *  nothing to update but a step counter, which steps advance while a (non-NULL) gradient
 *  is attached and checkpoints keep.
 *  \error INVALID_ARGUMENT (bad or duplicate name, numel > (2^63 - 1) / 4 so that
 *  numel * 4 bytes would not fit); RESOURCE_EXHAUSTED; IO. */
STRATA_C_API strata_status_t strata_optimizer_add_param(strata_optimizer_t* optimizer,
                                                        const char* name, uint64_t numel,
                                                        const float* init,
                                                        strata_placement_t placement,
                                                        uint32_t* param);
/** Index of the parameter called `name` (also after a resume). \error NOT_FOUND. */
STRATA_C_API strata_status_t strata_optimizer_find_param(strata_optimizer_t* optimizer,
                                                         const char* name, uint32_t* param);
/** Attaches the gradient of `param` (numel elements of STRATA_FLOAT32, FLOAT16 or BFLOAT16
 *  in host memory, valid and unmodified during each step) for the next steps; NULL
 *  detaches (a zero-size parameter takes any non-NULL pointer). \error OUT_OF_RANGE (bad index); INVALID_ARGUMENT (other dtype). */
STRATA_C_API strata_status_t strata_optimizer_set_grad(strata_optimizer_t* optimizer,
                                                       uint32_t param, const void* grad,
                                                       strata_dtype_t dtype);

/** What a step did. */
typedef struct strata_step_stats {
  int skipped;             /**< 1 when skipped for an inf/NaN gradient */
  double grad_norm;        /**< global L2 norm before clipping (NaN when not computed) */
  double clip_coef;        /**< factor applied by clipping (1 = none) */
  uint64_t numel_updated;  /**< elements updated */
  uint64_t bytes_read;     /**< NVMe bytes read by the pipeline */
  uint64_t bytes_written;  /**< NVMe bytes written by the pipeline */
  double seconds;          /**< wall time of the step */
} strata_step_stats_t;

/** Totals of the optimizer's completed steps (strata::optimizer::OptimizerStats; Python's
 *  optimizer.stats() keys). Initialize with STRATA_OPTIMIZER_STATS_INIT; fields are only
 *  ever appended. Since STRATA_C_API_VERSION 5. */
typedef struct strata_optimizer_stats {
  size_t struct_size; /**< sizeof(strata_optimizer_stats_t) */
  uint64_t steps, steps_skipped, steps_rolled_back, sub_groups;
  uint64_t tensors_updated, numel_updated, bytes_read, bytes_written;
  double step_seconds, update_seconds, io_wait_seconds, early_seconds;
  double overlap; /**< update / (update + io_wait), 0 when both are 0 */
} strata_optimizer_stats_t;
#define STRATA_OPTIMIZER_STATS_INIT {sizeof(strata_optimizer_stats_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/** Fills *stats (the fields up to stats->struct_size); `reset` 1 then zeroes the totals.
 *  \error INVALID_ARGUMENT (NULL optimizer, NULL or uninitialized stats). */
STRATA_C_API strata_status_t strata_optimizer_stats(strata_optimizer_t* optimizer,
                                                    strata_optimizer_stats_t* stats, int reset);

/** One step of every parameter with a gradient. `max_grad_norm` > 0 clips by global L2
 *  norm (torch.nn.utils.clip_grad_norm_); `grad_scale` multiplies every gradient (1 = none).
 *  `stats` may be NULL. \error store errors (IO, DATA_LOSS, RESOURCE_EXHAUSTED). */
STRATA_C_API strata_status_t strata_optimizer_step(strata_optimizer_t* optimizer,
                                                   double max_grad_norm, float grad_scale,
                                                   strata_step_stats_t* stats);
/** Copies elements [offset, offset + count) of the fp32 master of `param` into `dst`.
 *  \error OUT_OF_RANGE (bad index or range); store errors. */
STRATA_C_API strata_status_t strata_optimizer_read_param(strata_optimizer_t* optimizer,
                                                         uint32_t param, float* dst,
                                                         uint64_t offset, uint64_t count);
/** Step counter of `param` (torch's state["step"]). \error OUT_OF_RANGE. */
STRATA_C_API strata_status_t strata_optimizer_step_count(strata_optimizer_t* optimizer,
                                                         uint32_t param, int64_t* step);
/** Makes the state after the last step durable in place (one commit of the optimizer's
 *  objects): the resume point until the next checkpoint or close. \error IO,
 *  RESOURCE_EXHAUSTED (the last checkpoint stays the resume point); FAILED_PRECONDITION
 *  after a step that failed part-way (resume from the last checkpoint). */
STRATA_C_API strata_status_t strata_optimizer_checkpoint(strata_optimizer_t* optimizer);

/* ---- param groups, state access, step options (since STRATA_C_API_VERSION 6) ---- */

/** Adds a param group (torch's add_param_group) with `n` hyperparameters keys[i] =
 *  values[i]; keys absent take group 0's values. Its index (1, 2, ...) in *group.
 *  \error INVALID_ARGUMENT (NULL arrays with n > 0, a key given twice or one the rule does
 *      not take, a value out of range); FAILED_PRECONDITION (closed). */
STRATA_C_API strata_status_t strata_optimizer_add_param_group(strata_optimizer_t* optimizer,
                                                              const char* const* keys,
                                                              const double* values, size_t n,
                                                              int* group);
/** Number of param groups (>= 1) in *n (also after a resume). */
STRATA_C_API strata_status_t strata_optimizer_num_param_groups(strata_optimizer_t* optimizer,
                                                               int* n);
/** strata_optimizer_add_param() into param group `group`.
 *  \error as strata_optimizer_add_param(); INVALID_ARGUMENT for a bad group. */
STRATA_C_API strata_status_t strata_optimizer_add_param_to_group(
    strata_optimizer_t* optimizer, const char* name, uint64_t numel, const float* init,
    int group, strata_placement_t placement, uint32_t* param);
/** Number of parameter tensors in *n (indices 0..n-1). */
STRATA_C_API strata_status_t strata_optimizer_num_params(strata_optimizer_t* optimizer,
                                                         uint32_t* n);

/** What strata_optimizer_param_info() reports. Initialize with STRATA_PARAM_INFO_INIT. */
typedef struct strata_param_info {
  size_t struct_size;            /**< sizeof(strata_param_info_t) */
  const char* name;              /**< valid until the optimizer is closed */
  uint64_t numel;                /**< fp32 elements */
  strata_placement_t placement;  /**< HOST or NVME (never AUTO) */
  int group;                     /**< param group index */
  int64_t step;                  /**< step counter (torch's state["step"]) */
  int has_grad;                  /**< 1 when a gradient is attached */
  /** Store key of its fp32 master (NVME: numel * 4 bytes, readable with strata_store_get
   *  while no step runs); valid until the optimizer is closed. */
  const char* master_key;
} strata_param_info_t;
#define STRATA_PARAM_INFO_INIT {sizeof(strata_param_info_t), NULL, 0, STRATA_PLACEMENT_AUTO, 0, 0, 0, NULL}
/** Fills *info for `param` (the fields up to info->struct_size).
 *  \error OUT_OF_RANGE (bad index); INVALID_ARGUMENT (NULL or uninitialized info). */
STRATA_C_API strata_status_t strata_optimizer_param_info(strata_optimizer_t* optimizer,
                                                         uint32_t param,
                                                         strata_param_info_t* info);
/** Name of the update rule ("adamw", a custom rule's name); valid until the optimizer is
 *  closed; "" for a NULL handle. */
STRATA_C_API const char* strata_optimizer_rule_name(strata_optimizer_t* optimizer);
/** Number of fp32 state streams of the rule (adamw: 2, amsgrad 3); -1 for a NULL handle. */
STRATA_C_API int strata_optimizer_num_states(strata_optimizer_t* optimizer);
/** Name of state stream `stream` (torch's state key: "exp_avg", "exp_avg_sq", ...), valid
 *  until the optimizer is closed; NULL for a bad index or handle. */
STRATA_C_API const char* strata_optimizer_state_name(strata_optimizer_t* optimizer, int stream);
/** Overwrites elements [offset, offset + count) of the fp32 master of `param` from `src`
 *  (load_state_dict, an edit of the weights); durable at the next checkpoint.
 *  \error OUT_OF_RANGE (bad index or range); INVALID_ARGUMENT (NULL src); store errors. */
STRATA_C_API strata_status_t strata_optimizer_write_param(strata_optimizer_t* optimizer,
                                                          uint32_t param, const float* src,
                                                          uint64_t offset, uint64_t count);
/** As strata_optimizer_read_param() / write_param() for state stream `stream`.
 *  \error OUT_OF_RANGE also for a bad stream index. */
STRATA_C_API strata_status_t strata_optimizer_read_state(strata_optimizer_t* optimizer,
                                                         uint32_t param, int stream,
                                                         float* dst, uint64_t offset,
                                                         uint64_t count);
STRATA_C_API strata_status_t strata_optimizer_write_state(strata_optimizer_t* optimizer,
                                                          uint32_t param, int stream,
                                                          const float* src, uint64_t offset,
                                                          uint64_t count);
/** Restores the step counter of `param` (load_state_dict).
 *  \error OUT_OF_RANGE (bad index); INVALID_ARGUMENT (step < 0). */
STRATA_C_API strata_status_t strata_optimizer_set_step_count(strata_optimizer_t* optimizer,
                                                             uint32_t param, int64_t step);
/** Detaches every gradient (torch's zero_grad(set_to_none=True)). */
STRATA_C_API strata_status_t strata_optimizer_clear_grads(strata_optimizer_t* optimizer);

/** Options of strata_optimizer_step_with() / step_async() (strata::optimizer::StepOptions).
 *  Initialize with STRATA_STEP_OPTIONS_INIT; fields are only ever appended. */
typedef struct strata_step_options {
  size_t struct_size;   /**< sizeof(strata_step_options_t) */
  double max_grad_norm; /**< > 0: clip by global L2 norm (clip_grad_norm_). Default 0 */
  float grad_scale;     /**< every gradient is multiplied by it (1/loss_scale); finite and
                             >= 0. Default 1 */
  int skip_if_nonfinite; /**< 1: skip the step when a gradient holds inf/NaN. Default 1 */
  /** 1: the gate's inputs below were computed by the caller over all of the step's gradients
   *  (gradients partitioned over ranks: all-reduce the squared norms and the overflow flag
   *  first), and the step decides from them instead of scanning. Default 0. */
  int has_grad_summary;
  double summary_grad_norm; /**< the global L2 norm of the unscaled gradients (>= 0) */
  int summary_nonfinite;    /**< 1: some gradient element is inf or NaN */
} strata_step_options_t;
#define STRATA_STEP_OPTIONS_INIT {sizeof(strata_step_options_t), 0.0, 1.0f, 1, 0, 0.0, 0}

/** strata_optimizer_step() with every option. `options` NULL = the defaults.
 *  \error INVALID_ARGUMENT (max_grad_norm < 0 or NaN, grad_scale < 0 or not finite, a
 *      negative summary_grad_norm, uninitialized options); store errors; a custom rule's
 *      status (see strata_rule_t.may_fail). */
STRATA_C_API strata_status_t strata_optimizer_step_with(strata_optimizer_t* optimizer,
                                                        const strata_step_options_t* options,
                                                        strata_step_stats_t* stats);
/** The step on an internal thread: *future is ready when it is done (the step's status is
 *  the future's); `stats`, if not NULL, is filled by then. Gradients and `stats` must stay
 *  valid and unmodified until the future is ready; other calls on the optimizer meanwhile
 *  wait for the step. `options` is read during this call.
 *  \error INVALID_ARGUMENT (as step_with, NULL future); errors of the step arrive through the
 *      future. */
STRATA_C_API strata_status_t strata_optimizer_step_async(strata_optimizer_t* optimizer,
                                                         const strata_step_options_t* options,
                                                         strata_step_stats_t* stats,
                                                         strata_future_t** future);

/* ---- communicator ----------------------------------------------------------------------- */

typedef struct strata_comm strata_comm_t;

typedef enum strata_backend {
  STRATA_BACKEND_GLOO = 0,
  STRATA_BACKEND_NCCL = 1,
  STRATA_ENUM_SPANS_INT(STRATA_BACKEND)
} strata_backend_t;

/** Creates a communicator from torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK,
 *  WORLD_SIZE, LOCAL_RANK); rank 0 hosts the rendezvous server. Collective: every rank calls
 *  it. \error INVALID_ARGUMENT naming a missing/malformed variable; UNAVAILABLE;
 *  DEADLINE_EXCEEDED (STRATA_COLL_TIMEOUT_MS); UNIMPLEMENTED (NCCL without CUDA). */
STRATA_C_API strata_status_t strata_comm_init_from_env(strata_backend_t backend,
                                                       strata_comm_t** comm);
STRATA_C_API void strata_comm_free(strata_comm_t* comm);
STRATA_C_API int strata_comm_rank(const strata_comm_t* comm);
STRATA_C_API int strata_comm_size(const strata_comm_t* comm);
/** In-place-capable sum/max all-reduce of `count` elements (host memory for gloo, device
 *  memory for nccl). `op`: 0 = sum, 1 = max. */
STRATA_C_API strata_status_t strata_comm_all_reduce(strata_comm_t* comm, const void* send,
                                                    void* recv, size_t count,
                                                    strata_dtype_t dtype, int op);
/** recv (size * count elements) receives every rank's `count` elements in rank order. */
STRATA_C_API strata_status_t strata_comm_all_gather(strata_comm_t* comm, const void* send,
                                                    void* recv, size_t count,
                                                    strata_dtype_t dtype);
STRATA_C_API strata_status_t strata_comm_barrier(strata_comm_t* comm);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_STRATA_H_ */
