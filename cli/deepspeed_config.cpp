// DeepSpeed configuration -> strata configuration file (see deepspeed_config.hpp).
#include "deepspeed_config.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "strata/base/units.hpp"

namespace strata::cli {

namespace {

using Json = nlohmann::ordered_json;
using Outcome = DeepSpeedKey::Outcome;

/// The most pinned memory a converted sub_group_size may imply (4 slots x 48 bytes per
/// element): above it the key is reported, not written.
constexpr uint64_t kMaxSubGroupPinned = 4ull << 30;

const char kAutoKept[] = "strata's default kept (Hugging Face's Trainer fills \"auto\" in)";

const char kStage3Keys[] =
    "strata's parameter offload prefetches along the order recorded in the previous "
    "iteration, as far ahead as its working set allows";

/// Collects the report and the strata keys while walking the DeepSpeed file.
class Converter {
 public:
  Converter(std::string file, Config base) : file_(std::move(file)) { out_.config = std::move(base); }

  Status error(const std::string& key, const std::string& why) const {
    return invalid_argument("deepspeed config '" + file_ + "': " + key + ": " + why);
  }

  void add(std::string key, const Json& v, Outcome o, std::string why,
           std::string strata_key = {}, Json strata_value = nullptr) {
    out_.keys.push_back({std::move(key), v, o, std::move(strata_key), std::move(strata_value),
                         std::move(why)});
  }

  /// Sets strata key "section.name" = `v` (JSON as strata's file spells it), checked by
  /// strata's own parser; the error names the DeepSpeed key and quotes strata's message.
  Status set(const std::string& ds_key, const Json& ds_value, const std::string& section,
             const std::string& name, const Json& v, std::string note = {}) {
    Json doc = {{"strata_config", Config::kVersion}, {section, {{name, v}}}};
    auto parsed = Config::parse(doc.dump(), "");
    if (!parsed.ok()) {
      std::string msg = parsed.status().message();
      const std::string prefix = "config file '<memory>': ";
      if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
      return invalid_argument("deepspeed config '" + file_ + "': " + ds_key + " = " +
                              ds_value.dump() + ": " + msg);
    }
    merge(*parsed);
    add(ds_key, ds_value, Outcome::kSet, std::move(note), section + "." + name, v);
    return Status::OK();
  }

  DeepSpeedImport take() { return std::move(out_); }

  const std::string& file() const { return file_; }
  Config& config() { return out_.config; }

 private:
  /// Copies the fields `p` sets into the result (p holds one key).
  void merge(const Config& p) {
    auto& c = out_.config;
    auto take = [](auto& dst, const auto& src) {
      if (src) dst = src;
    };
    take(c.io.block_size, p.io.block_size);
    take(c.io.queue_depth, p.io.queue_depth);
    take(c.io.workers, p.io.workers);
    take(c.io.submit_batch, p.io.submit_batch);
    take(c.store.nvme_dirs, p.store.nvme_dirs);
    take(c.store.host_budget_bytes, p.store.host_budget_bytes);
    take(c.optimizer.sub_group_numel, p.optimizer.sub_group_numel);
    take(c.optimizer.default_placement, p.optimizer.default_placement);
    take(c.optimizer.num_buffers, p.optimizer.num_buffers);
  }

  std::string file_;
  DeepSpeedImport out_;
};

bool is_auto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

/// An integer written as DeepSpeed users write them (262144, 1e8, 1e9): a non-negative
/// JSON number without a fraction.
Result<uint64_t> read_count(const Converter& c, const std::string& key, const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    return c.error(key, "expected a non-negative integer, got " + v.dump());
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d >= 0 && d <= 1.8e19 && std::floor(d) == d) {
      return static_cast<uint64_t>(d);
    }
  }
  return c.error(key, "expected a non-negative integer, got " + v.dump());
}

Result<bool> read_bool(const Converter& c, const std::string& key, const Json& v) {
  if (!v.is_boolean()) return c.error(key, "expected true or false, got " + v.dump());
  return v.get<bool>();
}

