// Store input validation and on-disk identity: overflowing shapes, damaged catalog rows,
// duplicate NVMe directories, copied / moved stores, read-only filesystems, a deleted
// catalog, empty / NUL paths, data file space given back after ENOSPC.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "store/test_io_util.hpp"
#include "test_store_util.hpp"

namespace strata {
namespace {

using namespace store_test;
namespace fs = std::filesystem;

/// `dir` bind-mounted at `at` (created), then remounted read-only, for the object's
/// lifetime. Needs CAP_SYS_ADMIN: the test skips when !mounted().
class ReadOnlyBind {
 public:
  ReadOnlyBind(const std::string& dir, const std::string& at) : at_(at) {
    fs::create_directories(at);
    if (::mount(dir.c_str(), at.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      error_ = errno;
      return;
    }
    mounted_ = true;
    if (::mount(nullptr, at.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0) {
      remount_error_ = errno;
    }
  }
  ~ReadOnlyBind() {
    if (mounted_) ::umount2(at_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  int error() const { return error_; }                ///< errno of the bind mount
  int remount_error() const { return remount_error_; }  ///< errno of the read-only remount

 private:
  std::string at_;
  bool mounted_ = false;
  int error_ = 0, remount_error_ = 0;
};

/// Overwrites byte `offset` of the file `path` with `c` (to damage a chunk on disk).
void write_byte(const std::string& path, uint64_t offset, char c) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

/// The single strata-<uuid>.data file in `dir` ("" when none).
std::string data_file_in(const std::string& dir) {
  std::string found;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("strata-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".data") {
      found = e.path().string();
    }
  }
  return found;
}

/// "<uuid>" of the data file in `dir`.
std::string uuid_in(const std::string& dir) {
  std::string f = fs::path(data_file_in(dir)).filename().string();  // strata-<uuid>.data
  return f.size() > 12 ? f.substr(7, f.size() - 12) : "";
}

/// Runs `sql` on the catalog of the closed store at `root`.
void catalog_exec(const std::string& root, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((root + "/catalog.db").c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "") << " in " << sql;
  sqlite3_free(err);
  sqlite3_close(db);
}

std::string catalog_meta(const std::string& root, const std::string& name) {
  sqlite3* db = nullptr;
  std::string v;
  if (sqlite3_open_v2((root + "/catalog.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr) !=
      SQLITE_OK) {
    sqlite3_close(db);
    return v;
  }
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE name=?", -1, &s, nullptr);
  sqlite3_bind_text(s, 1, name.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(s) == SQLITE_ROW) v = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}

// ---------------------------------------------------------------- 1. shapes, damaged rows

TEST(StoreValidation, OverflowingShapeIsInvalidArgumentAndWritesNothing) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  float x[4] = {1, 2, 3, 4};
  Status st = s->put("k", x, TensorDesc{DType::kFloat32, {INT64_MAX, 4}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "put 'k': shape fp32[9223372036854775807, 4] overflows: numel * 4 bytes does "
            "not fit in 64 bits");
  // numel itself overflows (uint8: 2^63 * 4 elements).
  st = s->put("k", x, TensorDesc{DType::kUInt8, {int64_t{1} << 62, 8}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "put 'k': shape uint8[4611686018427387904, 8] overflows: numel * 1 bytes does not "
            "fit in 64 bits");
  st = s->put("n", x, TensorDesc{DType::kFloat32, {2, -1}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "put 'n': negative extent -1 in shape fp32[2, -1]");
  EXPECT_FALSE(s->contains("k"));
  EXPECT_EQ(s->usage().nvme_bytes, 0u);
  ASSERT_OK(s->put("ok", x, TensorDesc{DType::kFloat32, {4}}));
  ASSERT_OK(s->close());
  s.reset();
  auto r = open_or_die(small_options(d.path()));
  ASSERT_TRUE(r);
  auto l = r->list();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].key, "ok");
}

TEST(StoreValidation, DamagedCatalogRowLeavesTheRestReachable) {
  TempDir d;
  auto good = pattern(10000, 1);
  auto bad = pattern(3000, 2);
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("good", good.data(), TensorDesc::bytes(good.size())));
    ASSERT_OK(s->put("k", bad.data(), TensorDesc::bytes(bad.size())));
    ASSERT_OK(s->put("m", bad.data(), TensorDesc::bytes(bad.size())));
  }
  // The row the overflow defect committed: shape {INT64_MAX, 4}, nbytes 0, no chunks.
  catalog_exec(d.path(),
               "UPDATE objects SET dtype=0, shape='9223372036854775807,4', nbytes=0 "
               "WHERE key=CAST('k' AS BLOB); DELETE FROM chunks WHERE key=CAST('k' AS BLOB);"
               "UPDATE objects SET nbytes=-16 WHERE key=CAST('m' AS BLOB);");
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const std::string k_damage =
      "object 'k' has shape fp32[9223372036854775807, 4] whose size overflows 64 bits";
  const std::string m_damage = "object 'm' chunks hold 3000 bytes, expected 18446744073709551600";
  auto l = s->list();
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].key, "good");
  EXPECT_EQ(l[0].damage, "");
  EXPECT_EQ(l[1].key, "k");
  EXPECT_EQ(l[1].damage, k_damage);
  EXPECT_EQ(l[2].key, "m");
  EXPECT_EQ(l[2].damage, m_damage);
  expect_reads_back(*s, "good", good);
  std::vector<uint8_t> out(good.size());
  Status st = s->get_bytes("m", out.data(), 3000);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "store " + d.path() + ": " + m_damage);
  st = s->get("k", out.data(), TensorDesc{DType::kFloat32, {INT64_MAX, 4}});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "store " + d.path() + ": " + k_damage);
  EXPECT_EQ(s->read_range("m", 0, 1, out.data()).code(), StatusCode::kDataLoss);
  EXPECT_EQ(s->prefetch("m").code(), StatusCode::kDataLoss);
  auto v = s->verify();
  ASSERT_OK(v);
  ASSERT_EQ(v->errors.size(), 2u);
  EXPECT_EQ(v->errors[0].message(), "store " + d.path() + ": " + k_damage);
  EXPECT_EQ(v->errors[1].message(), "store " + d.path() + ": " + m_damage);
  auto ls = list_store(d.path());
  ASSERT_OK(ls);
  ASSERT_EQ(ls->size(), 3u);
  EXPECT_EQ((*ls)[2].damage, m_damage);
  // Replace one damaged object, remove the other: the store is whole again.
  ASSERT_OK(
      s->put("m", bad.data(), TensorDesc::bytes(bad.size()), PutOptions{.overwrite = true}));
  ASSERT_OK(s->remove("k"));
  ASSERT_OK(s->close());
  s.reset();
  auto r = open_or_die(small_options(d.path()));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->list().size(), 2u);
  expect_reads_back(*r, "m", bad);
  auto v2 = r->verify();
  ASSERT_OK(v2);
  EXPECT_TRUE(v2->errors.empty());
}

