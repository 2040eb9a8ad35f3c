// Bad input to the C++ Store API that docs/reliability.md's table lists and no other test
// covers: null buffers, out-of-range enum values, an empty allocate callback, ranges past
// the end at the edges. Each is a clean error naming the key, nothing is written, and the
// store stays usable.
#include <gtest/gtest.h>

#include <string>

#include "common/temp_dir.hpp"
#include "reliability/crash_loop.hpp"

namespace strata {
namespace {

using crash_loop::bytes_of;

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = Store::open(crash_loop::store_options(dir_.path() + "/store"));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    s_ = std::move(r).value();
    v_ = bytes_of(5000, 1);
    ASSERT_TRUE(s_->put("k", v_.data(), TensorDesc::bytes(v_.size())).ok());
  }
  void TearDown() override {
    if (!s_) return;
    // Nothing of the refused calls is visible; the store still works.
    std::vector<uint8_t> got(v_.size());
    ASSERT_TRUE(s_->get_bytes("k", got.data(), got.size()).ok());
    EXPECT_EQ(got, v_);
    EXPECT_EQ(s_->list().size(), 1u);
    auto x = bytes_of(3000, 2);
    EXPECT_TRUE(s_->put("after", x.data(), TensorDesc::bytes(x.size())).ok());
    EXPECT_TRUE(s_->close().ok());
  }
  void expect_invalid(const Status& st, const std::string& needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  }

  testing::TempDir dir_;
  std::unique_ptr<Store> s_;
  std::vector<uint8_t> v_;
};

TEST_F(BadInput, NullBuffersAreInvalidArgumentNamingTheKey) {
  expect_invalid(s_->put("n", nullptr, TensorDesc::bytes(10)), "'n'");
  EXPECT_FALSE(s_->contains("n"));
  expect_invalid(s_->get_bytes("k", nullptr, v_.size()), "'k'");
  expect_invalid(s_->get("k", nullptr, TensorDesc::bytes(v_.size())), "'k'");
  expect_invalid(s_->read_range("k", 0, 10, nullptr), "'k'");
  expect_invalid(s_->write_range("k", 0, 10, nullptr), "'k'");
  // Zero bytes need no buffer.
  EXPECT_TRUE(s_->put("empty", nullptr, TensorDesc::bytes(0)).ok());
  EXPECT_TRUE(s_->read_range("k", 10, 0, nullptr).ok());
  EXPECT_TRUE(s_->remove("empty").ok());
}

TEST_F(BadInput, OutOfRangeEnumValuesAreInvalidArgument) {
  TensorDesc bad_dtype{static_cast<DType>(200), {4}};
  expect_invalid(s_->put("d", v_.data(), bad_dtype), "'d'");
  EXPECT_FALSE(s_->contains("d"));
  PutOptions po;
  po.tier = static_cast<Tier>(9);
  expect_invalid(s_->put("t", v_.data(), TensorDesc::bytes(10), po), "'t'");
  EXPECT_FALSE(s_->contains("t"));
  expect_invalid(s_->move("k", static_cast<Tier>(9)), "'k'");
  expect_invalid(s_->prefetch("k", static_cast<Tier>(9)), "'k'");
}

TEST_F(BadInput, EmptyAllocateCallbackIsInvalidArgument) {
  expect_invalid(s_->get_alloc("k", nullptr), "'k'");
}

TEST_F(BadInput, RangesAtAndPastTheEnd) {
  std::vector<uint8_t> buf(16);
  EXPECT_TRUE(s_->read_range("k", v_.size(), 0, buf.data()).ok());
  EXPECT_EQ(s_->read_range("k", v_.size(), 1, buf.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s_->read_range("k", v_.size() + 1, 0, buf.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s_->write_range("k", v_.size() - 1, 2, buf.data()).code(), StatusCode::kOutOfRange);
  Status st = s_->read_range("k", ~0ull, 2, buf.data());  // offset + nbytes wraps
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_NE(st.message().find("'k'"), std::string::npos) << st.to_string();
  st = s_->write_range("k", 2, ~0ull, buf.data());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
}

}  // namespace
}  // namespace strata