Result<std::string> read_string(const Converter& c, const std::string& key, const Json& v) {
  if (!v.is_string()) return c.error(key, "expected a string, got " + v.dump());
  return v.get<std::string>();
}

Status need_object(const Converter& c, const std::string& key, const Json& v) {
  if (!v.is_object()) return c.error(key, "expected an object, got " + v.dump());
  return Status::OK();
}

/// "aio" (top level; DeepSpeed reads it there, get_aio_config(param_dict)).
Status convert_aio(Converter& c, const std::string& where, const Json& aio) {
  STRATA_RETURN_IF_ERROR(need_object(c, where, aio));
  for (const auto& [name, v] : aio.items()) {
    const std::string key = where + "." + name;
    if (is_auto(v)) {
      c.add(key, v, Outcome::kKept, kAutoKept);
    } else if (name == "block_size") {
      STRATA_ASSIGN_OR_RETURN(uint64_t n, read_count(c, key, v));
      STRATA_RETURN_IF_ERROR(c.set(key, v, "io", "block_size", n,
                                   "largest transfer handed to the kernel, as DeepSpeed's"));
    } else if (name == "queue_depth") {
      STRATA_ASSIGN_OR_RETURN(uint64_t n, read_count(c, key, v));
      STRATA_RETURN_IF_ERROR(c.set(key, v, "io", "queue_depth", n,
                                   "requests in flight per I/O worker, as DeepSpeed's per handle"));
    } else if (name == "intra_op_parallelism") {
      STRATA_ASSIGN_OR_RETURN(uint64_t n, read_count(c, key, v));
      STRATA_RETURN_IF_ERROR(c.set(key, v, "io", "workers", n,
                                   "I/O threads, each with its own io_uring ring"));
    } else if (name == "thread_count") {
      c.add(key, v, Outcome::kNotHonoured,
            "DeepSpeed itself has ignored it since its PR 7056 (intra_op_parallelism took its "
            "place); strata's I/O threads are io.workers, which `strata tune` measures");
    } else if (name == "single_submit") {
      STRATA_ASSIGN_OR_RETURN(bool b, read_bool(c, key, v));
      STRATA_RETURN_IF_ERROR(c.set(key, v, "io", "submit_batch", b ? 1 : 0,
                                   b ? "one request per io_uring_submit, as DeepSpeed's one "
                                       "iocb per io_submit"
                                     : "requests submitted in batches (0 = automatic)"));
    } else if (name == "overlap_events") {
      STRATA_ASSIGN_OR_RETURN(bool b, read_bool(c, key, v));
      if (b) {
        c.add(key, v, Outcome::kKept,
              "strata always overlaps submission with completion (its ring thread reaps "
              "while requests are in flight): no setting");
      } else {
        c.add(key, v, Outcome::kNotHonoured,
              "strata has no mode that waits for a whole batch to complete before "
              "submitting more; it always overlaps submission with completion");
      }
    } else if (name == "use_gds") {
      STRATA_ASSIGN_OR_RETURN(bool b, read_bool(c, key, v));
      if (b) {
        c.add(key, v, Outcome::kNotHonoured,
              "strata has no GPUDirect Storage path: device-tier data moves through "
              "pinned host buffers");
      } else {
        c.add(key, v, Outcome::kKept, "no GPUDirect Storage: what strata does");
      }
    } else {
      c.add(key, v, Outcome::kNotHonoured, "not an aio key of DeepSpeed's aio_config.py");
    }
  }
  return Status::OK();
}

/// offload_optimizer.nvme_path / offload_param.nvme_path: the store's data directory;
/// `dirs` collects the distinct paths in the order met.
Status convert_nvme_path(Converter& c, const std::string& key, const Json& v,
                         std::vector<std::string>& dirs) {
  STRATA_ASSIGN_OR_RETURN(std::string p, read_string(c, key, v));
  if (p.empty()) return c.error(key, "empty path");
  if (std::find(dirs.begin(), dirs.end(), p) == dirs.end()) dirs.push_back(p);
  c.add(key, v, Outcome::kSet, "the store's data directory", "store.nvme_dirs", p);
  return Status::OK();
}

