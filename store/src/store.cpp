// strata::store — the public free functions of store.hpp, Store::open and list_store.
// The store itself is StoreImpl (store_impl.hpp).
#include <algorithm>

#include "store_damage.hpp"
#include "store_impl.hpp"
#include "store_paths.hpp"
#include "strata/base/env.hpp"
#include "io_common.hpp"
#include "strata/store/config.hpp"
#include "strata/store/store.hpp"

namespace strata {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "unknown";
}

std::optional<Tier> tier_from_name(std::string_view s) {
  if (s == "device" || s == "gpu" || s == "hbm") return Tier::kDevice;
  if (s == "host" || s == "dram" || s == "cpu") return Tier::kHost;
  if (s == "nvme" || s == "disk") return Tier::kNvme;
  return std::nullopt;
}

uint64_t TensorDesc::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d < 0 ? 0 : d);
  return n;
}

std::string to_string(const TensorDesc& d) {
  std::string s(dtype_name(d.dtype));
  s += '[';
  for (size_t i = 0; i < d.shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d.shape[i]);
  }
  return s + ']';
}

Result<StoreOptions> StoreOptions::from_env() { return from_config(""); }

Result<StoreOptions> StoreOptions::from_config(const std::string& config_file) {
  StoreOptions o;
  STRATA_ASSIGN_OR_RETURN(auto cfg, load_config_to_use(config_file));
  if (cfg) cfg->apply(o);
  STRATA_ASSIGN_OR_RETURN(o.host_budget_bytes, env_size("STRATA_HOST_BUDGET", o.host_budget_bytes));
  STRATA_ASSIGN_OR_RETURN(o.nvme_budget_bytes, env_size("STRATA_NVME_BUDGET", o.nvme_budget_bytes));
  STRATA_ASSIGN_OR_RETURN(o.device_budget_bytes,
                          env_size("STRATA_DEVICE_BUDGET", o.device_budget_bytes));
  STRATA_ASSIGN_OR_RETURN(o.chunk_bytes, env_size("STRATA_CHUNK_SIZE", o.chunk_bytes));
  STRATA_ASSIGN_OR_RETURN(o.staging_bytes, env_size("STRATA_STAGING_BYTES", o.staging_bytes));
  STRATA_ASSIGN_OR_RETURN(o.pinned_initial_bytes,
                          env_size("STRATA_PINNED_INITIAL", o.pinned_initial_bytes));
  STRATA_ASSIGN_OR_RETURN(o.pinned_grow_bytes, env_size("STRATA_PINNED_GROW", o.pinned_grow_bytes));
  STRATA_ASSIGN_OR_RETURN(o.verify_checksums, env_bool("STRATA_VERIFY", o.verify_checksums));
  STRATA_RETURN_IF_ERROR(io::apply_env(o.engine_options));
  STRATA_ASSIGN_OR_RETURN(o.stats_interval, env_seconds("STRATA_STATS_INTERVAL", o.stats_interval));
  return o;
}

Result<std::unique_ptr<Store>> Store::open(StoreOptions options) {
  auto s = std::make_unique<store_detail::StoreImpl>();
  Status st = s->init(std::move(options));
  if (!st.ok()) return st;
  return std::unique_ptr<Store>(std::move(s));
}

Result<std::vector<ObjectInfo>> list_store(const std::string& path, std::string_view prefix) {
  STRATA_RETURN_IF_ERROR(store_detail::check_path("store path", path));
  STRATA_ASSIGN_OR_RETURN(auto cat, catalog::Catalog::open(path + "/catalog.db", false, true));
  STRATA_ASSIGN_OR_RETURN(auto rows, cat->load_all(std::string(prefix)));
  STRATA_ASSIGN_OR_RETURN(auto cb, cat->get_meta("chunk_bytes"));
  STRATA_ASSIGN_OR_RETURN(auto nd, cat->get_meta("nvme_dirs"));
  const std::string cat_path = path + "/catalog.db";
  if (!cb) return data_loss("catalog " + cat_path + " lacks chunk_bytes");
  STRATA_ASSIGN_OR_RETURN(const uint64_t chunk, store_detail::parse_chunk_bytes(*cb, cat_path));
  const size_t ndirs = nd ? static_cast<size_t>(std::count(nd->begin(), nd->end(), '\n')) : 0;
  std::vector<ObjectInfo> out;
  for (auto& r : rows) {
    ObjectInfo i;
    i.key = r.key;
    i.dtype = r.dtype;
    i.shape = r.shape;
    i.nbytes = r.nbytes;
    i.tier = Tier::kNvme;
    i.on_nvme = true;
    i.num_chunks = static_cast<uint32_t>(r.chunks.size());
    i.damage = store_detail::row_damage(r, ndirs, chunk);
    out.push_back(std::move(i));
  }
  return out;
}

}  // namespace strata
