// strata::store — the configuration file (config.hpp): parsing, checking, writing, and
// applying it to IoEngineOptions / StoreOptions. One table per section names each key, its
// type and range, and the field it sets; the same tables write the file back.
#include "strata/store/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "strata/base/env.hpp"
#include "strata/base/file_text.hpp"
#include "strata/base/text.hpp"
#include "strata/base/units.hpp"

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

/// One key of a section: reads a JSON value into the section (an error names the key
/// path), and writes the field back (nothing when unset).
template <class Section>
struct Key {
  const char* name;
  std::function<Status(const Json&, const std::string& where, Section&)> read;
  std::function<void(const Section&, Json&)> write;
};

std::string shown(const Json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

Status bad_value(const std::string& where, const std::string& expected, const Json& v) {
  return invalid_argument(where + ": expected " + expected + ", got " + shown(v));
}

/// A JSON integer in [lo, hi].
Result<int64_t> read_int(const Json& v, const std::string& where, int64_t lo, int64_t hi) {
  const std::string range = "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
  if (!v.is_number_integer()) return bad_value(where, range, v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return bad_value(where, range, v);
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return bad_value(where, range, v);
  return x;
}

/// A byte size: a non-negative JSON integer or a string parse_size() accepts, in [lo, hi].
Result<uint64_t> read_size(const Json& v, const std::string& where, uint64_t lo, uint64_t hi) {
  const std::string what = "a byte size (an integer or a string such as \"1MiB\") in " +
                           std::to_string(lo) + ".." + std::to_string(hi);
  uint64_t x = 0;
  if (v.is_number_unsigned()) {
    x = v.get<uint64_t>();
  } else if (v.is_string()) {
    auto r = parse_size(v.get<std::string>());
    if (!r.ok()) return invalid_argument(where + ": " + r.status().message());
    x = *r;
  } else {
    return bad_value(where, what, v);
  }
  if (x < lo || x > hi) return bad_value(where, what, v);
  return x;
}

/// A finite, non-negative JSON number.
Result<double> read_rate(const Json& v, const std::string& where) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
    return bad_value(where, "a finite number >= 0", v);
  }
  return v.get<double>();
}

Result<std::string> read_choice(const Json& v, const std::string& where,
                                const std::vector<std::string>& choices) {
  std::string expected = "one of";
  for (size_t i = 0; i < choices.size(); ++i) expected += (i ? ", \"" : " \"") + choices[i] + "\"";
  if (!v.is_string()) return bad_value(where, expected, v);
  for (const auto& c : choices) {
    if (v.get<std::string>() == c) return c;
  }
  return bad_value(where, expected, v);
}

