// Internal: the offloaded optimizer's checkpoint record (the text object under
// key_prefix + "meta"; format in offload_checkpoint.cpp), decoded and encoded without a
// store.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/optimizer/offload.hpp"

namespace strata::optimizer::offload_detail {

/// A decoded checkpoint record.
struct MetaRecord {
  std::string rule;
  int num_states = 0;
  /// Element type of the state objects: kFloat32 (version 1 records) or kBFloat16
  /// (version 2, "state_dtype bf16").
  DType state_dtype = DType::kFloat32;
  std::vector<Hyperparams> groups;
  struct P {
    std::string name;
    uint64_t numel = 0;  ///< fp32 elements; numel * 4 fits in 64 bits
    Placement placement = Placement::kNvme;
    int group = 0;
    int64_t step = 0, durable_step = 0;
  };
  std::vector<P> params;
};

/// Text of `m` (version 1; version 2 when m.state_dtype is kBFloat16). Pure function; thread-safe.
std::string format_meta(const MetaRecord& m);

/// Decodes `text`, the record stored under `key`. Pure function; thread-safe.
/// \error DataLoss "offload: checkpoint record '<key>' is malformed: <what>" for anything
///     format_meta() does not write: bad magic or version, missing lines, more than
///     1,000,000 groups, a hyperparameter without '=' or with a value strtod does not read
///     whole, a parameter or rule name that is not printable ASCII without whitespace, a
///     negative or oversized (numel * 4 overflows) element count, a tier other than
///     host/nvme, a group out of range, a negative step, no end marker.
Result<MetaRecord> parse_meta(const std::string& text, const std::string& key);

}  // namespace strata::optimizer::offload_detail
