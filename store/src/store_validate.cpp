// strata::store (private) — validation of store inputs and identity. See store_validate.hpp.
#include "store_validate.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "strata/base/logging.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::store_detail {

namespace fs = std::filesystem;

namespace {
constexpr uint64_t kAlign = 4096;
constexpr const char* kMarkerMagic = "strata store marker 1";

std::string normalize(const std::string& p) {
  std::error_code ec;
  std::string a = fs::absolute(p, ec).lexically_normal().string();
  if (ec) a = fs::path(p).lexically_normal().string();
  while (a.size() > 1 && a.back() == '/') a.pop_back();
  return a;
}


/// Durable replace: write `path`.tmp, fsync, rename over `path`, fsync the directory.
Status write_file_durably(const std::string& dir, const std::string& path,
                          const std::string& text) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "create " + tmp);
  ssize_t n = ::write(fd, text.data(), text.size());
  int e = errno;
  if (n != static_cast<ssize_t>(text.size())) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return errno_status(n < 0 ? e : EIO, "write " + tmp);
  }
  if (::fsync(fd) != 0) {
    e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return errno_status(e, "fsync " + tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    e = errno;
    ::unlink(tmp.c_str());
    return errno_status(e, "rename " + tmp + " to " + path);
  }
  return fsync_directory(dir);
}

struct Marker {
  std::string uuid;
  std::string root;
};

/// Reads a marker file; nullopt when absent. \error DataLoss when malformed.
Result<std::optional<Marker>> read_marker(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT || !fs::exists(path)) return std::optional<Marker>();
    return errno_status(errno, "read store marker " + path);
  }
  std::string line;
  Marker m;
  if (!std::getline(in, line) || line != kMarkerMagic) {
    return data_loss("store marker " + path + " is not a strata marker");
  }
  while (std::getline(in, line)) {
    if (line.rfind("uuid ", 0) == 0) m.uuid = line.substr(5);
    if (line.rfind("root ", 0) == 0) m.root = line.substr(5);
  }
  if (m.uuid.empty() || m.root.empty()) {
    return data_loss("store marker " + path + " lacks its uuid or root line");
  }
  return std::optional<Marker>(m);
}

Status write_marker(const std::string& dir, const std::string& uuid, const std::string& root) {
  std::string text = std::string(kMarkerMagic) + "\nuuid " + uuid + "\nroot " + root + "\n";
  return write_file_durably(dir, marker_file_path(dir, uuid), text);
}

/// The uuid recorded in the catalog of the store at `root`; nullopt when none is readable.
std::optional<std::string> catalog_uuid(const std::string& root) {
  std::string cat = root + "/catalog.db";
  std::error_code ec;
  if (!fs::exists(cat, ec)) return std::nullopt;
  auto c = catalog::Catalog::open(cat, false, true);
  if (!c.ok()) return std::nullopt;
  auto u = (*c)->get_meta("store_uuid");
  if (!u.ok() || !*u) return std::nullopt;
  return **u;
}
}  // namespace

Status fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "open directory " + dir);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return errno_status(e, "fsync directory " + dir);
  return Status::OK();
}

std::optional<uint64_t> checked_nbytes(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(dtype)), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

Status check_tensor_desc(std::string_view op, const std::string& key, const TensorDesc& desc) {
  if (!dtype_is_valid(desc.dtype)) {
    return invalid_argument(std::string(op) + " '" + key + "': dtype value " +
                            std::to_string(static_cast<int>(desc.dtype)) + " is not a DType");
  }
  for (int64_t d : desc.shape) {
    if (d < 0) {
      return invalid_argument(std::string(op) + " '" + key + "': negative extent " +
                              std::to_string(d) + " in shape " + to_string(desc));
    }
  }
  if (!checked_nbytes(desc.dtype, desc.shape)) {
    return invalid_argument(std::string(op) + " '" + key + "': shape " + to_string(desc) +
                            " overflows: numel * " + std::to_string(dtype_size(desc.dtype)) +
                            " bytes does not fit in 64 bits");
  }
  return Status::OK();
}