Result<std::vector<std::string>> read_dirs(const Json& v, const std::string& where) {
  if (!v.is_array()) return bad_value(where, "an array of directory names", v);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    if (!v[i].is_string() || v[i].get<std::string>().empty()) {
      return bad_value(w, "a non-empty string", v[i]);
    }
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

// Key makers: a name, the member it sets, and the reader that checks the value.
template <class S, class T, class Read>
Key<S> typed_key(const char* name, std::optional<T> S::*m, Read read) {
  return {name,
          [=](const Json& v, const std::string& w, S& s) -> Status {
            auto x = read(v, w);
            if (!x.ok()) return x.status();
            s.*m = static_cast<T>(*x);
            return Status::OK();
          },
          [=](const S& s, Json& j) {
            if (s.*m) j[name] = *(s.*m);
          }};
}

Result<bool> read_bool(const Json& v, const std::string& w) {
  if (!v.is_boolean()) return bad_value(w, "true or false", v);
  return v.get<bool>();
}

template <class S, class T>
Key<S> int_key(const char* name, std::optional<T> S::*m, int64_t lo, int64_t hi) {
  return typed_key(name, m, [=](const Json& v, const std::string& w) { return read_int(v, w, lo, hi); });
}

template <class S>
Key<S> size_key(const char* name, std::optional<uint64_t> S::*m, uint64_t lo = 0,
                uint64_t hi = UINT64_MAX) {
  return typed_key(name, m, [=](const Json& v, const std::string& w) { return read_size(v, w, lo, hi); });
}

template <class S>
Key<S> bool_key(const char* name, std::optional<bool> S::*m) {
  return typed_key(name, m, &read_bool);
}

template <class S>
Key<S> choice_key(const char* name, std::optional<std::string> S::*m,
                  std::vector<std::string> choices) {
  return typed_key(name, m,
                   [=](const Json& v, const std::string& w) { return read_choice(v, w, choices); });
}

template <class S>
Key<S> rate_key(const char* name, std::optional<double> S::*m) {
  return typed_key(name, m, &read_rate);
}

const std::vector<Key<IoConfig>>& io_keys() {
  using C = IoConfig;
  static const std::vector<Key<C>> keys = {
      {"engine",
       [](const Json& v, const std::string& w, C& c) -> Status {
         STRATA_ASSIGN_OR_RETURN(auto s, read_choice(v, w, {"uring", "threads"}));
         c.engine = s == "uring" ? EngineKind::kUring : EngineKind::kThreads;
         return Status::OK();
       },
       [](const C& c, Json& j) {
         if (c.engine) j["engine"] = std::string(engine_kind_name(*c.engine));
       }},
      size_key<C>("block_size", &C::block_size, 1, kGiB),
      int_key<C>("queue_depth", &C::queue_depth, 1, 4096),
      int_key<C>("workers", &C::workers, 1, 64),
      bool_key<C>("direct", &C::direct),
      int_key<C>("submit_batch", &C::submit_batch, 0, 4096),
      int_key<C>("numa_node", &C::numa_node, -1, 4095),
      bool_key<C>("allow_buffered_fallback", &C::allow_buffered_fallback),
      bool_key<C>("allow_threads_fallback", &C::allow_threads_fallback),
      bool_key<C>("register_files", &C::register_files),
      bool_key<C>("register_buffers", &C::register_buffers),
      bool_key<C>("sqpoll", &C::sqpoll),
      bool_key<C>("iopoll", &C::iopoll),
  };
  return keys;
}

const std::vector<Key<StoreConfig>>& store_keys() {
  using C = StoreConfig;
  static const std::vector<Key<C>> keys = {
      {"nvme_dirs",
       [](const Json& v, const std::string& w, C& c) -> Status {
         STRATA_ASSIGN_OR_RETURN(c.nvme_dirs, read_dirs(v, w));
         return Status::OK();
       },
       [](const C& c, Json& j) {
         if (c.nvme_dirs) j["nvme_dirs"] = *c.nvme_dirs;
       }},
      {"chunk_bytes",
       [](const Json& v, const std::string& w, C& c) -> Status {
         STRATA_ASSIGN_OR_RETURN(uint64_t x, read_size(v, w, 4096, UINT64_MAX));
         if (x % 4096 != 0) return bad_value(w, "a multiple of 4096 bytes", v);
         c.chunk_bytes = x;
         return Status::OK();
       },
       [](const C& c, Json& j) {
         if (c.chunk_bytes) j["chunk_bytes"] = *c.chunk_bytes;
       }},
      size_key<C>("host_budget_bytes", &C::host_budget_bytes),
      size_key<C>("nvme_budget_bytes", &C::nvme_budget_bytes),
      size_key<C>("device_budget_bytes", &C::device_budget_bytes),
      int_key<C>("device_id", &C::device_id, 0, 4095),
      size_key<C>("staging_bytes", &C::staging_bytes, 1),
      size_key<C>("pinned_initial_bytes", &C::pinned_initial_bytes),
      size_key<C>("pinned_grow_bytes", &C::pinned_grow_bytes, 1),
      bool_key<C>("verify_checksums", &C::verify_checksums),
      {"durability",
       [](const Json& v, const std::string& w, C& c) -> Status {
         STRATA_ASSIGN_OR_RETURN(auto s, read_choice(v, w, {"put", "flush"}));
         c.durability = s == "put" ? Durability::kOnPut : Durability::kOnFlush;
         return Status::OK();
       },
       [](const C& c, Json& j) {
         if (c.durability) j["durability"] = *c.durability == Durability::kOnPut ? "put" : "flush";
       }},
      int_key<C>("worker_threads", &C::worker_threads, 1, StoreOptions::kMaxWorkerThreads),
      int_key<C>("numa_node", &C::numa_node, kNumaNone, 4095),
      rate_key<C>("stats_interval_seconds", &C::stats_interval_seconds),
  };
  return keys;
}

const std::vector<Key<OptimizerConfig>>& optimizer_keys() {
  using C = OptimizerConfig;
  static const std::vector<Key<C>> keys = {
      size_key<C>("sub_group_numel", &C::sub_group_numel),
      int_key<C>("num_buffers", &C::num_buffers, 0, 16),
      size_key<C>("pinned_budget_bytes", &C::pinned_budget_bytes),
      size_key<C>("host_budget_bytes", &C::host_budget_bytes),
      int_key<C>("num_threads", &C::num_threads, 0, 4096),
      int_key<C>("numa_node", &C::numa_node, -1, 4095),
      choice_key<C>("default_placement", &C::default_placement, {"auto", "host", "nvme"}),
      bool_key<C>("verify_on_open", &C::verify_on_open),
      choice_key<C>("arithmetic", &C::arithmetic, {"simd", "torch"}),
      choice_key<C>("state_dtype", &C::state_dtype, {"fp32", "bf16"}),
      bool_key<C>("overlap_backward", &C::overlap_backward),
      size_key<C>("overlap_bucket_numel", &C::overlap_bucket_numel, 1),
  };
  return keys;
}

const std::vector<Key<MeasuredConfig>>& measured_keys() {
  using C = MeasuredConfig;
  static const std::vector<Key<C>> keys = {
      rate_key<C>("nvme_read_bytes_per_s", &C::nvme_read_bytes_per_s),
      rate_key<C>("nvme_write_bytes_per_s", &C::nvme_write_bytes_per_s),
      rate_key<C>("store_read_bytes_per_s", &C::store_read_bytes_per_s),
      rate_key<C>("store_write_bytes_per_s", &C::store_write_bytes_per_s),
      rate_key<C>("memory_copy_bytes_per_s", &C::memory_copy_bytes_per_s),
      rate_key<C>("adam_params_per_s", &C::adam_params_per_s),
      rate_key<C>("allgather_bytes_per_s", &C::allgather_bytes_per_s),
      rate_key<C>("pcie_bytes_per_s", &C::pcie_bytes_per_s),
      {"paths",
       [](const Json& v, const std::string& w, C& c) -> Status {
         STRATA_ASSIGN_OR_RETURN(c.paths, read_dirs(v, w));
         return Status::OK();
       },
       [](const C& c, Json& j) {
         if (!c.paths.empty()) j["paths"] = c.paths;
       }},
  };
  return keys;
}

Status unknown_key(const std::string& path, const std::string& prefix,
                   const std::vector<std::string>& names) {
  std::vector<std::string> full;
  for (const auto& n : names) full.push_back(prefix + n);
  std::string msg = "unknown key '" + path + "'";
  const std::string guess = closest_name(path, full);
  if (!guess.empty()) msg += " (did you mean '" + guess + "'?)";
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  return invalid_argument(msg + "; known keys" + (prefix.empty() ? "" : " of '" +
                          prefix.substr(0, prefix.size() - 1) + "'") + ": " + known);
}

template <class S>
Status read_section(const Json& obj, const std::string& name, const std::vector<Key<S>>& keys,
                    S& out) {
  if (!obj.is_object()) return bad_value(name, "an object", obj);
  std::vector<std::string> names;
  for (const auto& k : keys) names.push_back(k.name);
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const Key<S>* key = nullptr;
    for (const auto& k : keys) {
      if (it.key() == k.name) key = &k;
    }
    if (key == nullptr) return unknown_key(name + "." + it.key(), name + ".", names);
    STRATA_RETURN_IF_ERROR(key->read(it.value(), name + "." + it.key(), out));
  }
  return Status::OK();
}

