// Store savepoints: savepoint() of NVMe-only objects, write_range() after it, rollback()
// restores the saved bytes (before and after a flush), frees the rewritten chunks, and
// refuses what it cannot restore.
#include <chrono>
#include <thread>
#include <gtest/gtest.h>

#include <filesystem>

#include "test_store_util.hpp"

namespace strata {
namespace {

using namespace store_test;

TEST(StoreSavepoint, RollbackRestoresBytesAndFreesRewrittenChunks) {
  TempDir d;
  auto s = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(s);
  const uint64_t n = (3u << 20) + 100;  // 4 chunks of 1 MiB, the last one partial
  auto a = pattern(n, 1), b = pattern(n, 2);
  ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(n)));
  ASSERT_OK(s->put("b", b.data(), TensorDesc::bytes(n)));
  const uint64_t used = s->usage().nvme_bytes;
  auto sp = s->savepoint({"a", "b"});
  ASSERT_OK(sp.status());
  EXPECT_EQ(sp->keys(), (std::vector<std::string>{"a", "b"}));
  // Rewrite chunk 1 of a (whole) and bytes across chunks 2-3 of b.
  auto x = pattern(1u << 20, 3), y = pattern(5000, 4);
  ASSERT_OK(s->write_range("a", 1u << 20, x.size(), x.data()));
  ASSERT_OK(s->write_range("b", (2u << 20) - 2000, y.size(), y.data()));
  auto a2 = a, b2 = b;
  std::copy(x.begin(), x.end(), a2.begin() + (1u << 20));
  std::copy(y.begin(), y.end(), b2.begin() + (2u << 20) - 2000);
  expect_reads_back(*s, "a", a2);
  expect_reads_back(*s, "b", b2);
  // The saved chunks stay allocated beside the rewritten ones: 1 MiB of a, 2 MiB of b.
  EXPECT_EQ(s->usage().nvme_bytes, used + (3u << 20));
  ASSERT_OK(s->rollback(*sp));
  // The rewritten chunks are freed when the last version naming them goes: a read that
  // just finished may drop its reference on a worker thread a moment after its future is
  // ready (seen under ASan), so wait for that (at most 5 s), then the count is exact.
  for (int i = 0; i < 500 && s->usage().nvme_bytes != used; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s->usage().nvme_bytes, used);
  expect_reads_back(*s, "a", a);
  expect_reads_back(*s, "b", b);
  // A second rollback to the same savepoint is a no-op; later writes still work.
  ASSERT_OK(s->rollback(*sp));
  expect_reads_back(*s, "a", a);
  ASSERT_OK(s->write_range("a", 0, y.size(), y.data()));
  auto a3 = a;
  std::copy(y.begin(), y.end(), a3.begin());
  expect_reads_back(*s, "a", a3);
  // The rewritten chunks are freed by each rollback: rewriting and rolling back all of b
  // 20 times does not grow the data file past one extra copy of b.
  ASSERT_OK(s->flush());
  auto data_file_bytes = [&] {
    uint64_t total = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.sub("s"))) {
      if (e.path().extension() == ".data") total += std::filesystem::file_size(e.path());
    }
    return total;
  };
  const uint64_t before = data_file_bytes();
  // sp still holds a's chunk 0 as of the savepoint (1 MiB beside a's current chunk 0)
  EXPECT_EQ(s->usage().nvme_bytes, used + (1u << 20));
  const uint64_t base = s->usage().nvme_bytes;
  auto z = pattern(n, 9);
  for (int i = 0; i < 20; ++i) {
    auto spb = s->savepoint({"b"});
    ASSERT_OK(spb.status());
    ASSERT_OK(s->write_range("b", 0, n, z.data()));
    ASSERT_OK(s->rollback(*spb));
    EXPECT_EQ(s->usage().nvme_bytes, base);
  }
  expect_reads_back(*s, "b", b);
  EXPECT_LE(data_file_bytes(), before + (4u << 20) + (4u << 20))
      << "before " << before;  // one copy of b's 4 chunks, plus the growth step
  ASSERT_OK(s->flush());
  ASSERT_OK(s->close());
  auto r = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(r);
  expect_reads_back(*r, "a", a3);
  expect_reads_back(*r, "b", b);
}

TEST(StoreSavepoint, RollbackAcrossAFlushRestoresTheSavedVersionDurably) {
  TempDir d;
  const uint64_t n = 2u << 20;
  auto a = pattern(n, 5), x = pattern(4096, 6);
  {
    auto s = open_or_die(small_options(d.sub("s")));
    ASSERT_TRUE(s);
    ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(n)));
    auto sp = s->savepoint({"a"});
    ASSERT_OK(sp.status());
    ASSERT_OK(s->write_range("a", 8192, x.size(), x.data()));
    ASSERT_OK(s->flush());  // commits the rewritten version
    ASSERT_OK(s->rollback(*sp));
    expect_reads_back(*s, "a", a);
    ASSERT_OK(s->close());  // commits the saved version again
  }
  auto r = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(r);
  expect_reads_back(*r, "a", a);
  auto v = r->verify();
  ASSERT_OK(v.status());
  EXPECT_TRUE(v->errors.empty());
}

TEST(StoreSavepoint, RefusesWhatItCannotRestore) {
  TempDir d;
  auto s = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(s);
  auto a = pattern(10000, 7);
  ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
  PutOptions host;
  host.tier = Tier::kHost;
  ASSERT_OK(s->put("h", a.data(), TensorDesc::bytes(a.size()), host));
  auto missing = s->savepoint({"a", "nope"});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
  auto twice = s->savepoint({"a", "a"});
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  auto in_host = s->savepoint({"h"});
  EXPECT_EQ(in_host.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(in_host.status().message().find("'h'"), std::string::npos);
  // Replaced since the savepoint: refused, nothing restored.
  auto sp = s->savepoint({"a"});
  ASSERT_OK(sp.status());
  auto b = pattern(10000, 8);
  PutOptions over;
  over.overwrite = true;
  ASSERT_OK(s->put("a", b.data(), TensorDesc::bytes(b.size()), over));
  Status st = s->rollback(*sp);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("'a'"), std::string::npos);
  expect_reads_back(*s, "a", b);
  // Moved to host since: refused.
  auto sp2 = s->savepoint({"a"});
  ASSERT_OK(sp2.status());
  ASSERT_OK(s->move("a", Tier::kHost));
  EXPECT_EQ(s->rollback(*sp2).code(), StatusCode::kFailedPrecondition);
  // A savepoint of another store.
  auto other = open_or_die(small_options(d.sub("t")));
  ASSERT_TRUE(other);
  ASSERT_OK(other->put("a", a.data(), TensorDesc::bytes(a.size())));
  auto osp = other->savepoint({"a"});
  ASSERT_OK(osp.status());
  EXPECT_EQ(s->rollback(*osp).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(s->rollback(Savepoint{}).ok());  // empty: nothing to do
}

}  // namespace
}  // namespace strata
