// `strata launch --nproc N [--master-port P] [--master-addr A] -- PROGRAM ARGS...`
// (-n N and --nproc-per-node N, torchrun's name, are aliases of --nproc N)
// Starts N local ranks with torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK,
// WORLD_SIZE, LOCAL_RANK), prefixes their output lines with "[rank R] ", and when one rank
// fails stops the others (SIGTERM, then SIGKILL) and exits non-zero naming it.
#include <cstdio>

#include "command.hpp"
#include "strata/collectives/launcher.hpp"

namespace strata::cli {
namespace {

void register_launch(Registry& r) {
  auto* cmd = r.root().add_subcommand(
      "launch", "Start N local processes with MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK");
  auto opt = std::make_shared<LaunchOptions>();
  auto grace_ms = std::make_shared<int>(3000);
  auto timeout_s = std::make_shared<double>(0);
  cmd->add_option("-n,--nproc,--nproc-per-node", opt->nproc, "Number of processes (-n as mpirun)")
      ->required()
      ->check(CLI::Range(1, 4096));
  non_negative(cmd->add_option("--master-port", opt->master_port, "MASTER_PORT (default: a free port)"));
  cmd->add_option("--master-addr", opt->master_addr, "MASTER_ADDR (default 127.0.0.1)");
  cmd->add_option("--kill-grace-ms", *grace_ms, "Milliseconds between SIGTERM and SIGKILL")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--timeout", *timeout_s, "Stop every rank after this many seconds (0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("program", opt->argv, "-- PROGRAM ARGS...")->required();
  cmd->positionals_at_end();
  cmd->callback([opt, grace_ms, timeout_s] {
    opt->kill_grace = std::chrono::milliseconds(*grace_ms);
    opt->timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1000));
    opt->forward_signals = true;
    auto report = launch_local(*opt);
    if (!report.ok()) {
      Registry::set_exit_code(report_error(report.status()));
      return;
    }
    Status s = report->status();
    if (!s.ok()) {
      std::fprintf(stderr, "strata launch: %s\n", s.message().c_str());
    }
    Registry::set_exit_code(report->exit_code());
  });
}

STRATA_CLI_COMMAND(register_launch);

}  // namespace
}  // namespace strata::cli
