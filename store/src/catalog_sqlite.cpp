// strata::store (private) — SQLite catalog. See catalog_sqlite.hpp.
#include "catalog_sqlite.hpp"

#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

namespace strata::catalog {

namespace {
/// SQLite URI "file:<percent-encoded path>?mode=ro[&immutable=1]" for a read-only open.
std::string sqlite_readonly_uri(const std::string& path, bool immutable) {
  // RFC 3986 percent-encoding of everything but unreserved characters and '/'
  // (https://www.sqlite.org/uri.html).
  static const char* kHex = "0123456789ABCDEF";
  std::string u = "file:";
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '.' || c == '_' || c == '~') {
      u += static_cast<char>(c);
    } else {
      u += '%';
      u += kHex[c >> 4];
      u += kHex[c & 15];
    }
  }
  u += "?mode=ro";
  if (immutable) u += "&immutable=1";
  return u;
}

/// True when new files can be created in `dir` (not a read-only mount, write permission).
bool dir_writable(const std::string& dir) {
  struct statvfs sv;
  if (::statvfs(dir.c_str(), &sv) == 0 && (sv.f_flag & ST_RDONLY)) return false;
  return ::access(dir.c_str(), W_OK) == 0;
}
}  // namespace

std::string shape_to_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s;
}

Result<std::vector<int64_t>> shape_from_text(const std::string& text) {
  std::vector<int64_t> shape;
  if (text.empty()) return shape;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string part = text.substr(pos, comma - pos);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || errno != 0 || *end != '\0' || v < 0) {
      return data_loss("catalog: malformed shape '" + text + "'");
    }
    shape.push_back(v);
    pos = comma + 1;
  }
  return shape;
}

namespace {
struct Stmt {
  sqlite3_stmt* s = nullptr;
  Stmt() = default;
  Stmt(const Stmt&) = delete;
  ~Stmt() { sqlite3_finalize(s); }
};

constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS objects(key TEXT PRIMARY KEY, dtype INTEGER NOT NULL,"
    " shape TEXT NOT NULL, nbytes INTEGER NOT NULL, first_dir INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS chunks(key TEXT NOT NULL, idx INTEGER NOT NULL,"
    " dir INTEGER NOT NULL, offset INTEGER NOT NULL, nbytes INTEGER NOT NULL,"
    " checksum INTEGER NOT NULL, PRIMARY KEY(key, idx));";
/// A load statement that does not prepare (SQLITE_ERROR: "no such column", "no such
/// table") means the schema text in the file is damaged: DataLoss, not an I/O error.
Status schema_damage(Status e, sqlite3* db) {
  if ((sqlite3_extended_errcode(db) & 0xff) != SQLITE_ERROR) return e;
  return data_loss(e.message() + " (the catalog's schema is damaged)");
}

}  // namespace

Catalog::~Catalog() {
  if (db_) sqlite3_close_v2(db_);
}

Status Catalog::error(const char* what) {
  int ext = db_ ? sqlite3_extended_errcode(db_) : 0;
  std::string msg = std::string("catalog ") + path_ + ": " + what + ": " +
                    (db_ ? sqlite3_errmsg(db_) : "no database");
  int prim = ext & 0xff;
  if (prim == SQLITE_FULL) return resource_exhausted(msg, ENOSPC);
  if (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB) return data_loss(msg);
  if (prim == SQLITE_READONLY || prim == SQLITE_PERM) return permission_denied(msg);
  if (prim == SQLITE_BUSY || prim == SQLITE_LOCKED) return failed_precondition(msg);
  return Status(StatusCode::kIoError, msg, sqlite3_system_errno(db_));
}

Status Catalog::exec(const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  sqlite3_free(err);
  if (rc != SQLITE_OK) return error(sql);
  return Status::OK();
}

Status Catalog::check_objects_table(const char* what) {
  Stmt s;
  if (sqlite3_prepare_v2(db_, "SELECT count(*) FROM objects", -1, &s.s, nullptr) == SQLITE_OK) {
    return Status::OK();
  }
  // Only a file that is not (or no longer) a strata catalog is DataLoss; an I/O error or a
  // full file system while mapping the WAL index is reported as such.
  const int prim = sqlite3_extended_errcode(db_) & 0xff;
  if (prim == SQLITE_ERROR || prim == SQLITE_NOTADB || prim == SQLITE_CORRUPT) {
    return data_loss("catalog " + path_ + " is not a strata catalog: " + sqlite3_errmsg(db_));
  }
  return error(what);
}

Result<std::unique_ptr<Catalog>> Catalog::open(const std::string& path, bool create,
                                               bool read_only) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 && !create) {
    return not_found("no store catalog at " + path);
  }
  std::unique_ptr<Catalog> c(new Catalog());
  c->path_ = path;
  if (read_only) {
    // URI open with mode=ro: no write access needed as long as SQLite can map the WAL index
    // (-shm). On a read-only directory or filesystem it cannot create one; a catalog whose
    // last writer closed cleanly has no WAL then, and is opened immutable=1
    // (https://www.sqlite.org/uri.html). A left-over WAL cannot be read there: DataLoss.
    std::string dir = std::filesystem::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
    auto probe = [&](bool immutable) -> Status {
      if (c->db_) sqlite3_close_v2(c->db_);
      c->db_ = nullptr;
      std::string uri = sqlite_readonly_uri(path, immutable);
      int flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX;
      if (sqlite3_open_v2(uri.c_str(), &c->db_, flags, nullptr) != SQLITE_OK) {
        return c->error("open");
      }
      sqlite3_busy_timeout(c->db_, 5000);
      return c->check_objects_table("open (read only)");
    };
    Status st = probe(false);
    if (st.ok() || dir_writable(dir)) {
      if (!st.ok()) return st;
      return c;
    }
    struct stat wal;
    std::string wal_path = path + "-wal";
    if (::stat(wal_path.c_str(), &wal) == 0 && wal.st_size > 0) {
      return data_loss("catalog " + path + " has a write-ahead log (" + wal_path +
                       ") that cannot be read on a read-only directory: open the store once " +
                       "where it is writable (" + st.message() + ")");
    }
    STRATA_RETURN_IF_ERROR(probe(true));
    return c;
  }
  int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
  flags |= SQLITE_OPEN_NOMUTEX;  // the store serializes access (one committer thread)
  if (sqlite3_open_v2(path.c_str(), &c->db_, flags, nullptr) != SQLITE_OK) {
    return c->error("open");
  }
  sqlite3_busy_timeout(c->db_, 5000);
  if (!create) {
    // Without create, only an existing strata catalog is opened: a file without the
    // objects table (e.g. 0 bytes, or another program's database) is not made into one.
    STRATA_RETURN_IF_ERROR(c->check_objects_table("open"));
  }
  STRATA_RETURN_IF_ERROR(c->exec("PRAGMA journal_mode=WAL;"));
  STRATA_RETURN_IF_ERROR(c->exec("PRAGMA synchronous=FULL;"));
  STRATA_RETURN_IF_ERROR(c->exec(kSchema));
  return c;
}

