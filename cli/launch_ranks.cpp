#include "launch_ranks.hpp"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "command.hpp"
#include "strata/collectives/launcher.hpp"

namespace strata::cli {

Result<RanksRun> run_self_as_ranks(int nproc, uint32_t master_port, std::vector<std::string> args) {
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return errno_status(errno, "readlink /proc/self/exe");
  self[len] = 0;
  char tmpl[] = "/tmp/strata-bench-result-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return errno_status(errno, "mkstemp /tmp/strata-bench-result-XXXXXX");
  close(fd);
  LaunchOptions lo;
  lo.nproc = nproc;
  lo.master_port = master_port;
  lo.forward_signals = true;
  lo.argv.reserve(args.size() + 3);
  lo.argv.push_back(self);
  for (auto& a : args) lo.argv.push_back(std::move(a));
  lo.argv.push_back("--result-file");
  lo.argv.push_back(tmpl);
  auto rep = launch_local(lo);
  RanksRun run;
  {
    std::ifstream in(tmpl);
    std::getline(in, run.result);
  }
  unlink(tmpl);
  if (!rep.ok()) return rep.status();
  if (const int sig = rep->forwarded_signal; sig != 0) {
    // Ctrl-C / SIGTERM stopped the ranks: deliver it here too, now that they are gone. Under
    // the default disposition that ends this process by the signal; under the emulated
    // drives' handler (with_emulated_drives) it is re-raised after their teardown.
    ::raise(sig);
    return cancelled("interrupted by signal " + std::to_string(sig) + " (" + strsignal(sig) +
                     ")");
  }
  run.ranks_status = rep->status();
  return run;
}

void add_rank_options(CLI::App* cmd, RankOptions& o) {
  non_negative(cmd->add_option("--master-port", o.master_port,
                               "MASTER_PORT for the launched ranks (default: free)"));
  cmd->add_flag("--json", o.json, "Print one JSON object");
  cmd->add_flag("--from-env", o.from_env,
                "Be one rank of a job started by torchrun / strata launch (reads RANK etc.)");
  cmd->add_option("--result-file", o.result_file, "(internal) where rank 0 writes its JSON");
}

void emit_rank_result(const RankOptions& o, int rank, const nlohmann::json& j,
                      const std::function<void(const nlohmann::json&)>& print_human) {
  if (rank != 0) return;
  if (!o.result_file.empty()) {
    std::ofstream(o.result_file) << j.dump() << "\n";
  } else if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    print_human(j);
  }
}

Result<nlohmann::json> print_ranks_result(
    const RankOptions& o, const RanksRun& run,
    const std::function<void(const nlohmann::json&)>& print_human) {
  nlohmann::json j = nlohmann::json::parse(run.result, nullptr, false);
  if (j.is_discarded()) return internal_error("rank 0 wrote no result");
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    print_human(j);
  }
  return j;
}

}  // namespace strata::cli