TEST(StoreValidation, OverlappingCatalogRowsDamageOnlyTheLaterObject) {
  TempDir d;
  auto a = pattern(5000, 13);  // extent [0, 8192)
  auto b = pattern(3000, 14);  // extent [8192, 12288)
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
    ASSERT_OK(s->put("b", b.data(), TensorDesc::bytes(b.size())));
  }
  catalog_exec(d.path(), "UPDATE chunks SET offset=4096 WHERE key=CAST('b' AS BLOB)");
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const std::string damage =
      "object 'b' chunk 0 (directory 0 offset 4096, 3000 bytes) overlaps object 'a'";
  auto info = s->stat("b");
  ASSERT_OK(info);
  EXPECT_EQ(info->damage, damage);
  expect_reads_back(*s, "a", a);
  std::vector<uint8_t> out(a.size());
  Status st = s->get_bytes("b", out.data(), b.size());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "store " + d.path() + ": " + damage);
  EXPECT_EQ(s->usage().nvme_bytes, 8192u);  // only a's extent is in use
  ASSERT_OK(s->remove("b"));
  auto c = pattern(9000, 15);
  ASSERT_OK(s->put("c", c.data(), TensorDesc::bytes(c.size())));
  ASSERT_OK(s->get_bytes("a", out.data(), out.size()));
  EXPECT_EQ(out, a);  // c was not placed over a
  auto v = s->verify();
  ASSERT_OK(v);
  EXPECT_TRUE(v->errors.empty());
}

// ---------------------------------------------------------------- 2. duplicate directories

TEST(StoreValidation, DuplicateOrAliasedNvmeDirsAreInvalidArgument) {
  TempDir d;
  fs::create_directories(d.sub("d"));
  fs::create_symlink(d.sub("d"), d.sub("link"));
  auto o = small_options(d.sub("root"));
  o.nvme_dirs = {d.sub("d"), d.sub("d")};
  auto r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "StoreOptions.nvme_dirs[0] '" + d.sub("d") + "' and StoreOptions.nvme_dirs[1] '" + d.sub("d") +
                "' are the same directory (" + d.sub("d") + "): each directory may be listed once");
  EXPECT_FALSE(fs::exists(d.sub("root")));  // rejected before anything is created
  o.nvme_dirs = {d.sub("e"), d.sub("d"), d.sub("./d/")};
  r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "StoreOptions.nvme_dirs[1] '" + d.sub("d") + "' and StoreOptions.nvme_dirs[2] '" + d.sub("./d/") +
                "' are the same directory (" + d.sub("d") + "): each directory may be listed once");
  o.nvme_dirs = {d.sub("d"), d.sub("link")};
  r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "StoreOptions.nvme_dirs[0] '" + d.sub("d") + "' and StoreOptions.nvme_dirs[1] '" + d.sub("link") +
                "' are the same directory (" + d.sub("d") + "): each directory may be listed once");
  // A bind mount: different paths, same inode.
  fs::create_directories(d.sub("bind"));
  if (::mount(d.sub("d").c_str(), d.sub("bind").c_str(), nullptr, MS_BIND, nullptr) == 0) {
    struct Unmount {
      std::string p;
      ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
    } um{d.sub("bind")};
    struct stat st;
    ASSERT_EQ(::stat(d.sub("d").c_str(), &st), 0);
    o.nvme_dirs = {d.sub("d"), d.sub("bind")};
    r = Store::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(),
              "StoreOptions.nvme_dirs[0] '" + d.sub("d") + "' and StoreOptions.nvme_dirs[1] '" + d.sub("bind") +
                  "' are the same directory (device " + std::to_string(st.st_dev) + " inode " +
                  std::to_string(st.st_ino) + "): each directory may be listed once");
  }
  // Distinct directories still work.
  o.nvme_dirs = {d.sub("d"), d.sub("e")};
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto a = pattern(3u << 20, 3);
  ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
  expect_reads_back(*s, "a", a);
}