std::string printable_path(std::string_view path) {
  std::string s;
  for (char c : path) {
    if (c == '\0') {
      s += "\\0";
    } else if (c == '\n') {
      s += "\\n";
    } else {
      s += c;
    }
  }
  return s;
}

Status check_path(std::string_view what, std::string_view path) {
  if (path.empty()) return invalid_argument(std::string(what) + " is empty");
  if (path.find('\0') != std::string_view::npos) {
    return invalid_argument(std::string(what) + " '" + printable_path(path) +
                            "' contains a NUL byte");
  }
  if (path.find('\n') != std::string_view::npos) {
    return invalid_argument(std::string(what) + " '" + printable_path(path) +
                            "' contains a newline");
  }
  return Status::OK();
}

Status check_store_paths(const StoreOptions& o) {
  STRATA_RETURN_IF_ERROR(check_path("StoreOptions.path", o.path));
  for (size_t i = 0; i < o.nvme_dirs.size(); ++i) {
    STRATA_RETURN_IF_ERROR(
        check_path("StoreOptions.nvme_dirs[" + std::to_string(i) + "]", o.nvme_dirs[i]));
  }
  return check_distinct_directories(o.nvme_dirs, [](size_t i) {
    return "StoreOptions.nvme_dirs[" + std::to_string(i) + "]";
  });
}

bool inside_root(const std::string& root, const std::string& dir) {
  if (dir == root) return true;
  if (root == "/") return !dir.empty() && dir[0] == '/';
  return dir.size() > root.size() && dir.compare(0, root.size(), root) == 0 &&
         dir[root.size()] == '/';
}

std::string encode_dir(const std::string& root, const std::string& dir) {
  if (dir == root) return ".";
  if (inside_root(root, dir)) return dir.substr(root == "/" ? 1 : root.size() + 1);
  return dir;
}

std::string decode_dir(const std::string& root, const std::string& recorded) {
  if (!recorded.empty() && recorded[0] == '/') return recorded;
  if (recorded.empty() || recorded == ".") return root;
  return normalize(root + "/" + recorded);
}

Result<std::vector<std::string>> parse_dirs_record(const std::string& root,
                                                   const std::string& record,
                                                   const std::string& cat_path) {
  std::vector<std::string> dirs;
  std::string_view rest = record;
  size_t pos;
  while ((pos = rest.find('\n')) != std::string_view::npos) {
    dirs.push_back(decode_dir(root, std::string(rest.substr(0, pos))));
    rest.remove_prefix(pos + 1);
  }
  if (dirs.empty() || !rest.empty()) {
    return data_loss("catalog " + cat_path + ": nvme_dirs record is malformed ('" +
                     printable_path(record) + "')");
  }
  // A directory listed twice would give two directory slots one data file (and trimming
  // one slot's file to its extents would cut the other's).
  if (Status dup = check_distinct_directories(
          dirs, [](size_t i) { return "nvme_dirs[" + std::to_string(i) + "]"; });
      !dup.ok()) {
    return data_loss("catalog " + cat_path + ": nvme_dirs record is damaged: " + dup.message());
  }
  return dirs;
}

Status record_dirs_relocatable(catalog::Catalog& cat, const std::string& root,
                               const std::vector<std::string>& dirs) {
  std::string joined;
  for (const auto& d : dirs) joined += encode_dir(root, d) + "\n";
  STRATA_ASSIGN_OR_RETURN(auto rec, cat.get_meta("nvme_dirs"));
  if (rec && *rec == joined) return Status::OK();
  return cat.set_meta("nvme_dirs", joined);
}

std::string data_file_path(const std::string& dir, const std::string& uuid) {
  return dir + "/strata-" + uuid + ".data";
}

std::string marker_file_path(const std::string& dir, const std::string& uuid) {
  return dir + "/strata-" + uuid + ".id";
}

