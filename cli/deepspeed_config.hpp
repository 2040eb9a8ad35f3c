// `strata config from-deepspeed`: reads the offload and aio keys of a DeepSpeed JSON
// configuration and says, key by key, what strata's configuration file (store/config.hpp)
// takes from it, what belongs in the training code instead, and what strata cannot honour
// and why. The DeepSpeed keys and defaults are those of deepspeed/runtime/zero/
// offload_config.py (offload_param, offload_optimizer), deepspeed/runtime/swap_tensor/
// aio_config.py (aio) and the ZeRO stage-3 keys of deepspeed/runtime/zero/config.py.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/store/config.hpp"

namespace strata::cli {

/// What became of one DeepSpeed key.
struct DeepSpeedKey {
  enum class Outcome {
    kSet,          ///< written to strata's file as `strata_key` = `strata_value`
    kKept,         ///< "auto" or the value strata already has by design: nothing to write
    kInCode,       ///< no file key: the argument of strata's Python API that plays its role
    kNotHonoured,  ///< strata has no equivalent or refuses the value; `why` says which
    kNotRead,      ///< not an offload or aio key (training settings): ignored
  };
  std::string key;             ///< DeepSpeed key path, e.g. "zero_optimization.sub_group_size"
  nlohmann::ordered_json value;        ///< its value in the DeepSpeed file
  Outcome outcome = Outcome::kNotRead;
  std::string strata_key;      ///< kSet: e.g. "io.queue_depth"
  nlohmann::ordered_json strata_value; ///< kSet: the value written
  std::string why;             ///< the reason (every outcome but kSet; kSet: a note or "")
};

/// The name of `o` as the report prints it: "set", "kept", "in code", "not honoured",
/// "not read".
const char* outcome_name(DeepSpeedKey::Outcome o);

/// The conversion of one DeepSpeed configuration.
struct DeepSpeedImport {
  Config config;                    ///< `base` with the kSet keys applied
  std::vector<DeepSpeedKey> keys;   ///< every key of the input, in file order
};

/// Converts DeepSpeed configuration `ds` (the parsed JSON of file `file`, named in errors)
/// into the keys of strata's configuration file, applied over `base` (an existing file's
/// settings, or an empty Config). Numbers may be written as DeepSpeed users write them
/// (1e8, 262144.0) but must be integers where an integer is meant; "auto" (Hugging Face's
/// placeholder, filled in by its Trainer) keeps strata's default.
/// \returns the config and one DeepSpeedKey per key of `ds` (nested offload/aio keys one by
///     one, every other key of a section as one entry).
/// \error InvalidArgument "deepspeed config '<file>': <key>: <why>" for a top level or
///     section that is not an object, a value of the wrong type (a string for
///     aio.queue_depth, a fraction for an integer), or a value strata's file refuses (its
///     message quoted: "aio.queue_depth = 0: io.queue_depth: expected an integer in
///     1..4096, got 0").
/// \threadsafety pure function of its arguments.
Result<DeepSpeedImport> import_deepspeed_config(const nlohmann::ordered_json& ds,
                                                const std::string& file, Config base);

}  // namespace strata::cli