// ---------------------------------------------------------------- 3. copied / moved stores

TEST(StoreValidation, CopiedAndMovedStoresWithDirsInsideTheRootAreIndependent) {
  TempDir d;
  auto o = small_options(d.sub("o"));
  o.nvme_dirs = {d.sub("o/nvme0"), d.sub("o/nvme1")};
  auto a = pattern((2u << 20) + 5, 4);
  auto b = pattern((2u << 20) + 5, 5);
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
  }
  EXPECT_EQ(catalog_meta(d.sub("o"), "nvme_dirs"), "nvme0\nnvme1\n");  // relative to the root
  fs::copy(d.sub("o"), d.sub("o-backup"), fs::copy_options::recursive);
  {
    auto bo = small_options(d.sub("o-backup"));
    auto s = open_or_die(bo);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->options().nvme_dirs,
              (std::vector<std::string>{d.sub("o-backup/nvme0"), d.sub("o-backup/nvme1")}));
    ASSERT_OK(
        s->put("a", b.data(), TensorDesc::bytes(b.size()), PutOptions{.overwrite = true}));
  }
  std::vector<uint8_t> out(a.size());
  {
    auto s = open_or_die(small_options(d.sub("o")));
    ASSERT_TRUE(s);
    ASSERT_OK(s->get_bytes("a", out.data(), out.size()));
    EXPECT_EQ(out, a);  // the copy did not write into the original's data files
    auto v = s->verify();
    ASSERT_OK(v);
    EXPECT_TRUE(v->errors.empty());
  }
  fs::rename(d.sub("o-backup"), d.sub("m2"));
  auto s = open_or_die(small_options(d.sub("m2")));
  ASSERT_TRUE(s);
  ASSERT_OK(s->get_bytes("a", out.data(), out.size()));
  EXPECT_EQ(out, b);
  EXPECT_FALSE(fs::exists(d.sub("o-backup")));  // nothing recreated at the old place
}

TEST(StoreValidation, CopyThatWouldShareAnOutsideDataFileIsRefused) {
  TempDir d;
  auto o = small_options(d.sub("r"));
  o.nvme_dirs = {d.sub("ext")};
  auto a = pattern(100000, 6);
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
  }
  EXPECT_EQ(catalog_meta(d.sub("r"), "nvme_dirs"), d.sub("ext") + "\n");  // outside: absolute
  const std::string uuid = uuid_in(d.sub("ext"));
  ASSERT_EQ(uuid.size(), 16u);
  fs::copy(d.sub("r"), d.sub("r2"), fs::copy_options::recursive);
  for (bool ro : {false, true}) {
    auto o2 = small_options(d.sub("r2"));
    o2.read_only = ro;
    auto r = Store::open(o2);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(r.status().message(),
              "store " + d.sub("r2") + ": nvme directory " + d.sub("ext") +
                  " holds the data file of store " + d.sub("r") + " (uuid " + uuid +
                  "), of which this store is a copy; the two would share one data file. Copy "
                  "the data file into a directory of the copy and reopen it with that "
                  "directory, or open the original");
  }
  // The original is unaffected.
  std::vector<uint8_t> out(a.size());
  {
    auto s = open_or_die(small_options(d.sub("r")));
    ASSERT_TRUE(s);
    ASSERT_OK(s->get_bytes("a", out.data(), out.size()));
    EXPECT_EQ(out, a);
  }
  // Moved (the original root is gone): the store adopts the directory.
  fs::remove_all(d.sub("r2"));
  fs::rename(d.sub("r"), d.sub("r3"));
  {
    auto s = open_or_die(small_options(d.sub("r3")));
    ASSERT_TRUE(s);
    ASSERT_OK(s->get_bytes("a", out.data(), out.size()));
    EXPECT_EQ(out, a);
  }
  // A missing data file is DataLoss, never replaced by an empty one.
  const std::string data = d.sub("ext") + "/strata-" + uuid + ".data";
  fs::remove(data);
  auto r = Store::open(small_options(d.sub("r3")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), "store " + d.sub("r3") + ": data file " + data +
                                      " is missing but 1 chunks are recorded in nvme directory " +
                                      d.sub("ext"));
  EXPECT_FALSE(fs::exists(data));
}

TEST(StoreValidation, MovedLegacyStoreWithAbsoluteDirsIsDataLossNotAnEmptyStore) {
  TempDir d;
  auto a = pattern(5000, 7);
  ASSERT_OK(put_and_close(small_options(d.sub("m")), "a", a));
  // Catalogs written before relocatable paths recorded the root's absolute path.
  catalog_exec(d.sub("m"), "UPDATE meta SET value='" + d.sub("m") + "\n' WHERE name='nvme_dirs'");
  fs::rename(d.sub("m"), d.sub("m2"));
  auto r = Store::open(small_options(d.sub("m2")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), "store " + d.sub("m2") + ": nvme directory " + d.sub("m") +
                                      " is missing but holds 1 chunks (was the store moved or "
                                      "copied without it?)");
  EXPECT_FALSE(fs::exists(d.sub("m")));
  // In place, an old absolute record is rewritten in the relocatable form.
  fs::rename(d.sub("m2"), d.sub("m"));
  {
    auto s = open_or_die(small_options(d.sub("m")));
    ASSERT_TRUE(s);
  }
  EXPECT_EQ(catalog_meta(d.sub("m"), "nvme_dirs"), ".\n");
}

