// The NVMe tier's extent allocator on its own (store/src/extent_allocator.hpp): exact
// offsets of first-fit allocation, merging of freed neighbours, the end of each data file,
// loading committed extents, the budget, which free ranges are punched (the warm reserve),
// and the alignment of large extents to the engine's block size.
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

// A private header of the store (tests/store/extra.cmake puts store/src on the include path).
#include "extent_allocator.hpp"

namespace strata::store_detail {
namespace {

constexpr uint64_t K4 = 4096;
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

std::shared_ptr<Extent> must(Result<std::shared_ptr<Extent>> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : nullptr;
}

TEST(ExtentAllocator, AllocatesAtTheEndOfEachFileInOrder) {
  auto a = std::make_shared<ExtentAllocator>(2, 0);
  auto e0 = must(a->allocate(0, K4, "k"));
  auto e1 = must(a->allocate(0, 2 * K4, "k"));
  auto e2 = must(a->allocate(1, K4, "k"));
  auto e3 = must(a->allocate(0, K4, "k"));
  EXPECT_EQ(e0->dir, 0u);
  EXPECT_EQ(e0->offset, 0u);
  EXPECT_EQ(e0->len, K4);
  EXPECT_EQ(e1->offset, K4);
  EXPECT_EQ(e1->len, 2 * K4);
  EXPECT_EQ(e2->dir, 1u);
  EXPECT_EQ(e2->offset, 0u);  // directories are independent
  EXPECT_EQ(e3->offset, 3 * K4);
  EXPECT_EQ(a->end(0), 4 * K4);
  EXPECT_EQ(a->end(1), K4);
  EXPECT_EQ(a->used(), 5 * K4);
  EXPECT_EQ(a->free_ranges(0), Ranges{});
}

TEST(ExtentAllocator, FirstFitTakesTheHeadOfTheLowestGapThatFits) {
  auto a = std::make_shared<ExtentAllocator>(1, 0);
  auto e0 = must(a->allocate(0, K4, "k"));
  auto e1 = must(a->allocate(0, K4, "k"));
  auto e2 = must(a->allocate(0, 3 * K4, "k"));
  auto e3 = must(a->allocate(0, K4, "k"));
  e0.reset();  // gap [0, 4K)
  e2.reset();  // gap [8K, 20K)
  EXPECT_EQ(a->free_ranges(0), (Ranges{{0, K4}, {2 * K4, 3 * K4}}));
  EXPECT_EQ(a->end(0), 6 * K4);
  // 8 KiB does not fit the first gap: the head of the second one.
  auto f0 = must(a->allocate(0, 2 * K4, "k"));
  EXPECT_EQ(f0->offset, 2 * K4);
  EXPECT_EQ(a->free_ranges(0), (Ranges{{0, K4}, {4 * K4, K4}}));
  // 4 KiB: the lowest gap.
  auto f1 = must(a->allocate(0, K4, "k"));
  EXPECT_EQ(f1->offset, 0u);
  EXPECT_EQ(a->free_ranges(0), (Ranges{{4 * K4, K4}}));
  // 8 KiB fits no gap: the end of the file.
  auto f2 = must(a->allocate(0, 2 * K4, "k"));
  EXPECT_EQ(f2->offset, 6 * K4);
  EXPECT_EQ(a->end(0), 8 * K4);
  EXPECT_EQ(a->used(), 7 * K4);
}

TEST(ExtentAllocator, FreedNeighboursMergeAndTheEndShrinks) {
  auto a = std::make_shared<ExtentAllocator>(1, 0);
  std::vector<std::shared_ptr<Extent>> e;
  for (int i = 0; i < 5; ++i) e.push_back(must(a->allocate(0, K4, "k")));
  e[0].reset();
  e[2].reset();
  EXPECT_EQ(a->free_ranges(0), (Ranges{{0, K4}, {2 * K4, K4}}));
  e[1].reset();  // merges with both neighbours
  EXPECT_EQ(a->free_ranges(0), (Ranges{{0, 3 * K4}}));
  EXPECT_EQ(a->end(0), 5 * K4);
  e[4].reset();  // the last extent: the end moves back, no free range
  EXPECT_EQ(a->free_ranges(0), (Ranges{{0, 3 * K4}}));
  EXPECT_EQ(a->end(0), 4 * K4);
  e[3].reset();  // merges with the gap before it, which then reaches the end
  EXPECT_EQ(a->free_ranges(0), Ranges{});
  EXPECT_EQ(a->end(0), 0u);
  EXPECT_EQ(a->used(), 0u);
}

TEST(ExtentAllocator, MergesWithTheNextFreeRangeOnly) {
  auto a = std::make_shared<ExtentAllocator>(1, 0);
  auto e0 = must(a->allocate(0, K4, "k"));
  auto e1 = must(a->allocate(0, K4, "k"));
  auto e2 = must(a->allocate(0, K4, "k"));
  auto e3 = must(a->allocate(0, K4, "k"));
  e2.reset();
  e1.reset();  // [4K, 8K) + [8K, 12K)
  EXPECT_EQ(a->free_ranges(0), (Ranges{{K4, 2 * K4}}));
  EXPECT_EQ(a->end(0), 4 * K4);
}

TEST(ExtentAllocator, BudgetCountsEveryDirectory) {
  auto a = std::make_shared<ExtentAllocator>(2, 3 * K4);
  auto e0 = must(a->allocate(0, 2 * K4, "a"));
  auto r = a->allocate(1, 2 * K4, "big");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("'big'"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(a->used(), 2 * K4);
  EXPECT_EQ(a->end(1), 0u);  // a refused allocation takes nothing
  auto e1 = must(a->allocate(1, K4, "fits"));  // exactly the budget
  EXPECT_EQ(a->used(), 3 * K4);
  e0.reset();
  auto e2 = must(a->allocate(1, 2 * K4, "big"));
  EXPECT_EQ(e2->offset, K4);
}

TEST(ExtentAllocator, LoadedExtentsLeaveTheGapsFree) {
  auto a = std::make_shared<ExtentAllocator>(2, 0);
  // Adopted out of order, as a catalog's rows come.
  auto c1 = a->adopt(1, 5 * K4, K4);
  auto c0 = a->adopt(1, 2 * K4, 2 * K4);
  auto c2 = a->adopt(0, 0, K4);
  ASSERT_TRUE(a->finish_load().ok());
  EXPECT_EQ(a->free_ranges(1), (Ranges{{0, 2 * K4}, {4 * K4, K4}}));
  EXPECT_EQ(a->end(1), 6 * K4);
  EXPECT_EQ(a->free_ranges(0), Ranges{});
  EXPECT_EQ(a->end(0), K4);
  EXPECT_EQ(a->used(), 4 * K4);
  EXPECT_EQ(c0->offset, 2 * K4);
  EXPECT_EQ(c0->len, 2 * K4);
  // Loaded extents are released like allocated ones.
  c0.reset();
  EXPECT_EQ(a->free_ranges(1), (Ranges{{0, 5 * K4}}));
  EXPECT_EQ(a->used(), 2 * K4);
  auto n = must(a->allocate(1, K4, "k"));
  EXPECT_EQ(n->offset, 0u);
}

TEST(ExtentAllocator, OverlappingLoadedExtentsAreDataLoss) {
  auto a = std::make_shared<ExtentAllocator>(2, 0);
  auto c0 = a->adopt(1, 0, 2 * K4);
  auto c1 = a->adopt(1, K4, K4);
  Status st = a->finish_load();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("directory 1 at offset 4096"), std::string::npos) << st.to_string();
}

TEST(ExtentAllocator, PunchFreeKeepsTheLowestRangesThatFitTheWarmReserve) {
  auto a = std::make_shared<ExtentAllocator>(1, 0);
  std::vector<std::shared_ptr<Extent>> e;
  for (uint64_t len : {K4, 2 * K4, K4, 3 * K4, K4, K4}) e.push_back(must(a->allocate(0, len, "k")));
  // Extents at 0, 4K, 12K, 16K, 28K, 32K (end 36K).
  e[0].reset();  // [0, 4K)
  e[3].reset();  // [16K, 28K)
  e[4].reset();  // merges: [16K, 32K)
  ASSERT_EQ(a->free_ranges(0), (Ranges{{0, K4}, {4 * K4, 4 * K4}}));
  Ranges punched;
  auto punch = [&](uint64_t off, uint64_t len) {
    punched.emplace_back(off, len);
    return true;
  };
  // A reserve of 2 blocks keeps [0, 4K) (fits), punches [16K, 32K) (does not fit whole).
  a->punch_free(0, a->end(0), 2 * K4, punch);
  EXPECT_EQ(punched, (Ranges{{4 * K4, 4 * K4}}));
  // The kept range is still a candidate next time; punched ones are not punched again.
  punched.clear();
  a->punch_free(0, a->end(0), 0, punch);
  EXPECT_EQ(punched, (Ranges{{0, K4}}));
  punched.clear();
  a->punch_free(0, a->end(0), 0, punch);
  EXPECT_TRUE(punched.empty());
  // A reserve larger than every free range and the file's tail past the allocated end
  // keeps them all: nothing is punched and the file end stays.
  e[1].reset();  // [4K, 12K) merges with [0, 4K): a new, unpunched range [0, 12K)
  punched.clear();
  EXPECT_EQ(a->end(0), 9 * K4);
  EXPECT_EQ(a->punch_free(0, 14 * K4, 100 * K4, punch), 14 * K4);
  EXPECT_TRUE(punched.empty());
}

TEST(ExtentAllocator, PunchFreeKeepsTheTailThatTheRestOfTheReserveCoversAndPunchesItOnce) {
  auto a = std::make_shared<ExtentAllocator>(1, 0);
  std::vector<std::shared_ptr<Extent>> e;
  for (uint64_t len : {2 * K4, K4, 3 * K4}) e.push_back(must(a->allocate(0, len, "k")));
  // Extents at 0, 8K, 12K (end 24K); the data file is 40K long (16K of growth slack).
  e[0].reset();  // [0, 8K) free
  e[2].reset();  // [12K, 24K) at the end: the allocated end drops to 12K
  ASSERT_EQ(a->end(0), 3 * K4);
  ASSERT_EQ(a->free_ranges(0), (Ranges{{0, 2 * K4}}));
  Ranges punched;
  auto punch = [&](uint64_t off, uint64_t len) {
    punched.emplace_back(off, len);
    return true;
  };
  // Reserve 5 blocks: [0, 8K) takes 2, the tail's first 3 blocks [12K, 24K) stay, the
  // rest [24K, 40K) is punched and the file's allocated end becomes 24K.
  EXPECT_EQ(a->punch_free(0, 10 * K4, 5 * K4, punch), 6 * K4);
  EXPECT_EQ(punched, (Ranges{{6 * K4, 4 * K4}}));
  // Called again with that end: nothing more to punch.
  punched.clear();
  EXPECT_EQ(a->punch_free(0, 6 * K4, 5 * K4, punch), 6 * K4);
  EXPECT_TRUE(punched.empty());
  // No reserve (close): the kept range and the whole tail go.
  EXPECT_EQ(a->punch_free(0, 6 * K4, 0, punch), 3 * K4);
  EXPECT_EQ(punched, (Ranges{{0, 2 * K4}, {3 * K4, 3 * K4}}));
  // A punch that fails leaves the file end where it was.
  auto refuse = [](uint64_t, uint64_t) { return false; };
  auto more = must(a->allocate(0, 4 * K4, "k"));  // [12K, 28K): past the end, end 28K
  EXPECT_EQ(a->punch_free(0, 10 * K4, 0, refuse), 10 * K4);
}

TEST(ExtentAllocator, AnExtentWithoutAllocatorIsNeverReleased) {
  auto a = std::make_shared<ExtentAllocator>(1, 0);
  auto held = must(a->allocate(0, K4, "k"));
  {
    auto view = std::make_shared<Extent>();  // a read-only open's view of another's extent
    view->dir = 0;
    view->offset = 0;
    view->len = K4;
  }
  EXPECT_EQ(a->used(), K4);
  EXPECT_EQ(a->end(0), K4);
}

constexpr uint64_t M1 = 1ull << 20;
constexpr uint64_t kBig = kAlignedExtentFactor * M1;  // 16 MiB: aligned

TEST(ExtentAllocator, LargeExtentsStartOnTheAlignmentAndSmallOnesFillTheGap) {
  auto a = std::make_shared<ExtentAllocator>(1, 0, M1);
  auto e0 = must(a->allocate(0, K4, "k"));          // [0, 4K)
  auto e1 = must(a->allocate(0, kBig, "k"));        // past the end, on the next 1 MiB
  EXPECT_EQ(e0->offset, 0u);
  EXPECT_EQ(e1->offset, M1);
  EXPECT_EQ(e1->len, kBig);
  EXPECT_EQ(a->end(0), M1 + kBig);
  EXPECT_EQ(a->free_ranges(0), (Ranges{{K4, M1 - K4}}));  // the gap before it is free
  EXPECT_EQ(a->used(), K4 + kBig);                         // and not counted as used
  auto e2 = must(a->allocate(0, 2 * K4, "k"));      // small: first fit, in the gap
  EXPECT_EQ(e2->offset, K4);
  EXPECT_EQ(a->free_ranges(0), (Ranges{{3 * K4, M1 - 3 * K4}}));
  // Just under 16 x the alignment: 4 KiB-aligned, at the end as before.
  auto e3 = must(a->allocate(0, kBig - K4, "k"));
  EXPECT_EQ(e3->offset, M1 + kBig);
  auto e4 = must(a->allocate(0, kBig, "k"));
  EXPECT_EQ(e4->offset, 2 * kBig + M1);  // align_up(2 x 16 MiB + 1 MiB - 4K, 1 MiB)
  EXPECT_EQ(a->free_ranges(0), (Ranges{{3 * K4, M1 - 3 * K4}, {2 * kBig + M1 - K4, K4}}));
  EXPECT_EQ(a->end(0), 3 * kBig + M1);
  // Freed, e1 merges with the gap before it: [12K, 17M). A large extent takes it from the
  // first multiple of 1 MiB in it; the head stays free.
  e1.reset();
  EXPECT_EQ(a->free_ranges(0), (Ranges{{3 * K4, M1 + kBig - 3 * K4}, {2 * kBig + M1 - K4, K4}}));
  auto e5 = must(a->allocate(0, kBig, "k"));
  EXPECT_EQ(e5->offset, M1);
  EXPECT_EQ(a->free_ranges(0), (Ranges{{3 * K4, M1 - 3 * K4}, {2 * kBig + M1 - K4, K4}}));
  // Everything freed: the gaps merge back and the file's end is 0.
  e0.reset(); e2.reset(); e3.reset(); e4.reset(); e5.reset();
  EXPECT_EQ(a->free_ranges(0), Ranges{});
  EXPECT_EQ(a->end(0), 0u);
  EXPECT_EQ(a->used(), 0u);
}

TEST(ExtentAllocator, ALargeExtentSkipsAFreeRangeItFitsOnlyUnaligned) {
  auto a = std::make_shared<ExtentAllocator>(1, 0, M1);
  auto y0 = must(a->allocate(0, K4, "k"));
  auto y1 = must(a->allocate(0, kBig - K4, "k"));  // not aligned: [4K, 16M)
  auto y2 = must(a->allocate(0, K4, "k"));         // [16M, 16M + 4K)
  EXPECT_EQ(y1->offset, K4);
  y1.reset();
  EXPECT_EQ(a->free_ranges(0), (Ranges{{K4, kBig - K4}}));
  // 16 MiB from 1 MiB would end at 17 MiB, past the range: the end of the file instead.
  auto z = must(a->allocate(0, kBig, "k"));
  EXPECT_EQ(z->offset, kBig + M1);
  EXPECT_EQ(a->end(0), 2 * kBig + M1);
  EXPECT_EQ(a->free_ranges(0), (Ranges{{K4, kBig - K4}, {kBig + K4, M1 - K4}}));
  // Unaligned, the same range holds 16 MiB - 4 KiB at its head.
  auto w = must(a->allocate(0, kBig - K4, "k"));
  EXPECT_EQ(w->offset, K4);
}

TEST(ExtentAllocator, WithoutAnAlignmentLargeExtentsAreFirstFitAsSmallOnes) {
  auto a = std::make_shared<ExtentAllocator>(1, 0);  // align 4 KiB
  auto e0 = must(a->allocate(0, K4, "k"));
  auto e1 = must(a->allocate(0, kBig, "k"));
  EXPECT_EQ(e1->offset, K4);
  EXPECT_EQ(a->end(0), K4 + kBig);
}

}  // namespace
}  // namespace strata::store_detail
