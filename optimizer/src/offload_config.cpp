// strata::optimizer — the configuration file's "optimizer" section applied to OffloadOptions
// (offload.hpp; the section is parsed and checked by the store layer, config.hpp).
#include "strata/optimizer/offload.hpp"
#include "strata/store/config.hpp"

namespace strata::optimizer {

OffloadOptions offload_options_from_config(const Config& config, OffloadOptions o) {
  const OptimizerConfig& c = config.optimizer;
  if (c.sub_group_numel) o.sub_group_numel = *c.sub_group_numel;
  if (c.num_buffers) o.num_buffers = *c.num_buffers;
  if (c.pinned_budget_bytes) o.pinned_budget_bytes = *c.pinned_budget_bytes;
  if (c.host_budget_bytes) o.host_budget_bytes = *c.host_budget_bytes;
  if (c.num_threads) o.num_threads = *c.num_threads;
  if (c.numa_node) o.numa_node = *c.numa_node;
  if (c.default_placement) {
    const std::string& p = *c.default_placement;  // checked at load: auto | host | nvme
    o.default_placement = p == "host" ? Placement::kHost
                          : p == "nvme" ? Placement::kNvme
                                        : Placement::kAuto;
  }
  if (c.verify_on_open) o.verify_on_open = *c.verify_on_open;
  if (c.state_dtype) {  // checked at load: fp32 | bf16
    o.state_dtype = *c.state_dtype == "bf16" ? DType::kBFloat16 : DType::kFloat32;
  }
  return o;
}

}  // namespace strata::optimizer