// ---------------------------------------------------------------- 4. read-only filesystem

TEST(StoreValidation, ReadOnlyFilesystem) {
  TempDir d;
  auto a = pattern(70000, 8);
  ASSERT_OK(put_and_close(small_options(d.sub("s")), "a", a));
  const std::string ro = d.sub("ro");
  ReadOnlyBind view(d.sub("s"), ro);
  if (!view.mounted()) GTEST_SKIP() << "cannot bind-mount (" << std::strerror(view.error()) << ")";
  ASSERT_EQ(view.remount_error(), 0) << std::strerror(view.remount_error());
  auto l = list_store(ro);
  ASSERT_OK(l);
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, "a");
  auto o = small_options(ro);
  o.read_only = true;
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    expect_reads_back(*s, "a", a);
    auto v = s->verify();
    ASSERT_OK(v);
    EXPECT_EQ(v->chunks, 1u);
    EXPECT_TRUE(v->errors.empty());
  }
  o.read_only = false;
  auto r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status().sys_errno(), EROFS);
  EXPECT_EQ(r.status().message(),
            "open lock file " + ro + "/LOCK (errno 30: Read-only file system)");
}

TEST(StoreValidation, ReadOnlyFilesystemWhileAWriterHoldsTheWal) {
  TempDir d;
  auto a = pattern(7000, 16);
  auto w = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(w);
  ASSERT_OK(w->put("a", a.data(), TensorDesc::bytes(a.size())));  // committed in the WAL
  ASSERT_TRUE(fs::exists(d.sub("s/catalog.db-wal")));
  const std::string ro = d.sub("ro");
  ReadOnlyBind view(d.sub("s"), ro);
  if (!view.mounted()) GTEST_SKIP() << "cannot bind-mount (" << std::strerror(view.error()) << ")";
  ASSERT_EQ(view.remount_error(), 0) << std::strerror(view.remount_error());
  auto o = small_options(ro);
  o.read_only = true;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  expect_reads_back(*s, "a", a);
}

// ---------------------------------------------------------------- 5. deleted catalog

TEST(StoreValidation, MissingCatalogBesideDataFilesIsDataLoss) {
  TempDir d;
  auto a = pattern(5000, 9);
  ASSERT_OK(put_and_close(small_options(d.path()), "a", a));
  const std::string uuid = uuid_in(d.path());
  fs::remove(d.sub("catalog.db"));
  auto r = Store::open(small_options(d.path()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(),
            "catalog " + d.sub("catalog.db") + " missing but data files exist in " + d.path() +
                " (strata-" + uuid + ".data, strata-" + uuid +
                ".id): restore the catalog, or set StoreOptions.recreate_catalog to start an "
                "empty store beside them");
  EXPECT_FALSE(fs::exists(d.sub("catalog.db")));
  auto o = small_options(d.path());
  o.recreate_catalog = true;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->list().empty());
  EXPECT_TRUE(fs::exists(d.path() + "/strata-" + uuid + ".data"));  // left alone
}

TEST(StoreValidation, MissingCatalogIsDataLossForReadOnlyOpensToo) {
  TempDir d;
  auto a = pattern(5000, 9);
  ASSERT_OK(put_and_close(small_options(d.path()), "a", a));
  fs::remove(d.sub("catalog.db"));
  for (bool ro : {true, false}) {
    auto o = small_options(d.path());
    o.read_only = ro;
    o.create = false;
    auto r = Store::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  }
}

TEST(StoreValidation, OpeningADirectoryWithoutCreateLeavesItUntouched) {
  TempDir d;
  auto o = small_options(d.path());
  o.create = false;
  auto r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "no store catalog at " + d.sub("catalog.db"));
  EXPECT_TRUE(fs::is_empty(d.path()));  // no LOCK, no ballast
}

TEST(StoreValidation, AnEmptyCatalogFileIsNotMadeIntoAStoreWithoutCreate) {
  // Was: a directory holding only a 0-byte catalog.db became a new, empty store (LOCK,
  // ballast, data file) when opened writable without create.
  TempDir d;
  { std::ofstream(d.sub("catalog.db")).flush(); }
  for (bool ro : {false, true}) {
    auto o = small_options(d.path());
    o.create = false;
    o.read_only = ro;
    auto r = Store::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().to_string(),
              "DataLoss: catalog " + d.sub("catalog.db") +
                  " is not a strata catalog: no such table: objects");
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d.path())) names.push_back(e.path().filename());
    EXPECT_EQ(names, std::vector<std::string>{"catalog.db"});
    EXPECT_EQ(fs::file_size(d.sub("catalog.db")), 0u);
  }
  // With create, the empty file (e.g. left by a crash while the store was created) becomes
  // a store.
  auto a = pattern(5000, 61);
  ASSERT_OK(put_and_close(small_options(d.path()), "a", a));
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  expect_reads_back(*s, "a", a);
}

