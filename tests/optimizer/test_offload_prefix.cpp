// Two optimizers on one store: overlapping key prefixes are refused while the first is open
// (their keys would overlap), for create() and open(), and the claim ends with the optimizer.
#include <gtest/gtest.h>

#include "offload_test_util.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

OffloadOptions with_prefix(const std::string& prefix) {
  OffloadOptions o;
  o.key_prefix = prefix;
  o.num_threads = 1;
  return o;
}

TEST(OffloadPrefix, OverlappingPrefixesOnOneStoreAreRefusedWhileTheFirstIsOpen) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto factory = *builtin_rule_factory("adam");
  auto first = must(OffloadedOptimizer::create(store, factory, {}, with_prefix("optim/")));
  for (const std::string p : {"optim/", "optim/a/", "opt", ""}) {
    auto r = OffloadedOptimizer::create(store, factory, {}, with_prefix(p));
    ASSERT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << p;
    const std::string msg = r.status().message();
    EXPECT_NE(msg.find("'optim/'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("key_prefix"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir.path()), std::string::npos) << msg;
  }
  // A disjoint prefix is fine; so is the same prefix on another store.
  auto other = OffloadedOptimizer::create(store, factory, {}, with_prefix("critic/"));
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  TempDir dir2;
  std::shared_ptr<Store> store2 = must(Store::open(small_store_options(dir2.path())));
  EXPECT_TRUE(OffloadedOptimizer::create(store2, factory, {}, with_prefix("optim/")).ok());

  // open() of the first's checkpoint while it is open: refused the same way.
  auto init = values(3, 100);
  auto h = must(first->add_param("w", 100, init.data(), 0, Placement::kNvme));
  (void)h;
  OFFLOAD_ASSERT_OK(first->checkpoint());
  EXPECT_EQ(OffloadedOptimizer::open(store, factory, with_prefix("optim/")).status().code(),
            StatusCode::kFailedPrecondition);
  // Closed, its prefix is free: resume works, and a nested prefix may be created.
  OFFLOAD_ASSERT_OK(first->close());
  auto during = OffloadedOptimizer::open(store, factory, with_prefix("optim/"));
  ASSERT_TRUE(during.ok()) << during.status().to_string();  // the first not yet destroyed
  during->reset();
  first.reset();
  auto resumed = OffloadedOptimizer::open(store, factory, with_prefix("optim/"));
  ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
  EXPECT_EQ((*resumed)->num_params(), 1u);
  resumed->reset();
  EXPECT_TRUE(OffloadedOptimizer::create(store, factory, {}, with_prefix("optim/a/")).ok());
}

TEST(OffloadPrefix, AFailedCreateReleasesItsClaim) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto factory = *builtin_rule_factory("adam");
  OffloadOptions bad = with_prefix("optim/");
  bad.num_buffers = -1;  // InvalidArgument after the claim is taken
  EXPECT_EQ(OffloadedOptimizer::create(store, factory, {}, bad).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(OffloadedOptimizer::create(store, factory, {}, with_prefix("optim/")).ok());
}

}  // namespace
}  // namespace strata::optimizer
