// Fuzz target: decoding of a store's catalog (store/src/catalog_sqlite.cpp: object and chunk
// rows, shapes; store_dirs.cpp: the nvme_dirs record; store_open.cpp: the chunk_bytes
// record; store_damage.cpp: row damage, overlapping extents) and the read-only open of a
// store over it.
//
// Input: SQL text run against a fresh catalog (the schema Catalog::open creates), e.g. the
// INSERT statements of a real store's catalog (corpus/catalog, made by fuzz_seeds). Only
// statements on the main database run (no ATTACH, PRAGMA or trigger), with bounded lengths
// and VM steps, so the input changes what the rows hold, not how SQLite runs.
// Properties: list_store(), the open path's decoding and Store::open(read_only) give a
// result or an error status (never a crash, UB, leak or hang); an undamaged row has the
// size its shape needs, chunks adding up to it, and no extent claimed twice.
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "catalog_sqlite.hpp"
#include "fuzz_check.hpp"
#include "fuzz_temp_dir.hpp"
#include "store_damage.hpp"
#include "store_dirs.hpp"
#include "store_impl.hpp"
#include "store_shapes.hpp"
#include "strata/base/logging.hpp"
#include "strata/store/store.hpp"

namespace {

using namespace strata;

int authorize(void*, int action, const char*, const char*, const char* db, const char*) {
  switch (action) {
    case SQLITE_INSERT:
    case SQLITE_UPDATE:
    case SQLITE_DELETE:
    case SQLITE_READ:
    case SQLITE_SELECT:
    case SQLITE_FUNCTION:
    case SQLITE_RECURSIVE:
    case SQLITE_TRANSACTION:
    case SQLITE_SAVEPOINT:
    case SQLITE_CREATE_TABLE:
    case SQLITE_DROP_TABLE:
    case SQLITE_CREATE_VIEW:
    case SQLITE_DROP_VIEW:
    case SQLITE_CREATE_INDEX:
    case SQLITE_DROP_INDEX:
    case SQLITE_ALTER_TABLE:
      return db == nullptr || std::string(db) == "main" ? SQLITE_OK : SQLITE_DENY;
    default:
      return SQLITE_DENY;
  }
}

int stop_after_budget(void* steps) { return ++*static_cast<int*>(steps) > 2000; }

/// Runs `sql` against the catalog at `path` (errors end the script, as in sqlite3_exec).
void run_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  FUZZ_CHECK(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK,
             "open %s", path.c_str());
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, 1 << 16);
  sqlite3_limit(db, SQLITE_LIMIT_SQL_LENGTH, 1 << 16);
  sqlite3_limit(db, SQLITE_LIMIT_COMPOUND_SELECT, 8);
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_set_authorizer(db, authorize, nullptr);
  int steps = 0;
  sqlite3_progress_handler(db, 100, stop_after_budget, &steps);
  sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  sqlite3_close_v2(db);
}

void check_rows(const std::vector<catalog::ObjectRow>& rows, size_t ndirs, uint64_t chunk) {
  store_detail::ExtentClaims claims(ndirs, chunk);
  std::vector<bool> adopt;
  for (const auto& r : rows) {
    const std::string overlap = claims.claim(r, &adopt);
    FUZZ_CHECK(adopt.size() == r.chunks.size(), "adopt size");
    const std::string damage = store_detail::row_damage(r, ndirs, chunk);
    if (!damage.empty() || !overlap.empty()) continue;
    auto want = store_detail::checked_nbytes(r.dtype, r.shape);
    FUZZ_CHECK(want && *want == r.nbytes, "undamaged row '%s' of the wrong size", r.key.c_str());
    uint64_t sum = 0;
    for (size_t j = 0; j < r.chunks.size(); ++j) {
      FUZZ_CHECK(adopt[j], "undamaged row '%s' with an unclaimed chunk", r.key.c_str());
      FUZZ_CHECK(r.chunks[j].dir < ndirs, "chunk directory");
      sum += r.chunks[j].nbytes;
    }
    FUZZ_CHECK(sum == r.nbytes, "undamaged row '%s': chunks hold %llu bytes", r.key.c_str(),
               static_cast<unsigned long long>(sum));
  }
}

/// The decoding steps of StoreImpl's open path on the catalog at `path` of store `root`.
void decode_like_open(const std::string& root, const std::string& path) {
  auto cat = catalog::Catalog::open(path, false, true);
  if (!cat.ok()) return;
  auto cb = (*cat)->get_meta("chunk_bytes");
  auto nd = (*cat)->get_meta("nvme_dirs");
  if (!cb.ok() || !nd.ok() || !*cb || !*nd) return;
  auto chunk = store_detail::parse_chunk_bytes(**cb, path);
  auto dirs = store_detail::parse_dirs_record(root, **nd, path);
  if (!chunk.ok() || !dirs.ok()) return;
  FUZZ_CHECK(!dirs->empty() && *chunk > 0 && *chunk % 4096 == 0, "decoded layout");
  auto held = (*cat)->chunks_per_dir(dirs->size());
  if (held.ok()) FUZZ_CHECK(held->size() == dirs->size(), "chunks_per_dir size");
  auto rows = (*cat)->load_all();
  if (rows.ok()) check_rows(*rows, dirs->size(), *chunk);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // SQLite's fsyncs are cheap on tmpfs (/dev/shm): 5-10x the executions of a disk. The
  // read-only store opens no data file there that needs O_DIRECT.
  static const std::string root = [] {
    set_log_level(LogLevel::kError);  // damaged rows are expected: no warning per input
    std::error_code ec;
    const bool shm = std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0;
    return strata::fuzz::scratch_dir(shm ? "/dev/shm" : nullptr) + "/store";
  }();
  const std::string path = root + "/catalog.db";
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  std::filesystem::create_directories(root, ec);
  {
    auto fresh = catalog::Catalog::open(path, true, false);
    FUZZ_CHECK(fresh.ok(), "%s", fresh.status().to_string().c_str());
  }
  run_sql(path, std::string(reinterpret_cast<const char*>(data), size));

  auto listed = list_store(root);
  if (listed.ok()) {
    for (const auto& o : *listed) {
      if (!o.damage.empty()) continue;
      auto want = store_detail::checked_nbytes(o.dtype, o.shape);
      FUZZ_CHECK(want && *want == o.nbytes, "listed '%s' of the wrong size", o.key.c_str());
    }
  } else {
    FUZZ_CHECK(!listed.status().message().empty(), "an error without a message");
  }
  decode_like_open(root, path);

  StoreOptions o;
  o.path = root;
  o.read_only = true;
  o.create = false;
  o.host_budget_bytes = 0;
  o.staging_bytes = 64 << 10;
  o.worker_threads = 1;
  o.numa_node = -2;
  auto store = Store::open(o);
  if (store.ok()) {
    for (const auto& info : (*store)->list()) {
      if (!info.damage.empty() || info.nbytes > (1u << 20)) continue;
      std::string bytes(info.nbytes, '\0');
      (void)(*store)->get_bytes(info.key, bytes.data(), bytes.size());  // no data file: an error
    }
  } else {
    FUZZ_CHECK(!store.status().message().empty(), "an error without a message");
  }
  return 0;
}