Status convert_offload_optimizer(Converter& c, const std::string& where, const Json& o,
                                 std::vector<std::string>& dirs) {
  STRATA_RETURN_IF_ERROR(need_object(c, where, o));
  for (const auto& [name, v] : o.items()) {
    const std::string key = where + "." + name;
    if (is_auto(v)) {
      c.add(key, v, Outcome::kKept, kAutoKept);
    } else if (name == "device") {
      STRATA_ASSIGN_OR_RETURN(std::string d, read_string(c, key, v));
      if (d == "nvme" || d == "cpu") {
        STRATA_RETURN_IF_ERROR(c.set(key, v, "optimizer", "default_placement",
                                     d == "nvme" ? "nvme" : "host",
                                     d == "nvme" ? "masters and moments in the NVMe tier"
                                                 : "masters and moments in host memory"));
      } else if (d == "none") {
        c.add(key, v, Outcome::kNotHonoured,
              "strata's optimizers keep their state in the store (host or NVMe tier), never on "
              "the GPU: use torch.optim for state in GPU memory");
      } else {
        return c.error(key, "expected \"cpu\", \"nvme\" or \"none\", got " + v.dump());
      }
    } else if (name == "nvme_path") {
      STRATA_RETURN_IF_ERROR(convert_nvme_path(c, key, v, dirs));
    } else if (name == "pin_memory") {
      STRATA_ASSIGN_OR_RETURN(bool b, read_bool(c, key, v));
      c.add(key, v, b ? Outcome::kKept : Outcome::kNotHonoured,
            b ? "strata's pipeline buffers are always pinned"
              : "strata's pipeline buffers are always pinned (a few sub-groups' worth, "
                "optimizer.pinned_budget_bytes caps them)");
    } else if (name == "buffer_count") {
      c.add(key, v, Outcome::kNotHonoured,
            "DeepSpeed counts one buffer per tensor of a sub-group (Adam: parameter, gradient, "
            "two moments); one strata slot holds all of a sub-group's tensors, and "
            "optimizer.num_buffers (default 4; 3 overlap read, update and write fully) keeps "
            "its default");
    } else if (name == "pipeline" || name == "pipeline_read" || name == "pipeline_write") {
      STRATA_ASSIGN_OR_RETURN(bool b, read_bool(c, key, v));
      c.add(key, v, b ? Outcome::kKept : Outcome::kNotHonoured,
            "strata always overlaps the reads of the next sub-group and the writes of the "
            "previous one with the update");
    } else if (name == "fast_init") {
      c.add(key, v, Outcome::kKept,
            "strata makes zero-filled state objects from one repeated buffer: no setting");
    } else if (name == "ratio") {
      if (!v.is_number()) return c.error(key, "expected a number in 0..1, got " + v.dump());
      const double r = v.get<double>();
      if (r < 0.0 || r > 1.0) return c.error(key, "expected a number in 0..1, got " + v.dump());
      c.add(key, v, r == 1.0 ? Outcome::kKept : Outcome::kNotHonoured,
            "strata steps all of the optimizer state on the CPU (no part on the GPU)");
    } else {
      c.add(key, v, Outcome::kNotHonoured,
            "not a key of DeepSpeed's offload_optimizer (offload_config.py)");
    }
  }
  return Status::OK();
}