TEST(StoreValidation, CloseThatCannotWriteBackKeepsTheStoreOpen) {
  // Was: close() returned ResourceExhausted and closed anyway, dropping the dirty host
  // object for good. Now the store stays open: make room, close again, nothing is lost.
  TempDir d;
  auto o = small_options(d.path());
  o.chunk_bytes = 16u << 10;
  o.nvme_budget_bytes = 64u << 10;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto n = pattern(48u << 10, 62);
  auto h = pattern(32u << 10, 63);
  ASSERT_OK(s->put("n", n.data(), TensorDesc::bytes(n.size())));
  ASSERT_OK(s->put("h", h.data(), TensorDesc::bytes(h.size()), {Tier::kHost}));
  Status st = s->close();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("close: the store stays open"), std::string::npos)
      << st.to_string();
  std::vector<uint8_t> out(h.size());
  ASSERT_OK(s->get_bytes("h", out.data(), out.size()));  // still open and whole
  EXPECT_EQ(out, h);
  ASSERT_OK(s->remove("n"));
  ASSERT_OK(s->close());
  EXPECT_EQ(s->get_bytes("h", out.data(), out.size()).code(),
            StatusCode::kFailedPrecondition);
  s = open_or_die(o);
  ASSERT_TRUE(s);
  std::fill(out.begin(), out.end(), 0);
  ASSERT_OK(s->get_bytes("h", out.data(), out.size()));
  EXPECT_EQ(out, h);
  EXPECT_FALSE(s->contains("n"));
}

TEST(StoreValidation, AWriteBackThatFailsDoesNotStopTheOthers) {
  // One host object that can never fit the NVMe budget: flush/close fail with
  // ResourceExhausted, but every other pending change is still written and committed, also
  // when the destructor gives up. Was: the first failed write-back returned before the
  // commit, so the destructor dropped a deferred NVMe put and a write_range too.
  TempDir d;
  auto o = small_options(d.path());
  o.host_budget_bytes = 16u << 20;
  o.nvme_budget_bytes = 8u << 20;
  o.durability = Durability::kOnFlush;
  auto a = pattern(1u << 20, 81), b = pattern(1u << 20, 82), big = pattern(9u << 20, 83);
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
    ASSERT_OK(s->flush());
    ASSERT_OK(s->put("b", b.data(), TensorDesc::bytes(b.size())));  // commit deferred
    std::vector<uint8_t> patch(4096, 0x77);
    ASSERT_OK(s->write_range("a", 0, patch.size(), patch.data()));
    std::copy(patch.begin(), patch.end(), a.begin());
    ASSERT_OK(s->put("big", big.data(), TensorDesc::bytes(big.size()), {Tier::kHost}));
    EXPECT_EQ(s->flush().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(s->close().code(), StatusCode::kResourceExhausted);
  }  // the destructor closes, dropping only "big"
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  std::vector<std::string> keys;
  for (const auto& i : s->list()) keys.push_back(i.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b"}));
  expect_reads_back(*s, "a", a);
  expect_reads_back(*s, "b", b);
}

TEST(StoreValidation, CallsRacingCloseAndAfterItFailCleanly) {
  // Was: verify() in one thread while another closed the store used the freed staging
  // pools (SIGSEGV); after close, stat() said NotFound and verify() "0 objects, OK".
  for (int round = 0; round < 5; ++round) {
    TempDir d;
    auto o = small_options(d.path());
    o.staging_bytes = 64u << 10;  // verify streams every chunk through the staging pool
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    auto v = pattern(3u << 20, 90 + round);
    for (int k = 0; k < 4; ++k) {
      ASSERT_OK(s->put("k" + std::to_string(k), v.data(), TensorDesc::bytes(v.size())));
    }
    std::atomic<bool> started{false};
    Status vst;
    std::thread verifier([&] {
      started = true;
      for (int i = 0; i < 3; ++i) {
        auto r = s->verify();
        vst = r.status();
        if (!r.ok()) return;
        EXPECT_EQ(r->objects, 4u);
        EXPECT_TRUE(r->errors.empty());
      }
    });
    while (!started) std::this_thread::yield();
    ASSERT_OK(s->close());
    verifier.join();
    EXPECT_TRUE(vst.ok() || vst.code() == StatusCode::kFailedPrecondition) << vst.to_string();
    EXPECT_EQ(s->stat("k0").status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s->verify().status().code(), StatusCode::kFailedPrecondition);
    EXPECT_FALSE(s->contains("k0"));
    EXPECT_TRUE(s->list().empty());
    EXPECT_EQ(s->usage().objects, 0u);
  }
}

TEST(StoreValidation, DamagedChunkSizeOrDirectoryRecordIsDataLoss) {
  // Values that once threw (std::stoull), divided by zero or sent unaligned direct I/O.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"chunk_bytes", "abc"},  {"chunk_bytes", "99999999999999999999"},
      {"chunk_bytes", "0"},    {"chunk_bytes", "-4096"},
      {"chunk_bytes", "4097"}, {"chunk_bytes", "4096x"},
      {"nvme_dirs", ""},       {"nvme_dirs", "."}};
  for (const auto& [name, value] : bad) {
    TempDir d;
    {
      auto s = open_or_die(small_options(d.path()));
      ASSERT_TRUE(s);
      auto a = pattern(5000, 9);
      ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
    }
    catalog_exec(d.path(), "UPDATE meta SET value='" + value + "' WHERE name='" + name + "'");
    for (bool ro : {true, false}) {
      auto o = small_options(d.path());
      o.read_only = ro;
      auto r = Store::open(o);
      ASSERT_FALSE(r.ok()) << name << "=" << value;
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
      EXPECT_NE(r.status().message().find("'" + value + "'"), std::string::npos)
          << r.status().to_string();
    }
    if (name == "chunk_bytes") {  // `strata store ls` agrees with open (was per-row damage)
      auto l = list_store(d.path());
      ASSERT_FALSE(l.ok()) << value;
      EXPECT_EQ(l.status().code(), StatusCode::kDataLoss) << l.status().to_string();
    }
  }
}