Result<std::optional<std::string>> Catalog::get_meta(const std::string& name) {
  Stmt s;
  if (sqlite3_prepare_v2(db_, "SELECT value FROM meta WHERE name=?", -1, &s.s, nullptr) != SQLITE_OK)
    return schema_damage(error("prepare get_meta"), db_);
  sqlite3_bind_text(s.s, 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
  int rc = sqlite3_step(s.s);
  if (rc == SQLITE_ROW) {
    const char* v = reinterpret_cast<const char*>(sqlite3_column_text(s.s, 0));
    return std::optional<std::string>(v ? v : "");
  }
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  return error("get_meta");
}

Status Catalog::set_meta(const std::string& name, const std::string& value) {
  Stmt s;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO meta(name, value) VALUES(?, ?)", -1, &s.s,
                         nullptr) != SQLITE_OK)
    return error("prepare set_meta");
  sqlite3_bind_text(s.s, 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(s.s, 2, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(s.s) != SQLITE_DONE) return error("set_meta");
  return Status::OK();
}

Result<std::vector<ObjectRow>> Catalog::load_all(const std::string& prefix) {
  return load_rows(prefix, false);
}

Result<std::optional<ObjectRow>> Catalog::load_one(const std::string& key) {
  STRATA_ASSIGN_OR_RETURN(auto rows, load_rows(key, true));
  if (rows.empty()) return std::optional<ObjectRow>();
  return std::optional<ObjectRow>(std::move(rows.front()));
}

Result<std::vector<ObjectRow>> Catalog::load_rows(const std::string& k, bool exact) {
  // Objects and chunks are two SELECTs: without one read transaction around them, a
  // commit by another connection in between would pair an object with another version's
  // chunks (and look like a damaged row).
  STRATA_RETURN_IF_ERROR(exec("BEGIN"));
  auto rows = load_rows_in_txn(k, exact);
  Status end = exec("COMMIT");
  if (!rows.ok()) return rows.status();
  if (!end.ok()) return end;
  return rows;
}

