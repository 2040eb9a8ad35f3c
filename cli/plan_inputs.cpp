// `strata plan`'s inputs (plan_inputs.hpp): the configuration file's "measured" section and
// bench JSON results.
#include "plan_inputs.hpp"

#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>

#include "strata/store/config.hpp"

namespace strata::cli::planner {
namespace {

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_status(errno, "reading " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return errno_status(errno, "reading " + path);
  return ss.str();
}

Result<nlohmann::json> parse(const std::string& path, const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error; out_of_range for 1e400
    return invalid_argument(path + ": not valid JSON (" + e.what() + ")");
  }
}

// j[key] as a positive finite number.
Result<double> positive(const nlohmann::json& j, const std::string& key, const std::string& path,
                        const std::string& prefix = "") {
  auto it = j.find(key);
  if (it == j.end()) return invalid_argument(path + ": field '" + prefix + key + "' is missing");
  if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
    return invalid_argument(path + ": field '" + prefix + key + "' must be a positive number, got " +
                            it->dump());
  }
  return it->get<double>();
}

void put(Measurements& m, const char* key, double v, const std::string& source) {
  m[key] = Measurement{v, source};
}

}  // namespace

Status read_config_measured(const std::string& path, Measurements& m) {
  // The shared parser checks the whole file (unknown keys, types, ranges) as every other
  // command that takes --config does.
  STRATA_ASSIGN_OR_RETURN(Config c, Config::load(path));
  const MeasuredConfig& mc = c.measured;
  // The NVMe rates through the store's data path (checksums, copy-on-write extents: what
  // the offloaded step and the partitioned fetch go through) when tune measured them, else
  // the raw engine's.
  const auto& nvme_read = mc.store_read_bytes_per_s ? mc.store_read_bytes_per_s
                                                    : mc.nvme_read_bytes_per_s;
  const auto& nvme_write = mc.store_write_bytes_per_s ? mc.store_write_bytes_per_s
                                                      : mc.nvme_write_bytes_per_s;
  const char* read_name =
      mc.store_read_bytes_per_s ? "store_read_bytes_per_s" : "nvme_read_bytes_per_s";
  const char* write_name =
      mc.store_write_bytes_per_s ? "store_write_bytes_per_s" : "nvme_write_bytes_per_s";
  const std::tuple<const char*, const char*, const std::optional<double>*> fields[] = {
      {kNvmeRead, read_name, &nvme_read},
      {kNvmeWrite, write_name, &nvme_write},
      {kMemoryCopy, kMemoryCopy, &mc.memory_copy_bytes_per_s},
      {kAdam, kAdam, &mc.adam_params_per_s},
      {kAllgather, kAllgather, &mc.allgather_bytes_per_s},
      {kPcie, kPcie, &mc.pcie_bytes_per_s}};
  const std::string source = "config " + path;
  for (const auto& [key, name, value] : fields) {
    if (!value->has_value()) continue;
    if (!(**value > 0)) {
      return invalid_argument(path + ": 'measured." + name + "' must be a positive number, got " +
                              nlohmann::json(**value).dump());
    }
    m[key] = Measurement{**value, source};
  }
  return Status::OK();
}

Status read_bench_json(const std::string& path, Measurements& m) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text(path));
  // The whole file, or else its last non-empty line (progress lines may come first).
  std::string last = text;
  if (!nlohmann::json::accept(text)) {
    last.clear();
    std::istringstream ss(text);
    for (std::string line; std::getline(ss, line);) {
      if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
    }
  }
  STRATA_ASSIGN_OR_RETURN(nlohmann::json j, parse(path, last));
  if (!j.is_object()) return invalid_argument(path + ": a bench result is a JSON object");
  const std::string source = "bench " + path;
  auto str = [&](const char* k) {
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string op = str("op"), benchmark = str("benchmark"), bench = str("bench"),
                    collective = str("collective");
  if (op == "read" || op == "write") {
    STRATA_ASSIGN_OR_RETURN(double g, positive(j, "gbps", path));
    put(m, op == "read" ? kNvmeRead : kNvmeWrite, g * 1e9, source);
  } else if (j.contains("put_gbps") && j.contains("get_gbps")) {  // bench store
    STRATA_ASSIGN_OR_RETURN(double pw, positive(j, "put_gbps", path));
    STRATA_ASSIGN_OR_RETURN(double gr, positive(j, "get_gbps", path));
    put(m, kNvmeWrite, pw * 1e9, source);
    put(m, kNvmeRead, gr * 1e9, source);
  } else if (benchmark == "adam") {
    STRATA_ASSIGN_OR_RETURN(double n, positive(j, "numel", path));
    STRATA_ASSIGN_OR_RETURN(double s, positive(j, "seconds_per_step", path));
    put(m, kAdam, n / s, source);
  } else if (benchmark == "step") {
    STRATA_ASSIGN_OR_RETURN(double n, positive(j, "params", path));
    STRATA_ASSIGN_OR_RETURN(double io, positive(j, "io_seconds", path));
    STRATA_ASSIGN_OR_RETURN(double c, positive(j, "compute_seconds", path));
    put(m, kAdam, n / c, source);
    put(m, kNvmeMixed, 24 * n / io, source);
  } else if (collective == "allgather" || bench == "partitioned-read") {
    STRATA_ASSIGN_OR_RETURN(double n, positive(j, "nproc", path));
    if (collective == "allgather") {
      if (n > 1) {
        STRATA_ASSIGN_OR_RETURN(double b, positive(j, "busbw_gbps", path));
        put(m, kAllgather, b * 1e9, source);
      }
    } else {
      if (n > 1) {
        STRATA_ASSIGN_OR_RETURN(double a, positive(j, "allgather_algbw_gbps", path));
        put(m, kAllgather, a * 1e9 * (n - 1) / n, source);
      }
      // Each rank on its own (emulated) drive: what one drive delivered while all read.
      if (j.value("emulated", false)) {
        STRATA_ASSIGN_OR_RETURN(double d, positive(j, "per_drive_gbps", path));
        put(m, kDriveRead, d * 1e9, source);
      }
    }
  } else {
    return invalid_argument(path + ": not the --json result of a strata bench command the "
                            "planner reads (bench io, store, adam, step, allgather, partitioned-read)");
  }
  return Status::OK();
}

}  // namespace strata::cli::planner