Status check_orphaned_data(const std::string& cat_path, const std::string& root,
                           const std::vector<std::string>& nvme_dirs) {
  std::vector<std::string> dirs{root};
  for (const auto& d : nvme_dirs) dirs.push_back(normalize(d));
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    // The root belongs to one store: any strata data file there is this store's. Other
    // directories may be shared by several stores: only a marker naming this root counts.
    const bool own = dir == root;
    std::vector<std::string> found;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.rfind("strata-", 0) != 0) continue;
      auto ends = [&](const std::string& suf) {
        return name.size() > suf.size() &&
               name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
      };
      if (own && (ends(".data") || ends(".id"))) {
        found.push_back(name);
      } else if (!own && ends(".id")) {
        auto m = read_marker(it->path().string());
        if (m.ok() && *m && (*m)->root == root) {
          found.push_back(name);
          std::string data = name.substr(0, name.size() - 3) + ".data";
          if (fs::exists(dir + "/" + data, ec)) found.push_back(data);
        }
      }
    }
    if (found.empty()) continue;
    std::sort(found.begin(), found.end());
    std::string names;
    for (const auto& n : found) names += (names.empty() ? "" : ", ") + n;
    return data_loss("catalog " + cat_path + " missing but data files exist in " + dir + " (" +
                     names + "): restore the catalog, or set " +
                     "StoreOptions.recreate_catalog to start an empty store beside them");
  }
  return Status::OK();
}

Status prepare_nvme_dirs(const std::string& root, const std::string& uuid,
                         const std::vector<std::string>& dirs, const std::vector<uint64_t>& chunks,
                         bool read_only) {
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string& dir = dirs[i];
    const uint64_t held = i < chunks.size() ? chunks[i] : 0;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      if (held > 0) {
        return data_loss("store " + root + ": nvme directory " + dir + " is missing but holds " +
                         std::to_string(held) + " chunks (was the store moved or copied " +
                         "without it?)");
      }
      if (read_only) continue;  // the caller reports the missing directory
      fs::create_directories(dir, ec);
      if (ec) return errno_status(ec.value(), "create nvme directory " + dir);
    }
    const std::string data = data_file_path(dir, uuid);
    const std::string mpath = marker_file_path(dir, uuid);
    if (held > 0 && !fs::exists(data, ec)) {
      return data_loss("store " + root + ": data file " + data + " is missing but " +
                       std::to_string(held) + " chunks are recorded in nvme directory " + dir);
    }
    STRATA_ASSIGN_OR_RETURN(auto m, read_marker(mpath));
    if (m && m->uuid != uuid) {
      return data_loss("store marker " + mpath + " names store uuid " + m->uuid + ", expected " +
                       uuid);
    }
    bool rewrite = !m;
    if (m && m->root != root) {
      if (!inside_root(root, dir) && m->root != root) {
        // The directory is shared with the store the marker names. When that store still
        // exists with the same identity, this store is a copy of it: both would write into
        // one data file.
        auto other = catalog_uuid(m->root);
        if (other && *other == uuid) {
          return failed_precondition(
              "store " + root + ": nvme directory " + dir + " holds the data file of store " +
              m->root + " (uuid " + uuid + "), of which this store is a copy; the two would " +
              "share one data file. Copy the data file into a directory of the copy and " +
              "reopen it with that directory, or open the original");
        }
      }
      rewrite = true;  // moved (the original is gone) or a self-contained copy
    }
    if (rewrite && !read_only) STRATA_RETURN_IF_ERROR(write_marker(dir, uuid, root));
  }
  return Status::OK();
}

bool chunk_adoptable(const catalog::ChunkRow& c, size_t ndirs, uint64_t chunk_bytes) {
  if (c.dir >= ndirs || c.offset % kAlign != 0 || c.nbytes == 0 || c.nbytes > chunk_bytes) {
    return false;
  }
  uint64_t end;
  return !__builtin_add_overflow(c.offset, align_up(c.nbytes, kAlign), &end) && end <= (1ull << 62);
}

