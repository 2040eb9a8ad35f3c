#include "launch_ranks.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

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
  run.ranks_status = rep->status();
  return run;
}

}  // namespace strata::cli