Status convert_offload_param(Converter& c, const std::string& where, const Json& o,
                             std::vector<std::string>& dirs) {
  STRATA_RETURN_IF_ERROR(need_object(c, where, o));
  uint64_t buffer_count = 5, buffer_size = 100000000;  // DeepSpeed's defaults
  bool sized = false;
  for (const auto& [name, v] : o.items()) {
    const std::string key = where + "." + name;
    if (is_auto(v)) {
      c.add(key, v, Outcome::kKept, kAutoKept);
    } else if (name == "device") {
      STRATA_ASSIGN_OR_RETURN(std::string d, read_string(c, key, v));
      if (d == "nvme" || d == "cpu") {
        c.add(key, v, Outcome::kInCode,
              std::string("strata.torch.offload_parameters(model, store, tier=\"") +
                  (d == "nvme" ? "nvme" : "host") + "\") (or offload_init(...)): parameter "
                  "offload is chosen in the training code, not in the file");
      } else if (d == "none") {
        c.add(key, v, Outcome::kKept, "no parameter offload: the model's parameters stay put");
      } else {
        return c.error(key, "expected \"cpu\", \"nvme\" or \"none\", got " + v.dump());
      }
    } else if (name == "nvme_path") {
      STRATA_RETURN_IF_ERROR(convert_nvme_path(c, key, v, dirs));
    } else if (name == "buffer_count" || name == "buffer_size") {
      STRATA_ASSIGN_OR_RETURN(uint64_t n, read_count(c, key, v));
      (name == "buffer_count" ? buffer_count : buffer_size) = n;
      sized = true;
      c.add(key, v, Outcome::kInCode,
            "DeepSpeed's parameter buffers (buffer_count x buffer_size elements) play the role "
            "of strata's working_set= (bytes), an argument of offload_parameters: see below");
    } else if (name == "max_in_cpu") {
      c.add(key, v, Outcome::kNotHonoured,
            "strata keeps no second host cache of offloaded parameters beyond the working "
            "set; tier=\"host\" keeps all of them in host memory");
    } else if (name == "pin_memory") {
      c.add(key, v, Outcome::kKept,
            "strata's working set is ordinary memory the fetches fill directly (O_DIRECT "
            "reads into it): no setting");
    } else {
      c.add(key, v, Outcome::kNotHonoured,
            "not a key of DeepSpeed's offload_param (offload_config.py)");
    }
  }
  if (sized) {
    // DeepSpeed's buffers hold fp16/bf16 parameters (2 bytes per element).
    const uint64_t bytes = buffer_count * buffer_size * 2;
    c.add(where + ".buffer_count*buffer_size", Json(buffer_count * buffer_size),
          Outcome::kInCode,
          "offload_parameters(..., working_set=" + std::to_string(bytes) +
              ") for fp16/bf16 parameters (2 bytes per element; 4 for fp32)");
  }
  return Status::OK();
}

