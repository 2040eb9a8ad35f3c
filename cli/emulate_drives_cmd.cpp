// `strata emulate-drives --count N --bw B [--size S] --path DIR -- PROGRAM ARGS...`
//
// Creates N emulated drives of B bytes/s each (cli/emulated_drives.hpp: sparse files under
// DIR on loop devices with direct I/O, ext4, one blkio-throttled cgroup), runs PROGRAM inside
// that cgroup with STRATA_EMULATED_DRIVES=<mnt0>:<mnt1>:... (the mount points, in order) and
// STRATA_EMULATED_DRIVE_BW=<B in bytes/s> in its environment, and removes everything when
// it ends (also on an error, SIGINT, SIGTERM or SIGHUP; SIGTERM and SIGHUP are forwarded to
// PROGRAM). Exit status: PROGRAM's (128 + signal when a signal ended it), or 1 with
// "strata: error: emulated drives refused: <what>" when the machine does not permit them.
// A multi-rank program gives rank r the r-th directory, e.g. bench/optimizer/param_fetch_ranks.py
// or `strata bench partitioned-read` (which also creates its drives itself with
// --emulated-drive-bw).
#include <cstdio>

#include "command.hpp"
#include "emulated_drives.hpp"
#include "strata/base/units.hpp"

namespace strata::cli {
namespace {

struct EmulateArgs {
  int count = 1;
  std::string bw_text;
  std::string size_text = "1GiB";
  std::string path;
  std::vector<std::string> argv;
};

int run_emulate(const EmulateArgs& a) {
  auto bw = parse_bandwidth_arg(a.bw_text, "--bw");
  if (!bw.ok()) return report_error(bw.status());
  auto size = parse_size_arg(a.size_text, "--size");
  if (!size.ok()) return report_error(size.status());
  if (a.path.empty()) return report_error(invalid_argument("--path must name a directory"));
  EmulatedDriveOptions o;
  o.count = a.count;
  o.bytes_per_s = *bw;
  o.size_bytes = *size;
  o.base_dir = a.path;
  return with_emulated_drives(o, [&](const EmulatedDrives& d) {
    std::fprintf(stderr, "strata emulate-drives: %d drive(s) of %s/s (%llu bytes/s): %s\n",
                 a.count, format_bytes(*bw).c_str(), static_cast<unsigned long long>(*bw),
                 d.mount_dirs_joined().c_str());
    auto rc = run_program(a.argv);
    if (!rc.ok()) return report_error(rc.status());
    return *rc;
  });
}

void register_emulate(Registry& r) {
  auto a = std::make_shared<EmulateArgs>();
  auto* cmd = add_command(r.root(), "emulate-drives",
                          "Run a program with N emulated drives of B bytes/s each (loop devices "
                          "over files, ext4, blkio throttle; root only)",
                          a, run_emulate);
  cmd->add_option("--count", a->count, "Number of drives")
      ->required()
      ->check(CLI::Range(1, kMaxEmulatedDrives));
  cmd->add_option("--bw", a->bw_text,
                  "Read and write throttle per drive, bytes/s (e.g. 200MiB or 200MiB/s; "
                  "binary suffixes)")
      ->required();
  cmd->add_option("--size", a->size_text, "Size of each drive (sparse; default 1GiB)");
  cmd->add_option("--path", a->path, "Existing directory on the real disk for the backing files")
      ->required();
  cmd->add_option("program", a->argv, "-- PROGRAM ARGS...")->required();
  cmd->positionals_at_end();
}

STRATA_CLI_COMMAND(register_emulate);

}  // namespace
}  // namespace strata::cli