// ---------------------------------------------------------------- 6. paths

TEST(StoreValidation, EmptyOrNulPathsAreInvalidArgument) {
  StoreOptions o;
  o.path = "";
  auto r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "StoreOptions.path is empty");
  o.path = std::string("/var/tmp/a\0b", 12);
  r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "StoreOptions.path '/var/tmp/a\\0b' contains a NUL byte");
  TempDir d;
  o.path = d.sub("s");
  o.nvme_dirs = {d.sub("n"), ""};
  r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "StoreOptions.nvme_dirs[1] is empty");
  auto l = list_store("");
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l.status().message(), "store path is empty");
  l = list_store(std::string("x\0y", 3));
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l.status().message(), "store path 'x\\0y' contains a NUL byte");
}

// An nvme directory whose parent is missing (an unmounted drive, a typo) is refused instead
// of being created with its parents on whatever disk holds the path; one level is created.
TEST(StoreValidation, NvmeDirWithAMissingParentIsNotFoundAndCreatesNothing) {
  TempDir d;
  StoreOptions o;
  o.path = d.sub("s");
  o.nvme_dirs = {d.sub("nvme0"), d.sub("mnt/nvmee0/strata")};
  auto r = Store::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(),
            "nvme directory " + d.sub("mnt/nvmee0/strata") + ": its parent " + d.sub("mnt/nvmee0") +
                " does not exist (an unmounted drive or a typo?); create " + d.sub("mnt/nvmee0") +
                " first");
  EXPECT_FALSE(std::filesystem::exists(d.sub("mnt")));
  std::filesystem::create_directories(d.sub("mnt/nvmee0"));
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  EXPECT_TRUE(std::filesystem::is_directory(d.sub("mnt/nvmee0/strata")));
  auto a = pattern(3u << 20, 5);
  ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
  expect_reads_back(*s, "a", a);
}

// ---------------------------------------------------------------- 7. ENOSPC gives space back

TEST(StoreValidation, FailedPutGivesBackPreallocatedSpace) {
  strata::testing::MountedDir tmpfs("tmpfs", 0, "size=6m", "tiny");
  if (!tmpfs.ok()) GTEST_SKIP() << tmpfs.why();
  const std::string& mnt = tmpfs.path();
  auto o = small_options(tmpfs.parent().sub("root"), mnt);
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto small = pattern(1u << 20, 10);
  ASSERT_OK(s->put("small", small.data(), TensorDesc::bytes(small.size())));
  const std::string data = data_file_in(mnt);
  ASSERT_FALSE(data.empty());
  auto big = pattern(16u << 20, 11);
  Status st = s->put("big", big.data(), TensorDesc::bytes(big.size()));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_EQ(st.sys_errno(), ENOSPC);
  EXPECT_FALSE(s->contains("big"));
  EXPECT_EQ(fs::file_size(data), 1u << 20);  // back to the committed extents
  // The space is usable again: 4 MiB fit where the failed put had grown the file.
  auto mid = pattern(4u << 20, 12);
  ASSERT_OK(s->put("mid", mid.data(), TensorDesc::bytes(mid.size())));
  expect_reads_back(*s, "mid", mid);
}

TEST(StoreValidation, FailedWriteRangeGivesBackGrownSpace) {
  // A partial-chunk write_range reads the old chunk (verified) into a new, copy-on-write
  // extent past the end of the data file, so the file grows first; when the old chunk's
  // checksum then fails, the new extent is released and the file shrinks back.
  TempDir d;
  auto o = small_options(d.path());  // 1 MiB chunks, one NVMe directory (the store's own)
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto x = pattern(4u << 20, 21);
  ASSERT_OK(s->put("x", x.data(), TensorDesc::bytes(x.size())));
  const std::string data = data_file_in(d.path());
  ASSERT_FALSE(data.empty());
  ASSERT_EQ(fs::file_size(data), 4u << 20);
  write_byte(data, 100, static_cast<char>(x[100] ^ 0xff));
  uint8_t patch[100];
  std::memset(patch, 0x42, sizeof patch);
  Status st = s->write_range("x", 10, sizeof patch, patch);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
  EXPECT_NE(st.to_string().find("'x'"), std::string::npos) << st.to_string();
  EXPECT_EQ(fs::file_size(data), 4u << 20);  // the grown space is given back
  // The store stays usable: the undamaged chunks read back, new objects go in.
  std::vector<uint8_t> tail(3u << 20);
  ASSERT_OK(s->read_range("x", 1u << 20, tail.size(), tail.data()));
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), x.begin() + (1u << 20)));
  auto y = pattern(1u << 20, 22);
  ASSERT_OK(s->put("y", y.data(), TensorDesc::bytes(y.size())));
  expect_reads_back(*s, "y", y);
}

