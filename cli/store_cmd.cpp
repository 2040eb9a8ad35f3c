// `strata store ls|stat|verify|rm DIR ...`: inspect and edit a store on disk.
//
// `stat DIR [KEY...]` prints the metadata of each KEY, then the store: what its catalog
// holds and each NVMe directory's space. The store's counters (Store::stats()) are per
// process, so a stat in a process of its own has none to show of the processes that use
// the store; `--verify` re-reads every chunk and shows the counters of that read (bytes,
// chunks, waits, checksum failures): a read-back benchmark and a check at once.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "command.hpp"
#include "config_option.hpp"
#include "key_text.hpp"
#include "progress.hpp"
#include "strata/base/units.hpp"
#include "strata/store/config.hpp"
#include "strata/store/store.hpp"

namespace strata::cli {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

/// The key a KEY argument names: the argument read as escape_key()'s output (what `ls`
/// prints, e.g. "a\x00b" for a key with a NUL, which no command line can carry) when the
/// store has that key, otherwise the argument itself. The printed form wins, so what `ls`
/// shows always names the key it shows: `ls` prints the literal key `a\x00b` as
/// "a\\x00b", which reads back as that literal key.
std::string resolve_key(Store& s, const std::string& arg) {
  if (arg.find('\\') == std::string::npos) return arg;
  auto k = unescape_key(arg);
  return k && s.contains(*k) ? *k : arg;
}

/// The options of an inspecting open: the configuration's (--config, $STRATA_CONFIG) and
/// STRATA_* variables' engine and store settings, with small memory budgets.
Result<StoreOptions> inspect_options(const std::string& dir, bool read_only,
                                     const std::string& config) {
  STRATA_ASSIGN_OR_RETURN(StoreOptions o, StoreOptions::from_config(config));
  o.path = dir;
  o.read_only = read_only;
  o.create = false;
  o.host_budget_bytes = 0;
  o.staging_bytes = 16ull << 20;
  o.worker_threads = 1;
  return o;
}

// ---------------------------------------------------------------- strata store ...

struct StoreArgs {
  std::string dir;
  std::vector<std::string> keys;
  std::string prefix;
  bool json = false;
  std::string config;  // --config FILE
  bool verify = false;  // stat: re-read every chunk, show the counters of that read
};

int run_ls(const StoreArgs& a) {
  if (auto c = load_config_to_use(a.config); !c.ok()) return report_error(c.status());
  auto l = list_store(a.dir, a.prefix);
  if (!l.ok()) return report_error(l.status());
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (auto& i : *l) {
      // "key" is the key as a JSON string (NUL and other controls as \u00NN escapes); a key
      // that is not valid UTF-8 has U+FFFD in place of each bad byte there, and its exact
      // bytes in "key_escaped" (the text `ls` prints: escape_key()).
      j.push_back({{"key", i.key}, {"key_escaped", escape_key(i.key)},
                   {"dtype", dtype_name(i.dtype)}, {"shape", i.shape}, {"nbytes", i.nbytes},
                   {"chunks", i.num_chunks}, {"damage", i.damage}});
    }
    const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
    return 0;
  }
  // A damaged catalog row (ObjectInfo::damage) is listed with "DAMAGED: <reason>" after its
  // key; its nbytes is what the row claims, so it does not count in the total.
  uint64_t total = 0;
  size_t damaged = 0;
  for (auto& i : *l) {
    std::printf("%-12s %-10s %-20s %s", format_bytes(i.nbytes).c_str(),
                std::string(dtype_name(i.dtype)).c_str(), shape_text(i.shape).c_str(),
                escape_key(i.key).c_str());
    if (i.damage.empty()) {
      std::printf("\n");
      total += i.nbytes;
    } else {
      std::printf("  DAMAGED: %s\n", escape_key(i.damage).c_str());
      ++damaged;
    }
  }
  std::printf("%zu objects, %s", l->size(), format_bytes(total).c_str());
  if (damaged > 0) std::printf(", %zu damaged", damaged);
  std::printf("\n");
  return 0;
}

/// Calls `fn(key)` for the key each KEY argument names (resolve_key()), reporting each error
/// it returns. \returns 0, or 1 when any call failed.
int for_each_key(Store& s, const std::vector<std::string>& args,
                 const std::function<Status(const std::string&)>& fn) {
  int rc = 0;
  for (const auto& arg : args) {
    if (Status st = fn(resolve_key(s, arg)); !st.ok()) rc = report_error(st);
  }
  return rc;
}

nlohmann::json info_json(const ObjectInfo& i) {
  return {{"key", i.key},       {"key_escaped", escape_key(i.key)}, {"dtype", dtype_name(i.dtype)},
          {"shape", i.shape},   {"nbytes", i.nbytes},               {"chunks", i.num_chunks},
          {"damage", i.damage}};
}

nlohmann::json stats_json(const StoreStats& st) {
  nlohmann::json j = nlohmann::json::object();
  for (const StatField& f : stat_fields(st)) {
    if (f.is_seconds) {
      j[f.name] = f.seconds;
    } else {
      j[f.name] = f.value;
    }
  }
  return j;
}

