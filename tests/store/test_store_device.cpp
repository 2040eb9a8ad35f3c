// Device tier (GPU HBM). Skips without a GPU (any CUDA runtime error means none).
#include <gtest/gtest.h>

#include "test_store_util.hpp"

namespace strata {
namespace {

using namespace store_test;

TEST(StoreDevice, PutGetMoveAcrossAllTiers) {
  TempDir d;
  auto o = small_options(d.path());
  o.device_budget_bytes = 8ull << 20;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  if (!s->has_device()) GTEST_SKIP() << "no GPU";
  const uint64_t n = (3u << 20) + 333;
  auto a = pattern(n, 1), w = pattern(5000, 2);
  ASSERT_OK(s->put("d", a.data(), TensorDesc::bytes(n), {Tier::kDevice}));
  EXPECT_EQ(s->stat("d")->tier, Tier::kDevice);
  EXPECT_EQ(s->usage().device_bytes, n);
  std::vector<uint8_t> out(n);
  ASSERT_OK(s->get_bytes("d", out.data(), n));
  EXPECT_EQ(out, a);
  ASSERT_OK(s->write_range("d", 100, w.size(), w.data()));
  std::copy(w.begin(), w.end(), a.begin() + 100);
  ASSERT_OK(s->move("d", Tier::kHost));
  EXPECT_EQ(s->stat("d")->tier, Tier::kHost);
  EXPECT_EQ(s->usage().device_bytes, 0u);
  ASSERT_OK(s->move("d", Tier::kNvme));  // write-back of the dirty copy
  ASSERT_OK(s->prefetch("d", Tier::kDevice));  // NVMe -> pinned -> HBM, pipelined
  EXPECT_EQ(s->stat("d")->tier, Tier::kDevice);
  ASSERT_OK(s->get_bytes("d", out.data(), n));
  EXPECT_EQ(out, a);
  // Budget: a second 3 MiB object fits, a third evicts the least recently used one.
  ASSERT_OK(s->put("e", a.data(), TensorDesc::bytes(n), {Tier::kDevice}));
  ASSERT_OK(s->put("f", a.data(), TensorDesc::bytes(n), {Tier::kDevice}));
  EXPECT_EQ(s->stat("d")->tier, Tier::kNvme);
  EXPECT_LE(s->usage().device_bytes, 8ull << 20);
  std::vector<uint8_t> big(9u << 20);
  EXPECT_EQ(s->put("big", big.data(), TensorDesc::bytes(big.size()), {Tier::kDevice}).code(),
            StatusCode::kResourceExhausted);
}

TEST(StoreDevice, WithoutGpuTheDeviceTierIsRefused) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  if (s->has_device()) GTEST_SKIP() << "a GPU is present";
  uint8_t b[16] = {};
  auto st = s->put("x", b, TensorDesc::bytes(16), {Tier::kDevice});
  EXPECT_TRUE(st.code() == StatusCode::kUnimplemented || st.code() == StatusCode::kInvalidArgument)
      << st.to_string();
  EXPECT_FALSE(s->contains("x"));
}

}  // namespace
}  // namespace strata