Result<std::vector<ObjectRow>> Catalog::load_rows_in_txn(const std::string& prefix, bool exact) {
  std::vector<ObjectRow> rows;
  {
    Stmt s;
    if (sqlite3_prepare_v2(db_,
                           exact ? "SELECT key, dtype, shape, nbytes, first_dir FROM objects "
                                   "WHERE ?1 >= 0 AND key = ?2"
                                 : "SELECT key, dtype, shape, nbytes, first_dir FROM objects "
                                   "NOT INDEXED WHERE substr(key, 1, ?1) = ?2 ORDER BY key",
                           -1, &s.s, nullptr) != SQLITE_OK)
      return schema_damage(error("prepare load objects"), db_);
    sqlite3_bind_int64(s.s, 1, static_cast<int64_t>(prefix.size()));
    sqlite3_bind_blob(s.s, 2, prefix.data(), static_cast<int>(prefix.size()), SQLITE_TRANSIENT);
    int rc;
    while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) {
      ObjectRow r;
      r.key.assign(reinterpret_cast<const char*>(sqlite3_column_blob(s.s, 0)) ?: "",
                   static_cast<size_t>(sqlite3_column_bytes(s.s, 0)));
      int dt = sqlite3_column_int(s.s, 1);
      // A malformed row marks that object damaged; it never makes the store unopenable.
      if (dt < 0 || dt > static_cast<int>(DType::kBool)) {
        r.damage = "object '" + r.key + "' has unknown dtype " + std::to_string(dt);
      } else {
        r.dtype = static_cast<DType>(dt);
      }
      const char* sh = reinterpret_cast<const char*>(sqlite3_column_text(s.s, 2));
      auto shape = shape_from_text(sh ? sh : "");
      if (shape.ok()) {
        r.shape = std::move(*shape);
      } else if (r.damage.empty()) {
        r.damage = "object '" + r.key + "': " + shape.status().message();
      }
      r.nbytes = static_cast<uint64_t>(sqlite3_column_int64(s.s, 3));
      r.first_dir = static_cast<uint32_t>(sqlite3_column_int(s.s, 4));
      rows.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return error("load objects");
  }
  // Chunks in one pass, merged by key order (both sorted by key; BINARY collation = memcmp).
  // The prefix loads read the tables themselves (NOT INDEXED) and sort: the primary-key
  // indexes are redundant copies, and a damaged page of one must not hide every object.
  Stmt s;
  if (sqlite3_prepare_v2(db_,
                         exact ? "SELECT key, idx, dir, offset, nbytes, checksum FROM chunks "
                                 "WHERE ?1 >= 0 AND key = ?2 ORDER BY idx"
                               : "SELECT key, idx, dir, offset, nbytes, checksum FROM chunks "
                                 "NOT INDEXED WHERE substr(key, 1, ?1) = ?2 ORDER BY key, idx",
                         -1, &s.s, nullptr) != SQLITE_OK)
    return schema_damage(error("prepare load chunks"), db_);
  sqlite3_bind_int64(s.s, 1, static_cast<int64_t>(prefix.size()));
  sqlite3_bind_blob(s.s, 2, prefix.data(), static_cast<int>(prefix.size()), SQLITE_TRANSIENT);
  size_t oi = 0;
  std::map<std::string, ObjectRow> orphans;
  int rc;
  while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) {
    std::string key(reinterpret_cast<const char*>(sqlite3_column_blob(s.s, 0)) ?: "",
                    static_cast<size_t>(sqlite3_column_bytes(s.s, 0)));
    while (oi < rows.size() && rows[oi].key < key) ++oi;
    ObjectRow* row = nullptr;
    if (oi < rows.size() && rows[oi].key == key) {
      row = &rows[oi];
    } else {
      // Chunk rows without an object row (e.g. its key damaged): a damaged object of their
      // key, so that their extents stay in use (never reused nor punched out) and
      // list()/verify() report them; remove() deletes them.
      ObjectRow& o = orphans[key];
      if (o.key.empty()) {
        o.key = key;
        o.damage = "object '" + key + "' has chunk rows but no object row";
      }
      row = &o;
    }
    ChunkRow c;
    uint64_t idx = static_cast<uint64_t>(sqlite3_column_int64(s.s, 1));
    if (idx != row->chunks.size() && row->damage.empty())
      row->damage = "object '" + key + "' misses chunk " + std::to_string(row->chunks.size());
    c.dir = static_cast<uint32_t>(sqlite3_column_int(s.s, 2));
    c.offset = static_cast<uint64_t>(sqlite3_column_int64(s.s, 3));
    c.nbytes = static_cast<uint64_t>(sqlite3_column_int64(s.s, 4));
    c.checksum = static_cast<uint64_t>(sqlite3_column_int64(s.s, 5));
    row->chunks.push_back(c);
  }
  if (rc != SQLITE_DONE) return error("load chunks");
  if (!orphans.empty()) {
    for (auto& [k, o] : orphans) {
      for (auto& c : o.chunks) o.nbytes += c.nbytes;
      o.shape = {static_cast<int64_t>(o.nbytes)};
      rows.push_back(std::move(o));
    }
    std::sort(rows.begin(), rows.end(),
              [](const ObjectRow& a, const ObjectRow& b) { return a.key < b.key; });
  }
  for (auto& r : rows) {
    uint64_t sum = 0;
    for (auto& c : r.chunks) sum += c.nbytes;
    if (sum != r.nbytes && r.damage.empty())
      r.damage = "object '" + r.key + "' chunks hold " + std::to_string(sum) +
                 " bytes, expected " + std::to_string(r.nbytes);
  }
  return rows;
}