template <class S>
void write_section(Json& top, const char* name, const std::vector<Key<S>>& keys, const S& s) {
  Json j = Json::object();
  for (const auto& k : keys) k.write(s, j);
  if (!j.empty()) top[name] = std::move(j);
}

Status parse_into(std::string_view text, Config& c) {
  Json top;
  try {
    top = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 3, column 5: ..."; also
    // out_of_range.406 for a number no double holds (1e400)
    std::string what = e.what();
    const size_t p = what.find("] ");
    if (p != std::string::npos) what = what.substr(p + 2);
    return invalid_argument(what);
  }
  if (!top.is_object()) return bad_value("the top level", "an object", top);
  static const std::vector<std::string> sections = {"strata_config", "io", "store", "optimizer",
                                                    "measured"};
  for (auto it = top.begin(); it != top.end(); ++it) {
    const std::string& k = it.key();
    if (k == "strata_config") {
      STRATA_ASSIGN_OR_RETURN(int64_t v, read_int(it.value(), k, Config::kVersion, Config::kVersion));
      (void)v;
    } else if (k == "io") {
      STRATA_RETURN_IF_ERROR(read_section(it.value(), k, io_keys(), c.io));
    } else if (k == "store") {
      STRATA_RETURN_IF_ERROR(read_section(it.value(), k, store_keys(), c.store));
    } else if (k == "optimizer") {
      STRATA_RETURN_IF_ERROR(read_section(it.value(), k, optimizer_keys(), c.optimizer));
    } else if (k == "measured") {
      STRATA_RETURN_IF_ERROR(read_section(it.value(), k, measured_keys(), c.measured));
    } else {
      return unknown_key(k, "", sections);
    }
  }
  return Status::OK();
}