std::string row_damage(const catalog::ObjectRow& r, size_t ndirs, uint64_t chunk_bytes) {
  if (!r.damage.empty()) return r.damage;
  TensorDesc d{r.dtype, r.shape};
  auto want = checked_nbytes(r.dtype, r.shape);
  if (!want) {
    return "object '" + r.key + "' has shape " + to_string(d) + " whose size overflows 64 bits";
  }
  if (*want != r.nbytes) {
    return "object '" + r.key + "' is " + std::to_string(r.nbytes) + " bytes but " + to_string(d) +
           " needs " + std::to_string(*want);
  }
  const uint64_t nchunks = chunk_bytes ? (r.nbytes + chunk_bytes - 1) / chunk_bytes : 0;
  if (r.chunks.size() != nchunks) {
    return "object '" + r.key + "' has " + std::to_string(r.chunks.size()) + " chunks, expected " +
           std::to_string(nchunks);
  }
  for (size_t j = 0; j < r.chunks.size(); ++j) {
    const auto& c = r.chunks[j];
    if (!chunk_adoptable(c, ndirs, chunk_bytes)) {
      return "object '" + r.key + "' has a chunk in directory " + std::to_string(c.dir) +
             " at offset " + std::to_string(c.offset) + " of " + std::to_string(c.nbytes) +
             " bytes outside the store";
    }
    uint64_t expect = std::min<uint64_t>(chunk_bytes, r.nbytes - j * chunk_bytes);
    if (c.nbytes != expect) {
      return "object '" + r.key + "' chunk " + std::to_string(j) + " holds " +
             std::to_string(c.nbytes) + " bytes, expected " + std::to_string(expect);
    }
  }
  return {};
}

std::string ExtentClaims::claim(const catalog::ObjectRow& r, std::vector<bool>* adopt) {
  std::string damage;
  adopt->assign(r.chunks.size(), false);
  for (size_t j = 0; j < r.chunks.size(); ++j) {
    const auto& c = r.chunks[j];
    if (!chunk_adoptable(c, dirs_.size(), chunk_bytes_)) continue;
    const uint64_t end = c.offset + align_up(c.nbytes, kAlign);
    auto& m = dirs_[c.dir];
    const Claim* hit = nullptr;
    auto it = m.upper_bound(c.offset);
    if (it != m.begin() && std::prev(it)->second.end > c.offset) hit = &std::prev(it)->second;
    if (!hit && it != m.end() && it->first < end) hit = &it->second;
    if (hit) {
      if (damage.empty()) {
        damage = "object '" + r.key + "' chunk " + std::to_string(j) + " (directory " +
                 std::to_string(c.dir) + " offset " + std::to_string(c.offset) + ", " +
                 std::to_string(c.nbytes) + " bytes) overlaps " +
                 (hit->key == r.key ? "another chunk of it" : "object '" + hit->key + "'");
      }
      continue;
    }
    m.emplace(c.offset, Claim{end, r.key});
    (*adopt)[j] = true;
  }
  return damage;
}

Status trim_data_file(int fd, const std::string& path, uint64_t keep_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno_status(errno, "fstat " + path);
  if (static_cast<uint64_t>(st.st_size) <= keep_bytes) return Status::OK();
  if (::ftruncate(fd, static_cast<off_t>(keep_bytes)) != 0) {
    return errno_status(errno, "truncate " + path + " to " + std::to_string(keep_bytes) + " bytes");
  }
  return Status::OK();
}

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

bool dir_writable(const std::string& dir) {
  struct statvfs sv;
  if (::statvfs(dir.c_str(), &sv) == 0 && (sv.f_flag & ST_RDONLY)) return false;
  return ::access(dir.c_str(), W_OK) == 0;
}

}  // namespace strata::store_detail
