// Child of tests/reliability/concurrency/test_concurrency.cpp:
//
//   store_reader_child open-rw DIR        tries a writable open of DIR; prints "refused
//                                         <code>: <message>" or "opened"
//   store_reader_child read DIR MS        opens DIR read-only and for MS milliseconds lists
//                                         "ro/" and reads every object whole; prints
//                                         "seen <key> <seed>" for each version read (once),
//                                         "bad <key> ..." for a torn or mixed one, then
//                                         "reads <n> notfound <m>"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "reliability/concurrency/self_check.hpp"

using namespace strata;

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argv[1];
  StoreOptions o = crash_loop::store_options(argv[2]);
  o.create = false;
  if (mode == "open-rw") {
    auto r = Store::open(o);
    if (r.ok()) {
      std::printf("opened\n");
    } else {
      std::printf("refused %s: %s\n", std::string(status_code_name(r.status().code())).c_str(),
                  r.status().message().c_str());
    }
    return 0;
  }
  if (mode != "read" || argc < 4) return 2;
  o.read_only = true;
  auto r = Store::open(o);
  if (!r.ok()) {
    std::fprintf(stderr, "open: %s\n", r.status().to_string().c_str());
    return 1;
  }
  Store& s = **r;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::atoll(argv[3]));
  std::set<std::pair<std::string, uint64_t>> seen;
  uint64_t reads = 0, notfound = 0;
  std::vector<uint8_t> buf;
  while (std::chrono::steady_clock::now() < end) {
    for (auto& info : s.list("ro/")) {
      Status st = s.get_alloc(info.key, [&](const TensorDesc& d) -> Result<void*> {
        buf.resize(d.nbytes());
        return static_cast<void*>(buf.data());
      });
      if (st.code() == StatusCode::kNotFound) {
        ++notfound;
        continue;
      }
      if (!st.ok()) {
        std::printf("bad %s: %s\n", info.key.c_str(), st.to_string().c_str());
        continue;
      }
      ++reads;
      uint64_t seed = 0;
      if (!concurrency::check_version(buf, &seed)) {
        std::printf("bad %s: a torn or mixed version of %zu bytes\n", info.key.c_str(), buf.size());
      } else if (seen.insert({info.key, seed}).second) {
        std::printf("seen %s %llu\n", info.key.c_str(), static_cast<unsigned long long>(seed));
      }
    }
  }
  std::printf("reads %llu notfound %llu\n", static_cast<unsigned long long>(reads),
              static_cast<unsigned long long>(notfound));
  return 0;
}
