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

TEST(Future, ThenMapsValueAndError) {
  Promise<int> p;
  Future<std::string> f = p.future().then([](const Result<int>& r) -> Result<std::string> {
    if (!r.ok()) return r.status().with_context("then");
    return std::to_string(*r * 2);
  });
  EXPECT_FALSE(f.ready());
  p.set_value(21);
  ASSERT_TRUE(f.ready());  // ran on the completing thread, inside set_value()
  EXPECT_EQ(*f.result(), "42");

  Future<std::string> g = make_ready_future(Result<int>(not_found("key 'k'")))
                              .then([](const Result<int>& r) -> Result<std::string> {
                                if (!r.ok()) return r.status().with_context("then");
                                return std::string("unreachable");
                              });
  EXPECT_EQ(g.result().status(), not_found("then: key 'k'"));
}

TEST(Future, ThenReturnKinds) {
  Future<int> five = make_ready_future(Result<int>(5));
  // A plain value.
  Future<double> a = five.then([](const Result<int>& r) { return *r * 0.5; });
  EXPECT_EQ(*a.result(), 2.5);
  // A Status: Future<void>.
  Future<void> b = five.then([](const Result<int>& r) { return r.ok() ? data_loss("x") : Status(); });
  EXPECT_EQ(b.result().status(), data_loss("x"));
  // void: an OK Future<void>.
  int seen = 0;
  Future<void> c = five.then([&](const Result<int>& r) { seen = *r; });
  EXPECT_TRUE(c.result().ok());
  EXPECT_EQ(seen, 5);
  // A Future: flattened, completing when the inner future does.
  Promise<int> inner;
  Future<int> inner_f = inner.future();
  Future<int> d = five.then([inner_f](const Result<int>&) { return inner_f; });
  EXPECT_FALSE(d.ready());
  inner.set_value(9);
  EXPECT_EQ(*d.result(), 9);
  // From a Future<void>.
  Future<int> e = make_ready_future().then([](const Result<void>& r) { return r.ok() ? 1 : 0; });
  EXPECT_EQ(*e.result(), 1);
}

TEST(Future, ThenRunsOnTheCompletingThread) {
  Promise<int> p;
  std::thread::id ran_on;
  Future<void> f = p.future().then([&](const Result<int>&) { ran_on = std::this_thread::get_id(); });
  std::thread::id producer;
  std::thread t([&, p = std::move(p)]() mutable {
    producer = std::this_thread::get_id();
    p.set_value(1);
  });
  t.join();
  ASSERT_TRUE(f.ready());
  EXPECT_EQ(ran_on, producer);
  // Already ready: at once, on the caller's thread.
  Future<void> g = make_ready_future(Result<int>(1)).then([&](const Result<int>&) {
    ran_on = std::this_thread::get_id();
  });
  EXPECT_TRUE(g.ready());
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(Future, ThenSeesCancellationAndInvalidFutures) {
  Future<int> f;
  {
    Promise<int> p;
    f = p.future().then([](const Result<int>& r) -> Result<int> {
      if (!r.ok()) return r.status();
      return 1;
    });
  }
  EXPECT_EQ(f.result().status().code(), StatusCode::kCancelled);
  Future<int> invalid;
  Future<void> g = invalid.then([](const Result<int>& r) { return r.status(); });
  EXPECT_EQ(g.result().status().code(), StatusCode::kFailedPrecondition);
}

TEST(Future, MapPassesErrorsThrough) {
  int calls = 0;
  Future<int> ok = make_ready_future(Result<int>(20)).map([&](const int& v) {
    ++calls;
    return v + 1;
  });
  EXPECT_EQ(*ok.result(), 21);
  Future<int> err = make_ready_future(Result<int>(out_of_range("offset 8"))).map([&](const int& v) {
    ++calls;
    return v + 1;
  });
  EXPECT_EQ(err.result().status(), out_of_range("offset 8"));
  EXPECT_EQ(calls, 1);
  // Value-less source, Result and Status returns.
  Future<int> a = make_ready_future().map([]() -> Result<int> { return 3; });
  EXPECT_EQ(*a.result(), 3);
  Future<void> b = make_ready_future(Result<void>(cancelled("c"))).map([&] {
    ++calls;
    return Status();
  });
  EXPECT_EQ(b.result().status(), cancelled("c"));
  EXPECT_EQ(calls, 1);
  // A Future return is flattened; an error of the inner future comes through.
  Future<int> c = make_ready_future(Result<int>(2)).map([](const int&) {
    return make_ready_future(Result<int>(data_loss("inner")));
  });
  EXPECT_EQ(c.result().status(), data_loss("inner"));
}

TEST(Logging, LogTextEscapesControlCharacters) {
  using namespace std::string_literals;
  EXPECT_EQ(strata::log_text("plain key 'a/b c' \xd0\xba"), "plain key 'a/b c' \xd0\xba");
  EXPECT_EQ(strata::log_text("a\0b\x1b[31mc\nd\te\x7f"s), "a\\x00b\\x1b[31mc\\nd\\te\\x7f");
}
