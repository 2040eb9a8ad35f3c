// strata::store (private) — the store's durable catalog in SQLite.
//
// Schema (format 1):
//   meta(name TEXT PRIMARY KEY, value TEXT)          store_uuid, format, chunk_bytes, nvme_dirs
//   objects(key TEXT PRIMARY KEY, dtype INT, shape TEXT, nbytes INT, first_dir INT)
//   chunks(key TEXT, idx INT, dir INT, offset INT, nbytes INT, checksum INT,
//          PRIMARY KEY(key, idx))
// WAL journal, synchronous=FULL: a committed transaction survives power loss
// (https://www.sqlite.org/pragma.html#pragma_synchronous). The store fdatasyncs the data
// files before it commits rows that name them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/base/dtype.hpp"

struct sqlite3;

namespace strata::catalog {

struct ChunkRow {
  uint32_t dir = 0;       ///< index into the store's nvme_dirs
  uint64_t offset = 0;    ///< byte offset of the extent in that directory's data file
  uint64_t nbytes = 0;    ///< logical bytes of the chunk (the extent is align_up(nbytes, 4096))
  uint64_t checksum = 0;  ///< XXH3_64bits of the chunk's bytes
};

struct ObjectRow {
  std::string key;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint32_t first_dir = 0;
  std::vector<ChunkRow> chunks;
  /// Non-empty when load_all() found the row malformed (unknown dtype, bad shape, missing
  /// chunks, chunk sizes not adding up): the message names the key. The rest is best effort.
  std::string damage;
};

struct Op {
  enum Kind { kUpsert, kDelete } kind = kUpsert;
  ObjectRow row;  ///< kUpsert: the full row; kDelete: only row.key
};

std::string shape_to_text(const std::vector<int64_t>& shape);
Result<std::vector<int64_t>> shape_from_text(const std::string& text);

class Catalog {
 public:
  /// Opens (creating when `create`) the SQLite database at `path`.
  /// \error NotFound when absent and !create; DataLoss when not a strata catalog.
  static Result<std::unique_ptr<Catalog>> open(const std::string& path, bool create,
                                               bool read_only);
  ~Catalog();

  Result<std::optional<std::string>> get_meta(const std::string& name);
  Status set_meta(const std::string& name, const std::string& value);
  /// Every committed object with its chunks, sorted by key, read in one transaction (a
  /// consistent snapshot while another connection commits).
  Result<std::vector<ObjectRow>> load_all(const std::string& prefix = {});
  /// The committed row of exactly `key` (std::nullopt when absent), as load_all() reads it.
  Result<std::optional<ObjectRow>> load_one(const std::string& key);
  /// Chunks recorded per NVMe directory: result[i] = chunk rows with dir == i, i < ndirs
  /// (rows naming other directories are ignored here; load_all() marks them damaged).
  Result<std::vector<uint64_t>> chunks_per_dir(size_t ndirs);
  /// Applies `ops` in order in one transaction (all or nothing).
  Status apply(const std::vector<Op>& ops);

 private:
  Catalog() = default;
  Status exec(const char* sql);
  /// OK when the database has strata's objects table. \error DataLoss "catalog PATH is not
  /// a strata catalog: ..." for another file or database; else as error(what).
  Status check_objects_table(const char* what);
  /// Rows whose key starts with `k` (exact: equals `k`), objects and chunks in one read
  /// transaction.
  Result<std::vector<ObjectRow>> load_rows(const std::string& k, bool exact);
  Result<std::vector<ObjectRow>> load_rows_in_txn(const std::string& k, bool exact);
  Status error(const char* what);
  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace strata::catalog