/// Store::verify() with a progress line (progress.hpp) on a terminal: verify() takes no
/// callback, so a thread of its own polls the store's counters (nvme_read_bytes) every
/// 100 ms against the bytes the disk will move: each chunk rounded up to 4 KiB (chunk sizes
/// are multiples of 4096, so an object's chunks cover roundup(nbytes, 4096)).
Result<VerifyReport> verify_with_progress(Store& store) {
  if (!progress_wanted()) return store.verify();
  uint64_t total = 0;
  for (const ObjectInfo& i : store.list()) {
    total += i.damage.empty() ? align_up(i.nbytes, 4096) : 0;
  }
  Progress line("verify", total, Progress::Unit::kBytes);
  const uint64_t base = store.stats().nvme.read_bytes;
  std::atomic<bool> done{false};
  std::thread poll([&] {
    // The first update draws at once, however quickly verify() returns.
    for (;;) {
      line.update(std::min(total, store.stats().nvme.read_bytes - base));
      if (done.load()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto r = store.verify();
  done = true;
  poll.join();
  line.finish();
  return r;
}

int run_stat(const StoreArgs& a) {
  auto o = inspect_options(a.dir, true, a.config);
  if (!o.ok()) return report_error(o.status());
  auto s = Store::open(*o);
  if (!s.ok()) return report_error(s.status());
  Store& store = **s;
  nlohmann::json j = nlohmann::json::object();
  j["objects_info"] = nlohmann::json::array();
  int rc = for_each_key(store, a.keys, [&](const std::string& key) -> Status {
    STRATA_ASSIGN_OR_RETURN(ObjectInfo i, store.stat(key));
    if (a.json) {
      j["objects_info"].push_back(info_json(i));
      return Status::OK();
    }
    std::printf("key:    %s\ndtype:  %s\nshape:  %s\nbytes:  %llu (%s)\nchunks: %u of at most %s\n",
                escape_key(i.key).c_str(), std::string(dtype_name(i.dtype)).c_str(),
                shape_text(i.shape).c_str(), static_cast<unsigned long long>(i.nbytes),
                format_bytes(i.nbytes).c_str(), i.num_chunks,
                format_bytes(store.chunk_bytes()).c_str());
    if (!i.damage.empty()) std::printf("damage: %s\n", escape_key(i.damage).c_str());
    return Status::OK();
  });
  // The store: the catalog's objects and bytes, the directories' space.
  uint64_t objects = 0, bytes = 0, damaged = 0;
  for (const ObjectInfo& i : store.list()) {
    ++objects;
    if (i.damage.empty()) {
      bytes += i.nbytes;
    } else {
      ++damaged;
    }
  }
  const StoreUsage u = store.usage();
  auto space = store.nvme_space();
  if (!space.ok()) return report_error(space.status());
  std::optional<VerifyReport> report;
  double verify_s = 0.0;
  if (a.verify) {
    store.reset_stats();  // the counters of the read below only
    const auto t0 = Clock::now();
    auto r = verify_with_progress(store);
    if (!r.ok()) return report_error(r.status());
    verify_s = seconds_since(t0);
    report = std::move(*r);
    for (auto& e : report->errors) {
      std::fprintf(stderr, "strata: %s\n", escape_key(e.to_string()).c_str());
    }
    if (!report->errors.empty()) rc = 1;
  }
  const StoreStats st = store.stats();
  if (a.json) {
    j["path"] = a.dir;
    j["objects"] = objects;
    j["object_bytes"] = bytes;
    j["damaged"] = damaged;
    j["nvme_bytes"] = u.nvme_bytes;
    j["nvme_budget_bytes"] = u.nvme_budget_bytes;
    j["chunk_bytes"] = store.chunk_bytes();
    {
      const StoreStats pools = store.stats();
      j["pinned"] = {{"host_committed_bytes", pools.host_pool.committed_bytes},
                     {"host_budget_bytes", pools.host_pool.capacity_bytes},
                     {"staging_committed_bytes", pools.staging_pool.committed_bytes},
                     {"staging_budget_bytes", pools.staging_pool.capacity_bytes}};
    }
    j["nvme_dirs"] = nlohmann::json::array();
    for (const NvmeDirSpace& d : *space) {
      j["nvme_dirs"].push_back(
          {{"path", d.path}, {"used_bytes", d.used_bytes}, {"free_bytes", d.free_bytes}});
    }
    if (report) {
      j["verify"] = {{"objects", report->objects}, {"chunks", report->chunks},
                     {"bytes", report->bytes}, {"errors", report->errors.size()},
                     {"seconds", verify_s}};
      j["stats"] = stats_json(st);
    }
    const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
    return rc;
  }
  std::printf("store:  %s\nobjects: %llu, %s (%llu damaged)\nnvme:   %s in extents", a.dir.c_str(),
              static_cast<unsigned long long>(objects), format_bytes(bytes).c_str(),
              static_cast<unsigned long long>(damaged), format_bytes(u.nvme_bytes).c_str());
  if (u.nvme_budget_bytes > 0) std::printf(" of a %s budget", format_bytes(u.nvme_budget_bytes).c_str());
  std::printf(", chunks of %s\n", format_bytes(store.chunk_bytes()).c_str());
  {
    const StoreStats pools = store.stats();
    std::printf("pinned: %s committed of a %s budget (host tier %s of %s, staging %s of %s)\n",
                format_bytes(pools.host_pool.committed_bytes + pools.staging_pool.committed_bytes).c_str(),
                format_bytes(pools.host_pool.capacity_bytes + pools.staging_pool.capacity_bytes).c_str(),
                format_bytes(pools.host_pool.committed_bytes).c_str(),
                format_bytes(pools.host_pool.capacity_bytes).c_str(),
                format_bytes(pools.staging_pool.committed_bytes).c_str(),
                format_bytes(pools.staging_pool.capacity_bytes).c_str());
  }
  std::printf("nvme directories:");
  for (auto& d : store.options().nvme_dirs) std::printf(" %s", d.c_str());
  std::printf("\n");
  for (const NvmeDirSpace& d : *space) {
    std::printf("  %s: %s used, %s free\n", d.path.c_str(), format_bytes(d.used_bytes).c_str(),
                format_bytes(d.free_bytes).c_str());
  }
  if (report) {
    std::printf("verify: %llu chunks, %s in %.2f s (%.2f GB/s), %zu errors\n",
                static_cast<unsigned long long>(report->chunks), format_bytes(report->bytes).c_str(),
                verify_s, gbps(report->bytes, verify_s), report->errors.size());
    std::printf("counters of the verify read:\n");
    for (const StatField& f : stat_fields(st)) {
      if (f.is_seconds) {
        std::printf("  %-28s %.3f\n", f.name, f.seconds);
      } else {
        std::printf("  %-28s %llu\n", f.name, static_cast<unsigned long long>(f.value));
      }
    }
  }
  return rc;
}

int run_verify(const StoreArgs& a) {
  auto o = inspect_options(a.dir, true, a.config);
  if (!o.ok()) return report_error(o.status());
  auto s = Store::open(*o);
  if (!s.ok()) return report_error(s.status());
  auto t0 = Clock::now();
  auto r = verify_with_progress(**s);
  if (!r.ok()) return report_error(r.status());
  double sec = seconds_since(t0);
  for (auto& e : r->errors) std::fprintf(stderr, "strata: %s\n", escape_key(e.to_string()).c_str());
  std::printf("%llu objects, %llu chunks, %s verified in %.2f s (%.2f GB/s): %zu errors\n",
              static_cast<unsigned long long>(r->objects), static_cast<unsigned long long>(r->chunks),
              format_bytes(r->bytes).c_str(), sec, gbps(r->bytes, sec), r->errors.size());
  return r->errors.empty() ? 0 : 1;
}

int run_rm(const StoreArgs& a) {
  auto o = inspect_options(a.dir, false, a.config);
  if (!o.ok()) return report_error(o.status());
  auto s = Store::open(*o);
  if (!s.ok()) return report_error(s.status());
  int rc = for_each_key(**s, a.keys,
                        [&](const std::string& key) { return (*s)->remove(key); });
  Status st = (*s)->close();
  if (!st.ok()) rc = report_error(st);
  return rc;
}

void register_store_commands(Registry& r) {
  auto& store = r.group("store", "Inspect a store directory");
  struct Sub {
    const char* name;
    const char* help;
    int (*fn)(const StoreArgs&);
    bool keys;
  };
  for (Sub s : {Sub{"ls", "List the committed objects of the store at DIR", run_ls, false},
                Sub{"stat",
                    "Show the store at DIR (objects, space) and metadata of objects KEY...; "
                    "--verify re-reads every chunk and shows the counters of that read",
                    run_stat, true},
                Sub{"verify", "Re-read every chunk of the store at DIR and check its checksum",
                    run_verify, false},
                Sub{"rm", "Remove objects KEY... from the store at DIR (takes the write lock)",
                    run_rm, true}}) {
    auto args = std::make_shared<StoreArgs>();
    auto* sub = add_command(store, s.name, s.help, args, s.fn);
    sub->add_option("DIR", args->dir, "store directory")->required();
    add_config_option(sub, args->config);
    if (s.keys) {
      auto* k = sub->add_option("KEY", args->keys,
                                "object keys; a key `ls` prints escaped (e.g. a\\x00b for one "
                                "holding a NUL byte) may be given in that form");
      if (std::string(s.name) != "stat") k->required();
    }
    if (std::string(s.name) == "stat") {
      sub->add_flag("--json", args->json, "print a JSON object");
      sub->add_flag("--verify", args->verify,
                    "re-read every chunk (as `store verify`) and show the store counters of "
                    "that read; exit 1 on a checksum error");
    }
    if (std::string(s.name) == "ls") {
      sub->add_option("--prefix", args->prefix, "only keys starting with this");
      sub->add_flag("--json", args->json, "print a JSON array");
    }
  }
}

}  // namespace

STRATA_CLI_COMMAND(register_store_commands);

}  // namespace strata::cli