Status convert_zero(Converter& c, const Json& z) {
  const std::string where = "zero_optimization";
  STRATA_RETURN_IF_ERROR(need_object(c, where, z));
  std::vector<std::string> dirs;
  for (const auto& [name, v] : z.items()) {
    const std::string key = where + "." + name;
    if (name == "offload_optimizer") {
      STRATA_RETURN_IF_ERROR(convert_offload_optimizer(c, key, v, dirs));
    } else if (name == "offload_param") {
      STRATA_RETURN_IF_ERROR(convert_offload_param(c, key, v, dirs));
    } else if (name == "aio") {
      // Some guides (e.g. translations of Hugging Face's) nest aio here; DeepSpeed reads
      // it at the top level. Taken from here too, and said so.
      c.add(key, v, Outcome::kKept,
            "DeepSpeed reads \"aio\" at the top level of the file; strata takes it from here "
            "too (its keys below)");
      STRATA_RETURN_IF_ERROR(convert_aio(c, key, v));
    } else if (is_auto(v)) {
      c.add(key, v, Outcome::kKept, kAutoKept);
    } else if (name == "sub_group_size") {
      STRATA_ASSIGN_OR_RETURN(uint64_t n, read_count(c, key, v));
      // DeepSpeed sizes its swap buffers by the largest sub-group it actually forms (at most
      // the rank's partition); strata's pipeline slots are sub_group_numel elements each,
      // allocated pinned at create: 4 slots x 3 fp32 streams (Adam) x 4 bytes per element.
      const uint64_t pinned = n * 48;
      if (pinned > kMaxSubGroupPinned) {
        c.add(key, v, Outcome::kNotHonoured,
              "strata's 4 pipeline slots would pin " + format_bytes(pinned) +
                  " (48 bytes per element for Adam) where DeepSpeed sizes its buffers by the "
                  "sub-groups it actually forms; strata's automatic size (1 to 4 store chunks) "
                  "kept; set optimizer.sub_group_numel yourself below " +
                  std::to_string(kMaxSubGroupPinned / 48) + " to choose one");
      } else {
        STRATA_RETURN_IF_ERROR(c.set(
            key, v, "optimizer", "sub_group_numel", n,
            "elements per pipeline sub-group: 4 slots pin " + format_bytes(pinned) +
                " for Adam (48 bytes per element)"));
      }
    } else if (name == "stage") {
      c.add(key, v, Outcome::kInCode,
            "strata's partitioning over ranks is comm= of offload_parameters (ZeRO-3: each rank "
            "stores its slice and all-gathers) and of the optimizers");
    } else if (name == "stage3_prefetch_bucket_size" || name == "stage3_max_live_parameters" ||
               name == "stage3_max_reuse_distance") {
      c.add(key, v, Outcome::kNotHonoured,
            std::string(kStage3Keys) + " (working_set=): there is no bucket, live-parameter "
            "count or reuse distance to set");
    } else if (name == "stage3_param_persistence_threshold") {
      c.add(key, v, Outcome::kNotHonoured,
            "strata offloads every parameter; none is kept resident by size");
    } else if (name == "stage3_gather_16bit_weights_on_model_save" ||
               name == "gather_16bit_weights_on_model_save") {
      c.add(key, v, Outcome::kKept,
            "model.state_dict() of an offloaded model gives whole tensors on every rank");
    } else {
      c.add(key, v, Outcome::kNotRead,
            "not an offload key (gradient bucketing and communication belong to the "
            "training framework)");
    }
  }
  if (!dirs.empty()) {
    if (dirs.size() > 1) {
      // Both paths become the store's drives: its chunks are striped over them.
      Json doc = {{"strata_config", Config::kVersion}, {"store", {{"nvme_dirs", dirs}}}};
      auto parsed = Config::parse(doc.dump(), "");
      if (!parsed.ok()) return c.error(where + ".*.nvme_path", parsed.status().message());
      c.config().store.nvme_dirs = parsed->store.nvme_dirs;
      c.add(where + ".*.nvme_path", Json(dirs), Outcome::kSet,
            "two paths: one store striped over both (strata keeps parameters and optimizer "
            "state in one store)",
            "store.nvme_dirs", Json(dirs));
    } else {
      c.config().store.nvme_dirs = dirs;
    }
  }
  return Status::OK();
}

}  // namespace

const char* outcome_name(DeepSpeedKey::Outcome o) {
  switch (o) {
    case Outcome::kSet: return "set";
    case Outcome::kKept: return "kept";
    case Outcome::kInCode: return "in code";
    case Outcome::kNotHonoured: return "not honoured";
    case Outcome::kNotRead: return "not read";
  }
  return "?";
}

Result<DeepSpeedImport> import_deepspeed_config(const Json& ds, const std::string& file,
                                                Config base) {
  Converter c(file, std::move(base));
  if (!ds.is_object()) return c.error("(top level)", "expected an object, got " + ds.dump());
  for (const auto& [name, v] : ds.items()) {
    if (name == "zero_optimization") {
      STRATA_RETURN_IF_ERROR(convert_zero(c, v));
    } else if (name == "aio") {
      STRATA_RETURN_IF_ERROR(convert_aio(c, "aio", v));
    } else {
      c.add(name, v, Outcome::kNotRead,
            "not an offload or aio key (training settings belong in the training code)");
    }
  }
  return c.take();
}

}  // namespace strata::cli
