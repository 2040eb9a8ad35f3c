// Test helper for tests/store/test_store_durability.cpp: opens the store at argv[1] and puts
// objects "obj/<i>" (i = 0, 1, ...) of pattern(size_i, i) into the NVMe tier, one after the
// other, printing "<i>\n" (flushed) after each put's future is ready. Runs until killed.
// With argv[2] == "lock", opens the store and sleeps (to hold the lock); with "cow", see
// StoreDurability.WriteRangeIsCopyOnWriteUntilFlush.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "../test_store_util.hpp"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  auto o = strata::store_test::small_options(argv[1]);
  auto r = strata::Store::open(o);
  if (!r.ok()) {
    std::fprintf(stderr, "open: %s\n", r.status().to_string().c_str());
    return 1;
  }
  auto& s = *r;
  if (argc > 2 && std::strcmp(argv[2], "lock") == 0) {
    std::printf("locked\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  if (argc > 2 && std::strcmp(argv[2], "cow") == 0) {
    // For StoreDurability.WriteRangeIsCopyOnWriteUntilFlush.
    const uint64_t n = 3u << 20;
    auto a = strata::store_test::pattern(n, 40), w = strata::store_test::pattern(1500000, 41);
    auto desc = strata::TensorDesc::bytes(n);
    bool ok = s->put("state", a.data(), desc).ok() && s->put("state2", a.data(), desc).ok() &&
              s->write_range("state2", 1000, w.size(), w.data()).ok() &&
              s->flush().ok() && s->write_range("state", 1000, w.size(), w.data()).ok();
    if (!ok) return 1;
    std::printf("written\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  for (uint64_t i = 0;; ++i) {
    // Sizes cycle through several chunks and odd tails: 1 .. ~2.3 MiB.
    uint64_t n = 1 + (i * 392761) % (2400 * 1024);
    auto data = strata::store_test::pattern(n, i);
    auto st = s->put("obj/" + std::to_string(i), data.data(), strata::TensorDesc::bytes(n));
    if (!st.ok()) {
      std::fprintf(stderr, "put %llu: %s\n", static_cast<unsigned long long>(i),
                   st.to_string().c_str());
      return 1;
    }
    std::printf("%llu\n", static_cast<unsigned long long>(i));
    std::fflush(stdout);
  }
}