TEST(StoreValidation, FailedWriteRangeLeavesEveryChunkAsItWas) {
  // A write_range over chunks 0-3 whose last chunk is partial (read-modify-write) and
  // damaged: chunks 0-2 are written first, then chunk 3's checksum fails. Was: chunks 0-2
  // kept the new bytes (and a flush committed them); now the object reads as before.
  TempDir d;
  auto o = small_options(d.path());  // 1 MiB chunks
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto x = pattern(4u << 20, 23);
  ASSERT_OK(s->put("x", x.data(), TensorDesc::bytes(x.size())));
  const std::string data = data_file_in(d.path());
  ASSERT_FALSE(data.empty());
  const uint64_t damaged = (3u << 20) + 700000;  // chunk 3, outside the range written below
  write_byte(data, damaged, static_cast<char>(x[damaged] ^ 0xff));
  std::vector<uint8_t> patch((3u << 20) + 4096, 0x5a);
  Status st = s->write_range("x", 0, patch.size(), patch.data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
  EXPECT_NE(st.to_string().find("'x': checksum mismatch in chunk 3"), std::string::npos) << st.to_string();
  ASSERT_OK(s->flush());
  std::vector<uint8_t> head(3u << 20);
  ASSERT_OK(s->read_range("x", 0, head.size(), head.data()));
  EXPECT_TRUE(std::equal(head.begin(), head.end(), x.begin()));
  ASSERT_OK(s->close());
  s = open_or_die(o);
  ASSERT_TRUE(s);
  std::fill(head.begin(), head.end(), 0);
  ASSERT_OK(s->read_range("x", 0, head.size(), head.data()));
  EXPECT_TRUE(std::equal(head.begin(), head.end(), x.begin()));
}

TEST(StoreValidation, DirectoryRecordListingOneDirectoryTwiceIsDataLossAndTouchesNothing) {
  // Was: a writable open succeeded and trimmed the shared data file to 0 bytes.
  TempDir d;
  auto a = pattern(400000, 9);
  ASSERT_OK(put_and_close(small_options(d.path()), "a", a));
  const std::string data = data_file_in(d.path());
  const auto size = fs::file_size(data);
  catalog_exec(d.path(), "UPDATE meta SET value=char(46,10,46,10) WHERE name='nvme_dirs'");
  for (bool ro : {true, false}) {
    auto o = small_options(d.path());
    o.read_only = ro;
    auto r = Store::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
    EXPECT_NE(r.status().message().find("nvme_dirs record is damaged: nvme_dirs[0] '"),
              std::string::npos)
        << r.status().to_string();
  }
  EXPECT_EQ(fs::file_size(data), size);
}

TEST(StoreValidation, FullFileSystemLeavesTheStoreUsable) {
  // Fill a small file system holding the whole store (catalog and data) with puts until
  // one fails; removing an object must still commit (the catalog needs room for its WAL),
  // and the freed space must take new objects. Was: every later commit failed with
  // "database or disk is full", reopen included.
  strata::testing::MountedDir tmpfs("tmpfs", 0, "size=40m", "small");
  if (!tmpfs.ok()) GTEST_SKIP() << tmpfs.why();
  const std::string& mnt = tmpfs.path();
  auto o = small_options(mnt);
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto obj = pattern(4u << 20, 30);
  int n = 0;
  Status st;
  for (; n < 20; ++n) {
    st = s->put("o" + std::to_string(n), obj.data(), TensorDesc::bytes(obj.size()));
    if (!st.ok()) break;
  }
  ASSERT_LT(n, 20) << "the file system never filled up";
  ASSERT_GE(n, 4);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_FALSE(s->contains("o" + std::to_string(n)));
  // Fill the last bytes with a plain file too, so not even the growth slack is left.
  {
    std::ofstream f(mnt + "/filler", std::ios::binary);
    std::vector<char> junk(64 << 10, 'x');
    while (f.write(junk.data(), junk.size())) {
    }
  }
  ASSERT_OK(s->remove("o0"));
  fs::remove(mnt + "/filler");
  ASSERT_OK(s->put("again", obj.data(), TensorDesc::bytes(obj.size())));
  ASSERT_OK(s->close());
  s.reset();
  auto r = open_or_die(o);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->contains("o0"));
  for (const std::string& k : {std::string("o1"), std::string("again")}) {
    expect_reads_back(*r, k, obj);
  }
  auto v = r->verify();
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(v->errors.empty());
  EXPECT_EQ(v->objects, static_cast<uint64_t>(n));  // o1..o(n-1) and "again"
}

