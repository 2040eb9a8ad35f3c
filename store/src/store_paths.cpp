// strata::store (private) — checks of the paths a store is given. See store_paths.hpp.
#include "store_paths.hpp"

#include "strata/store/io_engine.hpp"

namespace strata::store_detail {

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

}  // namespace strata::store_detail