Result<std::vector<uint64_t>> Catalog::chunks_per_dir(size_t ndirs) {
  std::vector<uint64_t> out(ndirs, 0);
  Stmt s;
  if (sqlite3_prepare_v2(db_, "SELECT dir, count(*) FROM chunks GROUP BY dir", -1, &s.s,
                         nullptr) != SQLITE_OK)
    return error("prepare chunks_per_dir");
  int rc;
  while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) {
    int64_t dir = sqlite3_column_int64(s.s, 0);
    if (dir >= 0 && static_cast<uint64_t>(dir) < ndirs)
      out[static_cast<size_t>(dir)] = static_cast<uint64_t>(sqlite3_column_int64(s.s, 1));
  }
  if (rc != SQLITE_DONE) return error("chunks_per_dir");
  return out;
}

Status Catalog::apply(const std::vector<Op>& ops) {
  if (ops.empty()) return Status::OK();
  STRATA_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE;"));
  auto fail = [&](const char* what) {
    Status st = error(what);
    sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
    return st;
  };
  Stmt del_obj, del_chunks, ins_obj, ins_chunk;
  if (sqlite3_prepare_v2(db_, "DELETE FROM objects WHERE key=?", -1, &del_obj.s, nullptr) ||
      sqlite3_prepare_v2(db_, "DELETE FROM chunks WHERE key=?", -1, &del_chunks.s, nullptr) ||
      sqlite3_prepare_v2(db_,
                         "INSERT INTO objects(key, dtype, shape, nbytes, first_dir) "
                         "VALUES(?, ?, ?, ?, ?)",
                         -1, &ins_obj.s, nullptr) ||
      sqlite3_prepare_v2(db_,
                         "INSERT INTO chunks(key, idx, dir, offset, nbytes, checksum) "
                         "VALUES(?, ?, ?, ?, ?, ?)",
                         -1, &ins_chunk.s, nullptr)) {
    return fail("prepare apply");
  }
  auto bind_key = [](sqlite3_stmt* s, const std::string& k) {
    // Keys are stored as BLOBs of their UTF-8 bytes: exact, any content, memcmp order.
    sqlite3_bind_blob(s, 1, k.data(), static_cast<int>(k.size()), SQLITE_TRANSIENT);
  };
  for (const Op& op : ops) {
    for (sqlite3_stmt* s : {del_obj.s, del_chunks.s}) {
      sqlite3_reset(s);
      bind_key(s, op.row.key);
      if (sqlite3_step(s) != SQLITE_DONE) return fail(("delete object '" + op.row.key + "'").c_str());
    }
    if (op.kind == Op::kDelete) continue;
    const ObjectRow& r = op.row;
    sqlite3_reset(ins_obj.s);
    bind_key(ins_obj.s, r.key);
    sqlite3_bind_int(ins_obj.s, 2, static_cast<int>(r.dtype));
    std::string shape = shape_to_text(r.shape);
    sqlite3_bind_text(ins_obj.s, 3, shape.data(), static_cast<int>(shape.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(ins_obj.s, 4, static_cast<int64_t>(r.nbytes));
    sqlite3_bind_int(ins_obj.s, 5, static_cast<int>(r.first_dir));
    if (sqlite3_step(ins_obj.s) != SQLITE_DONE) return fail(("insert object '" + r.key + "'").c_str());
    for (size_t i = 0; i < r.chunks.size(); ++i) {
      const ChunkRow& c = r.chunks[i];
      sqlite3_reset(ins_chunk.s);
      bind_key(ins_chunk.s, r.key);
      sqlite3_bind_int64(ins_chunk.s, 2, static_cast<int64_t>(i));
      sqlite3_bind_int(ins_chunk.s, 3, static_cast<int>(c.dir));
      sqlite3_bind_int64(ins_chunk.s, 4, static_cast<int64_t>(c.offset));
      sqlite3_bind_int64(ins_chunk.s, 5, static_cast<int64_t>(c.nbytes));
      sqlite3_bind_int64(ins_chunk.s, 6, static_cast<int64_t>(c.checksum));
      if (sqlite3_step(ins_chunk.s) != SQLITE_DONE) return fail(("insert chunk " + std::to_string(i) + " of '" + r.key + "'").c_str());
    }
  }
  if (sqlite3_exec(db_, "COMMIT;", nullptr, nullptr, nullptr) != SQLITE_OK) return fail("commit");
  return Status::OK();
}

}  // namespace strata::catalog