TEST(StoreValidation, FullFileSystemStillOpensAndRemoves) {
  // Close a store, fill its file system to the last byte, reopen it (SQLite needs room to
  // open the catalog in WAL mode), and remove objects; a put that would grow the data file
  // into the released ballast's room must not take it: removes keep committing.
  strata::testing::MountedDir tmpfs("tmpfs", 0, "size=40m", "small");
  if (!tmpfs.ok()) GTEST_SKIP() << tmpfs.why();
  const std::string& mnt = tmpfs.path();
  auto o = small_options(mnt);
  auto obj = pattern(4u << 20, 31);
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    for (int i = 0; i < 4; ++i) {
      ASSERT_OK(s->put("o" + std::to_string(i), obj.data(), TensorDesc::bytes(obj.size())));
    }
    ASSERT_OK(s->close());
  }
  {
    std::ofstream f(mnt + "/filler", std::ios::binary);
    std::vector<char> junk(4096, 'x');
    while (f.write(junk.data(), junk.size())) {
    }
  }
  auto s = open_or_die(o);  // was: IoError "PRAGMA journal_mode=WAL;: disk I/O error"
  ASSERT_TRUE(s);
  ASSERT_OK(s->remove("o0"));
  // 6 MiB: 4 chunks fit the hole o0 left, 2 need the data file to grow: no room.
  auto big = pattern(6u << 20, 32);
  Status st = s->put("big", big.data(), TensorDesc::bytes(big.size()));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  ASSERT_OK(s->remove("o1"));
  ASSERT_OK(s->remove("o2"));
  ASSERT_OK(s->put("small", obj.data(), TensorDesc::bytes(1u << 20)));  // freed extents
  ASSERT_OK(s->close());
  s.reset();
  fs::remove(mnt + "/filler");
  auto r = open_or_die(o);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->list().size(), 2u);  // o3, small
  auto v = r->verify();
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(v->errors.empty());
  expect_reads_back(*r, "o3", obj);
  EXPECT_TRUE(fs::exists(mnt + "/catalog.ballast"));  // recreated once there was room
}

TEST(StoreValidation, ReadOnlyOpenBesideAWriterSeesNoFalseDamage) {
  // A writer overwrites four keys in a loop (copy-on-write: each new version reuses the
  // extents freed by the one before last) while a read-only open of the same store gets and
  // verifies them. The reader's catalog snapshot goes stale; a checksum error against a row
  // the writer has since replaced must lead to the current version, not a DataLoss report.
  TempDir d;
  auto wo = small_options(d.path());  // 1 MiB chunks
  auto w = open_or_die(wo);
  ASSERT_TRUE(w);
  const uint64_t n = (5u << 20) / 2;  // 2.5 MiB: three chunks, the last one partial
  auto version = [&](uint32_t v) { return std::vector<uint8_t>(n, static_cast<uint8_t>(v)); };
  for (int k = 0; k < 4; ++k) {
    auto b = version(0);
    ASSERT_OK(w->put("k" + std::to_string(k), b.data(), TensorDesc::bytes(n)));
  }
  auto ro = small_options(d.path());
  ro.read_only = true;
  auto r = open_or_die(ro);
  ASSERT_TRUE(r);
  std::atomic<bool> stop{false};
  std::atomic<uint32_t> written{0};
  std::thread writer([&] {
    for (uint32_t v = 1; !stop.load(); ++v) {
      auto b = version(v);
      PutOptions po;
      po.overwrite = true;
      for (int k = 0; k < 4 && !stop.load(); ++k) {
        if (!w->put_async("k" + std::to_string(k), b.data(), TensorDesc::bytes(n), po).result().ok()) {
          return;
        }
      }
      written = v;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<uint8_t> out(n);
  int gets = 0;
  for (int round = 0; round < 30; ++round) {
    auto v = r->verify();
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    for (const auto& e : v->errors) ADD_FAILURE() << "round " << round << ": " << e.to_string();
    EXPECT_EQ(v->objects, 4u);
    for (int k = 0; k < 4; ++k) {
      ASSERT_OK(r->get_bytes("k" + std::to_string(k), out.data(), n));
      // One whole version: every byte equal to the first.
      EXPECT_EQ(std::count(out.begin(), out.end(), out[0]), static_cast<long>(n));
      ++gets;
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(gets, 120);
  // Keys the writer creates, replaces and removes after the read-only open are seen as
  // they are now by stat/contains/get/list/verify.
  auto keys_and_sizes = [&](std::string_view prefix) {
    std::vector<std::pair<std::string, uint64_t>> v;
    for (const auto& i : r->list(prefix)) v.emplace_back(i.key, i.nbytes);
    return v;
  };
  using KS = std::vector<std::pair<std::string, uint64_t>>;
  auto c = pattern(5000, 41);
  ASSERT_OK(w->put("created-later", c.data(), TensorDesc::bytes(c.size())));
  EXPECT_EQ(keys_and_sizes(""), (KS{{"created-later", 5000}, {"k0", n}, {"k1", n}, {"k2", n},
                                    {"k3", n}}));
  EXPECT_EQ(keys_and_sizes("cr"), (KS{{"created-later", 5000}}));
  auto vr = r->verify();
  ASSERT_TRUE(vr.ok()) << vr.status().to_string();
  EXPECT_EQ(vr->objects, 5u);
  EXPECT_TRUE(vr->errors.empty());
  EXPECT_TRUE(r->contains("created-later"));
  auto info = r->stat("created-later");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->nbytes, 5000u);
  expect_reads_back(*r, "created-later", c);
  PutOptions po;
  po.overwrite = true;
  ASSERT_OK(w->put_async("created-later", c.data(), TensorDesc::bytes(4000), po).result().status());
  info = r->stat("created-later");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->nbytes, 4000u);
  EXPECT_EQ(keys_and_sizes("cr"), (KS{{"created-later", 4000}}));
  ASSERT_OK(w->remove("created-later"));
  EXPECT_EQ(keys_and_sizes("cr"), KS{});
  EXPECT_EQ(keys_and_sizes("").size(), 4u);
  EXPECT_FALSE(r->contains("created-later"));
  EXPECT_EQ(r->stat("created-later").status().code(), StatusCode::kNotFound);
  EXPECT_GT(written.load(), 2u);  // the writer did overwrite during the reads
}

}  // namespace
}  // namespace strata
