// strata::store (private) — a store's NVMe directories: their catalog record, data and
// marker files, orphaned data. See store_dirs.hpp.
#include "store_dirs.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "store_markers.hpp"
#include "store_paths.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::store_detail {

namespace fs = std::filesystem;

namespace {
std::string normalize(const std::string& p) {
  std::error_code ec;
  std::string a = fs::absolute(p, ec).lexically_normal().string();
  if (ec) a = fs::path(p).lexically_normal().string();
  while (a.size() > 1 && a.back() == '/') a.pop_back();
  return a;
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

Status create_nvme_dir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" -> "a/b"
  const fs::path parent = p.parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return not_found("nvme directory " + dir + ": its parent " + parent.string() +
                     " does not exist (an unmounted drive or a typo?); create " +
                     parent.string() + " first");
  }
  if (fs::create_directory(p, ec)) return Status::OK();
  const int err = ec.value();
  if (fs::is_directory(p, ec)) return Status::OK();
  return errno_status(err, "create nvme directory " + dir);
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
      STRATA_RETURN_IF_ERROR(create_nvme_dir(dir));
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
    if (rewrite && !read_only) STRATA_RETURN_IF_ERROR(write_marker(dir, mpath, uuid, root));
  }
  return Status::OK();
}

}  // namespace strata::store_detail
