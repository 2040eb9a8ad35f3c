// DType: sizes, names and parsing of the ten element types.
#include "strata/base/dtype.hpp"

#include <gtest/gtest.h>

#include <utility>

using namespace strata;

TEST(DType, SizesNamesAndParse) {
  const std::pair<DType, size_t> sizes[] = {
      {DType::kFloat32, 4}, {DType::kFloat16, 2}, {DType::kBFloat16, 2}, {DType::kFloat64, 8},
      {DType::kInt8, 1},    {DType::kInt16, 2},   {DType::kInt32, 4},    {DType::kInt64, 8},
      {DType::kUInt8, 1},   {DType::kBool, 1}};
  for (auto [t, n] : sizes) {
    EXPECT_EQ(dtype_size(t), n) << dtype_name(t);
    auto back = parse_dtype(dtype_name(t));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(*parse_dtype("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*parse_dtype("half"), DType::kFloat16);
  EXPECT_EQ(parse_dtype("fp8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parse_dtype("fp8").status().message().find("'fp8'"), std::string::npos);
  EXPECT_FALSE(dtype_is_valid(static_cast<DType>(42)));
  static_assert(dtype_size(DType::kBFloat16) == 2);
}
