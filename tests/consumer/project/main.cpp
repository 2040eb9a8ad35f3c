// A program outside the strata tree, built against the installed package.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/partitioned.hpp"

int main() {
  auto size = strata::parse_size("4KiB");
  if (!size.ok() || *size != 4096) return 1;
  // Partitioned objects are part of the store (and need no communicator backend).
  auto layout = strata::partition_layout(10, 4);
  if (!layout.ok() || layout->chunk_numel != 3 || layout->owned_numel(3) != 1) return 1;
  // Real I/O through the installed engine: write and read back 4097 bytes.
  strata::IoEngineOptions opts;
  auto engine = strata::IoEngine::create(opts);
  if (!engine.ok()) {
    std::printf("engine: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  char tmpl[] = "/tmp/strata-consumer-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  std::string path = std::string(tmpl) + "/f";
  auto file = (*engine)->open(path, strata::OpenMode::kTruncate);
  if (!file.ok()) {
    std::printf("open: %s\n", file.status().to_string().c_str());
    return 1;
  }
  std::vector<unsigned char> src(4097), dst(4097, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  auto w = (*engine)->write_async(*file, src.data(), src.size(), 0).result();
  auto r = (*engine)->read_async(*file, dst.data(), dst.size(), 0).result();
  std::remove(path.c_str());
  std::remove(tmpl);
  if (!w.ok() || !r.ok() || *r != 4097 || src != dst) {
    std::printf("round trip failed: %s %s\n", w.status().to_string().c_str(),
                r.status().to_string().c_str());
    return 1;
  }
  std::printf("consumer ok\n");
  return 0;
}
