// Fuzz target: the safetensors header parser (store/include/strata/store/safetensors.hpp),
// over whole file images (8-byte length, JSON, data).
// Properties: any input parses or gives DataLoss naming the file; a parsed header's tensors
// cover the data exactly (sorted, no hole, no overlap, each numel x dtype size bytes), find()
// finds each by name; format_header() of the parsed entries parses back to the same entries
// and metadata.
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "strata/store/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  namespace st = strata::safetensors;
  const std::string_view img(reinterpret_cast<const char*>(data), size);
  auto h = st::parse(img, size, "fuzz.safetensors");
  if (!h.ok()) {
    FUZZ_CHECK(h.status().code() == StatusCode::kDataLoss, "%s", h.status().to_string().c_str());
    FUZZ_CHECK(h.status().message().find("'fuzz.safetensors'") != std::string::npos, "%s",
               h.status().to_string().c_str());
    return 0;
  }
  uint64_t pos = 0;
  for (const auto& e : h->tensors) {
    FUZZ_CHECK(e.begin == pos, "tensor '%s' begins at %llu, expected %llu", e.name.c_str(),
               static_cast<unsigned long long>(e.begin), static_cast<unsigned long long>(pos));
    FUZZ_CHECK(e.numel() * st::dtype_size(e.dtype) == e.nbytes(), "size of '%s'", e.name.c_str());
    FUZZ_CHECK(h->find(e.name) == &e, "find('%s')", e.name.c_str());
    pos = e.end;
  }
  FUZZ_CHECK(h->data_start() + pos == size, "data end %llu of %zu",
             static_cast<unsigned long long>(h->data_start() + pos), size);
  const std::string hdr = st::format_header(h->tensors, h->metadata, 64);
  std::string again_img = hdr + std::string(img.substr(h->data_start()));
  auto again = st::parse(again_img, again_img.size(), "formatted");
  FUZZ_CHECK(again.ok(), "the formatted header does not parse: %s", again.status().to_string().c_str());
  FUZZ_CHECK(again->tensors.size() == h->tensors.size(), "tensor count");
  for (size_t i = 0; i < h->tensors.size(); ++i) {
    const auto& a = h->tensors[i];
    const auto& b = again->tensors[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
                   a.end == b.end,
               "entry %zu ('%s') changed", i, a.name.c_str());
  }
  FUZZ_CHECK(again->metadata == h->metadata, "metadata changed");
  return 0;
}
