// `strata store ls|stat|verify|rm DIR ...`: inspect and edit a store on disk.
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "config_option.hpp"
#include "key_text.hpp"
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

int run_stat(const StoreArgs& a) {
  auto o = inspect_options(a.dir, true, a.config);
  if (!o.ok()) return report_error(o.status());
  auto s = Store::open(*o);
  if (!s.ok()) return report_error(s.status());
  int rc = for_each_key(**s, a.keys, [&](const std::string& key) -> Status {
    STRATA_ASSIGN_OR_RETURN(ObjectInfo i, (*s)->stat(key));
    std::printf("key:    %s\ndtype:  %s\nshape:  %s\nbytes:  %llu (%s)\nchunks: %u of at most %s\n",
                escape_key(i.key).c_str(), std::string(dtype_name(i.dtype)).c_str(),
                shape_text(i.shape).c_str(), static_cast<unsigned long long>(i.nbytes),
                format_bytes(i.nbytes).c_str(), i.num_chunks,
                format_bytes((*s)->chunk_bytes()).c_str());
    if (!i.damage.empty()) std::printf("damage: %s\n", escape_key(i.damage).c_str());
    return Status::OK();
  });
  std::printf("nvme directories:");
  for (auto& d : (*s)->options().nvme_dirs) std::printf(" %s", d.c_str());
  std::printf("\n");
  return rc;
}

int run_verify(const StoreArgs& a) {
  auto o = inspect_options(a.dir, true, a.config);
  if (!o.ok()) return report_error(o.status());
  auto s = Store::open(*o);
  if (!s.ok()) return report_error(s.status());
  auto t0 = Clock::now();
  auto r = (*s)->verify();
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
                Sub{"stat", "Show metadata of objects KEY... of the store at DIR", run_stat, true},
                Sub{"verify", "Re-read every chunk of the store at DIR and check its checksum",
                    run_verify, false},
                Sub{"rm", "Remove objects KEY... from the store at DIR (takes the write lock)",
                    run_rm, true}}) {
    auto args = std::make_shared<StoreArgs>();
    auto* sub = add_command(store, s.name, s.help, args, s.fn);
    sub->add_option("DIR", args->dir, "store directory")->required();
    add_config_option(sub, args->config);
    if (s.keys) {
      sub->add_option("KEY", args->keys,
                      "object keys; a key `ls` prints escaped (e.g. a\\x00b for one holding a "
                      "NUL byte) may be given in that form")
          ->required();
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
