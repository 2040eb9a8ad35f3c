// launch_local: the torchrun variables, "[rank R]" output, stopping everyone on failure.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <mutex>

#include "strata/collectives/launcher.hpp"

using namespace strata;
using namespace std::chrono_literals;

namespace {
struct Captured {
  std::mutex mu;
  std::map<int, std::vector<std::string>> out, err;
  void add(int rank, bool is_err, std::string_view line) {
    std::lock_guard<std::mutex> lk(mu);
    (is_err ? err : out)[rank].emplace_back(line);
  }
};
}  // namespace

TEST(Launcher, SetsContractVariablesAndSplitsLines) {
  Captured cap;
  LaunchOptions o;
  o.nproc = 3;
  o.argv = {"/bin/sh", "-c",
            "echo $MASTER_ADDR:$MASTER_PORT $RANK/$WORLD_SIZE local=$LOCAL_RANK; printf 'a\\nb'; "
            "echo oops >&2"};
  o.on_line = [&](int r, bool e, std::string_view l) { cap.add(r, e, l); };
  auto rep = launch_local(o);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_TRUE(rep->status().ok());
  EXPECT_EQ(rep->exit_code(), 0);
  ASSERT_GT(rep->master_port, 0);
  for (int r = 0; r < 3; ++r) {
    std::string first = "127.0.0.1:" + std::to_string(rep->master_port) + " " + std::to_string(r) +
                        "/3 local=" + std::to_string(r);
    EXPECT_EQ(cap.out[r], (std::vector<std::string>{first, "a", "b"}));
    EXPECT_EQ(cap.err[r], std::vector<std::string>{"oops"});
    EXPECT_EQ(rep->ranks[r].exit_code, 0);
  }
}

TEST(Launcher, FailureStopsTheOthersAndNamesTheRank) {
  Captured cap;
  LaunchOptions o;
  o.nproc = 4;
  o.kill_grace = 500ms;
  // Rank 2 fails; the others would run for a minute; rank 3 ignores SIGTERM.
  o.argv = {"/bin/sh", "-c",
            "if [ $RANK = 2 ]; then sleep 0.2; exit 7; fi; "
            "if [ $RANK = 3 ]; then trap '' TERM; fi; sleep 60"};
  o.on_line = [&](int r, bool e, std::string_view l) { cap.add(r, e, l); };
  auto t0 = std::chrono::steady_clock::now();
  auto rep = launch_local(o);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(rep.ok());
  EXPECT_LT(took, 5s);
  EXPECT_EQ(rep->first_failed_rank, 2);
  EXPECT_EQ(rep->exit_code(), 7);
  Status s = rep->status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("rank 2 exited with status 7"), std::string::npos) << s.message();
  EXPECT_EQ(rep->ranks[0].term_signal, SIGTERM);
  EXPECT_TRUE(rep->ranks[0].stopped_by_launcher);
  EXPECT_EQ(rep->ranks[3].term_signal, SIGKILL);  // ignored SIGTERM: killed after the grace
}

TEST(Launcher, SignalDeathIsReported) {
  LaunchOptions o;
  o.nproc = 2;
  o.argv = {"/bin/sh", "-c", "if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 60"};
  o.on_line = [](int, bool, std::string_view) {};
  auto rep = launch_local(o);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->first_failed_rank, 1);
  EXPECT_EQ(rep->exit_code(), 128 + SIGKILL);
  EXPECT_NE(rep->status().message().find("rank 1 was killed by signal 9"), std::string::npos)
      << rep->status().message();
}

TEST(Launcher, MissingProgramExits127) {
  LaunchOptions o;
  o.nproc = 2;
  o.argv = {"/nonexistent/program"};
  Captured cap;
  o.on_line = [&](int r, bool e, std::string_view l) { cap.add(r, e, l); };
  auto rep = launch_local(o);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->ranks[0].exit_code, 127);
  EXPECT_NE(rep->exit_code(), 0);
  ASSERT_FALSE(cap.err[0].empty());
  EXPECT_NE(cap.err[0][0].find("/nonexistent/program"), std::string::npos);
}

TEST(Launcher, InvalidArguments) {
  LaunchOptions o;
  o.nproc = 0;
  o.argv = {"true"};
  EXPECT_EQ(launch_local(o).status().code(), StatusCode::kInvalidArgument);
  o.nproc = 1;
  o.argv.clear();
  EXPECT_EQ(launch_local(o).status().code(), StatusCode::kInvalidArgument);
}
