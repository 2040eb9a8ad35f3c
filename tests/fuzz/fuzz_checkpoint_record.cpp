// Fuzz target: the offloaded optimizer's checkpoint record (optimizer/src/offload_record.hpp),
// the text OffloadedOptimizer::open() reads back under key_prefix + "meta".
// Properties: parsing any text gives a record or DataLoss naming the key; a parsed record
// holds what open() relies on (names usable in keys, numel * 4 within 64 bits, groups in
// range, steps >= 0) and formats to a text that parses to the same record.
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "offload_impl.hpp"
#include "offload_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  using namespace strata::optimizer::offload_detail;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto m = parse_meta(text, "opt/meta");
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == StatusCode::kDataLoss, "%s", m.status().to_string().c_str());
    FUZZ_CHECK(m.status().message().find("'opt/meta'") != std::string::npos, "%s",
               m.status().to_string().c_str());
    return 0;
  }
  FUZZ_CHECK(!m->groups.empty(), "no group");
  for (const auto& p : m->params) {
    FUZZ_CHECK(valid_name(p.name), "parameter name '%s'", p.name.c_str());
    FUZZ_CHECK(p.numel <= UINT64_MAX / 4, "numel %llu", static_cast<unsigned long long>(p.numel));
    FUZZ_CHECK(p.group >= 0 && static_cast<size_t>(p.group) < m->groups.size(), "group %d",
               p.group);
    FUZZ_CHECK(p.step >= 0 && p.durable_step >= 0, "steps");
    FUZZ_CHECK(p.placement == optimizer::Placement::kHost ||
                   p.placement == optimizer::Placement::kNvme,
               "placement");
  }
  const std::string formatted = format_meta(*m);
  auto again = parse_meta(formatted, "opt/meta");
  FUZZ_CHECK(again.ok(), "the formatted record does not parse: %s\n%s",
             again.status().to_string().c_str(), formatted.c_str());
  FUZZ_CHECK(format_meta(*again) == formatted, "formatting is not stable:\n%s", formatted.c_str());
  return 0;
}