std::string file_label(const std::string& file) {
  return "config file '" + (file.empty() ? std::string("<memory>") : file) + "'";
}

}  // namespace

Result<Config> Config::parse(std::string_view text, const std::string& file) {
  Config c;
  c.file = file;
  if (Status st = parse_into(text, c); !st.ok()) {
    return invalid_argument(file_label(file) + ": " + st.message());
  }
  return c;
}

Result<Config> Config::load(const std::string& file) {
  if (file.empty()) return invalid_argument("config file: empty path");
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(file, file_label(file), 16u << 20));
  return parse(text, file);
}

std::string Config::to_json() const {
  Json top = Json::object();
  top["strata_config"] = kVersion;
  write_section(top, "io", io_keys(), io);
  write_section(top, "store", store_keys(), store);
  write_section(top, "optimizer", optimizer_keys(), optimizer);
  write_section(top, "measured", measured_keys(), measured);
  return top.dump(2) + "\n";
}

Status Config::save(const std::string& path) const {
  if (path.empty()) return invalid_argument("config file: empty output path");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const std::string text = to_json();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "cannot write config file '" + tmp + "'");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return errno_status(e, "cannot write config file '" + tmp + "'");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return errno_status(e, "cannot write config file '" + tmp + "'");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return errno_status(e, "cannot rename '" + tmp + "' to config file '" + path + "'");
  }
  return Status::OK();
}

void Config::apply(IoEngineOptions& o) const {
  if (io.engine) o.kind = *io.engine;
  if (io.queue_depth) o.queue_depth = *io.queue_depth;
  if (io.block_size) o.block_size = *io.block_size;
  if (io.workers) o.workers = *io.workers;
  if (io.direct) o.direct = *io.direct;
  if (io.allow_buffered_fallback) o.allow_buffered_fallback = *io.allow_buffered_fallback;
  if (io.allow_threads_fallback) o.allow_threads_fallback = *io.allow_threads_fallback;
  if (io.register_files) o.register_files = *io.register_files;
  if (io.register_buffers) o.register_buffers = *io.register_buffers;
  if (io.submit_batch) o.submit_batch = *io.submit_batch;
  if (io.numa_node) o.numa_node = *io.numa_node;
  if (io.sqpoll) o.sqpoll = *io.sqpoll;
  if (io.iopoll) o.iopoll = *io.iopoll;
}

void Config::apply(StoreOptions& o) const {
  if (store.nvme_dirs) o.nvme_dirs = *store.nvme_dirs;
  if (store.host_budget_bytes) o.host_budget_bytes = *store.host_budget_bytes;
  if (store.nvme_budget_bytes) o.nvme_budget_bytes = *store.nvme_budget_bytes;
  if (store.device_budget_bytes) o.device_budget_bytes = *store.device_budget_bytes;
  if (store.device_id) o.device_id = *store.device_id;
  if (store.chunk_bytes) o.chunk_bytes = *store.chunk_bytes;
  if (store.staging_bytes) o.staging_bytes = *store.staging_bytes;
  if (store.pinned_initial_bytes) o.pinned_initial_bytes = *store.pinned_initial_bytes;
  if (store.pinned_grow_bytes) o.pinned_grow_bytes = *store.pinned_grow_bytes;
  if (store.verify_checksums) o.verify_checksums = *store.verify_checksums;
  if (store.durability) o.durability = *store.durability;
  if (store.worker_threads) o.worker_threads = *store.worker_threads;
  if (store.numa_node) o.numa_node = *store.numa_node;
  if (store.stats_interval_seconds) {
    o.stats_interval = std::chrono::milliseconds(std::llround(*store.stats_interval_seconds * 1000));
  }
  apply(o.engine_options);
  o.config_file = file;
}

std::string config_file_to_use(const std::string& explicit_file) {
  if (!explicit_file.empty()) return explicit_file;
  auto env = env_string("STRATA_CONFIG");
  return env ? *env : std::string();
}

Result<std::optional<Config>> load_config_to_use(const std::string& explicit_file) {
  const std::string file = config_file_to_use(explicit_file);
  if (file.empty()) return std::optional<Config>();
  STRATA_ASSIGN_OR_RETURN(Config c, Config::load(file));
  return std::optional<Config>(std::move(c));
}

}  // namespace strata
