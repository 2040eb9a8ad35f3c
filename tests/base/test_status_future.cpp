#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include "strata/base/env.hpp"
#include "strata/base/future.hpp"
#include "strata/base/logging.hpp"
#include "strata/base/units.hpp"

using namespace strata;
using namespace std::chrono_literals;

TEST(Status, ErrnoMapping) {
  EXPECT_EQ(errno_status(ENOENT, "open 'x'").code(), StatusCode::kNotFound);
  EXPECT_EQ(errno_status(ENOSPC, "w").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(errno_status(EROFS, "w").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(errno_status(EIO, "w").code(), StatusCode::kIoError);
  Status s = errno_status(ENOENT, "open '/nope'");
  EXPECT_EQ(s.sys_errno(), ENOENT);
  EXPECT_EQ(s.message(), "open '/nope' (errno 2: No such file or directory)");
  EXPECT_EQ(s.to_string(), "NotFound: open '/nope' (errno 2: No such file or directory)");
  EXPECT_EQ(s.with_context("store").message(), "store: open '/nope' (errno 2: No such file or directory)");
}

TEST(Result, ValueAndError) {
  Result<int> a = 7;
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(*a, 7);
  Result<int> b = not_found("key 'k'");
  EXPECT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(b.value_or(3), 3);
  Result<int> c = Status::OK();  // misuse: becomes Internal, never a fake value
  EXPECT_EQ(c.status().code(), StatusCode::kInternal);
}

static Result<int> twice(Result<int> x) {
  STRATA_ASSIGN_OR_RETURN(int v, x);
  return 2 * v;
}

TEST(Result, Macros) {
  EXPECT_EQ(*twice(21), 42);
  EXPECT_EQ(twice(invalid_argument("bad")).status().message(), "bad");
}

TEST(Units, ParseSize) {
  EXPECT_EQ(*parse_size("0"), 0u);
  EXPECT_EQ(*parse_size("4097"), 4097u);
  EXPECT_EQ(*parse_size("4KiB"), 4096u);
  EXPECT_EQ(*parse_size("4K"), 4096u);
  EXPECT_EQ(*parse_size("1 MiB"), 1048576u);
  EXPECT_EQ(*parse_size("4G"), 4294967296u);
  EXPECT_EQ(*parse_size("1.5GiB"), 1610612736u);
  EXPECT_EQ(*parse_size("2t"), 2199023255552u);
  EXPECT_EQ(parse_size("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_size("-1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_size("3 parsecs").status().message(),
            "invalid byte size '3 parsecs': unknown suffix (use B, KiB, MiB, GiB, TiB or K, M, G, T)");
  EXPECT_EQ(parse_size("99999999999999999999").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(align_up(4097, 4096), 8192u);
  EXPECT_EQ(align_down(4097, 4096), 4096u);
}

TEST(Env, MalformedIsAnError) {
  setenv("STRATA_TEST_UINT", "12x", 1);
  EXPECT_EQ(env_uint("STRATA_TEST_UINT", 5).status().code(), StatusCode::kInvalidArgument);
  setenv("STRATA_TEST_UINT", "12", 1);
  EXPECT_EQ(*env_uint("STRATA_TEST_UINT", 5), 12u);
  unsetenv("STRATA_TEST_UINT");
  EXPECT_EQ(*env_uint("STRATA_TEST_UINT", 5), 5u);
  setenv("STRATA_TEST_SIZE", "64MiB", 1);
  EXPECT_EQ(*env_size("STRATA_TEST_SIZE", 0), 64u << 20);
  setenv("STRATA_TEST_BOOL", "maybe", 1);
  EXPECT_FALSE(env_bool("STRATA_TEST_BOOL", true).ok());
}

TEST(Future, CompletesAcrossThreads) {
  Promise<uint64_t> p;
  Future<uint64_t> f = p.future();
  EXPECT_FALSE(f.ready());
  EXPECT_FALSE(f.wait_for(1ms));
  std::atomic<uint64_t> seen{0};
  f.on_ready([&](const Result<uint64_t>& r) { seen = *r; });
  std::thread t([p = std::move(p)]() mutable { p.set_value(4096); });
  EXPECT_EQ(*f.result(), 4096u);
  t.join();
  EXPECT_EQ(seen.load(), 4096u);
  uint64_t late = 0;
  f.on_ready([&](const Result<uint64_t>& r) { late = *r; });  // runs at once
  EXPECT_EQ(late, 4096u);
}

TEST(Future, DroppedPromiseCancels) {
  Future<void> f;
  {
    Promise<void> p;
    f = p.future();
  }
  EXPECT_EQ(f.result().status().code(), StatusCode::kCancelled);
}

TEST(Future, InvalidFutureReturnsAtOnce) {
  Future<int> f;
  f.wait();
  EXPECT_TRUE(f.ready());
  EXPECT_EQ(f.result().status().code(), StatusCode::kFailedPrecondition);
}

TEST(Future, WhenAllFirstErrorInOrder) {
  Promise<int> a, b, c;
  std::vector<Future<int>> fs{a.future(), b.future(), c.future()};
  Future<void> all = when_all(fs);
  c.set_error(data_loss("c"));
  EXPECT_FALSE(all.ready());
  a.set_value(1);
  b.set_error(not_found("b"));
  EXPECT_EQ(all.result().status().message(), "b");
  EXPECT_TRUE(when_all(std::vector<Future<int>>{}).ready());
}

TEST(Future, ResultForTimesOut) {
  Promise<int> p;
  EXPECT_EQ(p.future().result_for(2ms).status().code(), StatusCode::kDeadlineExceeded);
}

TEST(Logging, LogTextEscapesControlCharacters) {
  using namespace std::string_literals;
  EXPECT_EQ(strata::log_text("plain key 'a/b c' \xd0\xba"), "plain key 'a/b c' \xd0\xba");
  EXPECT_EQ(strata::log_text("a\0b\x1b[31mc\nd\te\x7f"s), "a\\x00b\\x1b[31mc\\nd\\te\\x7f");
}
