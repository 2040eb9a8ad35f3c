// `strata config from-deepspeed DS.json [--output FILE] [--dry-run] [--json]`: writes
// strata's configuration file (store/config.hpp, docs/configuration.md) from a DeepSpeed
// configuration's offload and aio keys, and reports every key of the DeepSpeed file: set
// (with strata's key and value), kept (strata already does it, or "auto"), in code (the
// strata.torch argument that plays its role), not honoured (and why), not read (training
// settings). The mapping: cli/deepspeed_config.hpp.
//
// An existing --output file is read first (an error in it fails the command) and only the
// keys the DeepSpeed file sets change, as `strata tune` does. Nothing is written on error
// or with --dry-run.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command.hpp"
#include "deepspeed_config.hpp"
#include "strata/base/file_text.hpp"
#include "strata/store/config.hpp"

namespace strata::cli {
namespace {

struct FromDeepSpeedArgs {
  std::string input;
  std::string output = "strata.json";
  bool dry_run = false;
  bool json = false;
};

bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

int run_from_deepspeed(const FromDeepSpeedArgs& a) {
  auto text = read_text_file(a.input, "deepspeed config '" + a.input + "'", 16u << 20);
  if (!text.ok()) return report_error(text.status());
  nlohmann::ordered_json ds;
  try {
    ds = nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::json::parse_error& e) {
    return report_error(invalid_argument("deepspeed config '" + a.input +
                                         "': not JSON: " + e.what()));
  }
  Config base;
  const bool update = file_exists(a.output);
  if (update) {
    auto existing = Config::load(a.output);
    if (!existing.ok()) return report_error(existing.status());
    base = std::move(*existing);
  }
  auto r = import_deepspeed_config(ds, a.input, std::move(base));
  if (!r.ok()) return report_error(r.status());
  if (!a.dry_run) {
    if (Status st = r->config.save(a.output); !st.ok()) return report_error(st);
  }
  if (a.json) {
    nlohmann::ordered_json j;
    j["input"] = a.input;
    j["output"] = a.dry_run ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.output);
    j["updated_existing"] = update && !a.dry_run;
    j["keys"] = nlohmann::ordered_json::array();
    for (const auto& k : r->keys) {
      nlohmann::ordered_json e = {{"deepspeed", k.key}, {"value", k.value},
                          {"outcome", outcome_name(k.outcome)}, {"why", k.why}};
      if (k.outcome == DeepSpeedKey::Outcome::kSet) {
        e["strata"] = k.strata_key;
        e["strata_value"] = k.strata_value;
      }
      j["keys"].push_back(std::move(e));
    }
    j["config"] = nlohmann::ordered_json::parse(r->config.to_json());
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  int counts[5] = {};
  std::printf("%s -> %s\n", a.input.c_str(),
              a.dry_run ? "(dry run: nothing written)" : a.output.c_str());
  for (const auto& k : r->keys) {
    ++counts[static_cast<int>(k.outcome)];
    std::string v = k.value.dump();
    if (v.size() > 40) v = v.substr(0, 37) + "...";
    if (k.outcome == DeepSpeedKey::Outcome::kSet) {
      std::printf("  %-13s %s = %s -> %s = %s%s%s\n", outcome_name(k.outcome), k.key.c_str(),
                  v.c_str(), k.strata_key.c_str(), k.strata_value.dump().c_str(),
                  k.why.empty() ? "" : ": ", k.why.c_str());
    } else {
      std::printf("  %-13s %s = %s: %s\n", outcome_name(k.outcome), k.key.c_str(), v.c_str(),
                  k.why.c_str());
    }
  }
  std::printf("%d set, %d kept, %d in code, %d not honoured, %d not read%s\n", counts[0],
              counts[1], counts[2], counts[3], counts[4],
              a.dry_run ? "" : (update ? " (existing file updated)" : ""));
  return 0;
}

void register_config(Registry& r) {
  CLI::App& group = r.group("config", "Configuration files (docs/configuration.md)");
  auto args = std::make_shared<FromDeepSpeedArgs>();
  CLI::App* sub = add_command(
      group, "from-deepspeed",
      "Write strata's configuration file from a DeepSpeed config's offload_param, "
      "offload_optimizer, sub_group_size and aio keys, and say for every key of it what "
      "strata does with it (set, kept, in code, not honoured and why, not read)",
      args, run_from_deepspeed);
  sub->add_option("input", args->input, "the DeepSpeed JSON configuration (ds_config.json)")
      ->required();
  add_defaulted(sub, "--output", args->output,
                "configuration file to write (an existing one is updated: only the keys the "
                "DeepSpeed file sets change)");
  sub->add_flag("--dry-run", args->dry_run, "report only; write nothing");
  sub->add_flag("--json", args->json, "print the report as one JSON object");
}

}  // namespace

STRATA_CLI_COMMAND(register_config);

}  // namespace strata::cli
