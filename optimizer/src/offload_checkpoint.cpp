// The offloaded optimizer's checkpoint (see offload.hpp, CHECKPOINT CONTRACT): the text
// record under key_prefix + "meta", checkpoint(), close(), and the restore of open().
//
// Record (version 1; version 2 = version 1 with bf16 state objects, see
// OffloadOptions::state_dtype), one item per line, doubles in C99 hex (%a) so they round-trip:
//   strata-offload-meta 1|2
//   rule <name> <num_states>
//   state_dtype bf16      (version 2 only)
//   groups <n>            then n lines: group <count> <key>=<value> ...
//   params <n>            then n lines: param <name> <numel> host|nvme <group> <step>
//                                       <durable_step>
//   end
// The record is written only by checkpoint(), so both step fields are the step of the
// checkpoint; open() restores <durable_step> (records of earlier versions, refreshed
// after every step, held a host-tier tensor's last step in <step>).
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "offload_impl.hpp"
#include "offload_record.hpp"
#include "strata/base/logging.hpp"

namespace strata::optimizer {

using namespace offload_detail;

namespace {

constexpr const char* kMetaMagic = "strata-offload-meta";
constexpr int kMetaVersion = 1;

std::string hexdouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

/// The built-in factory of `rule`, the rule recorded in checkpoint record `key`, for an
/// open() given no factory.
/// \error InvalidArgument naming the record and the rule when `rule` is not built in: the
///     checkpoint was written with a custom rule, whose factory open() must be given.
Result<RuleFactory> recorded_rule_factory(const std::string& rule, const std::string& key) {
  auto f = builtin_rule_factory(rule);
  if (f.ok()) return f;
  return invalid_argument("checkpoint '" + key + "' was written with the custom rule '" + rule +
                          "': pass its RuleFactory to OffloadedOptimizer::open() (the built-in "
                          "rules, which open() finds by name, are adam, adamw, adagrad, sgd, "
                          "lion)");
}

/// The record under `key` in `store`; an empty `factory` becomes the builtin one of the
/// recorded rule.
Result<MetaRecord> read_meta(Store& store, const std::string& key, RuleFactory& factory) {
  STRATA_ASSIGN_OR_RETURN(ObjectInfo info, store.stat(key));
  std::string text(info.nbytes, '\0');
  STRATA_RETURN_IF_ERROR(store.get_bytes(key, text.data(), text.size()));
  STRATA_ASSIGN_OR_RETURN(MetaRecord m, parse_meta(text, key));
  if (!factory) {
    STRATA_ASSIGN_OR_RETURN(factory, recorded_rule_factory(m.rule, key));
  }
  return m;
}

}  // namespace

std::string offload_detail::format_meta(const MetaRecord& m) {
  std::ostringstream o;
  // fp32 states: version 1, byte for byte as before; bf16 states: version 2, whose
  // "state_dtype" line a version-1 reader refuses ("unsupported version 2").
  const bool bf16 = m.state_dtype == DType::kBFloat16;
  o << kMetaMagic << ' ' << (bf16 ? 2 : kMetaVersion) << '\n';
  o << "rule " << m.rule << ' ' << m.num_states << '\n';
  if (bf16) o << "state_dtype bf16\n";
  o << "groups " << m.groups.size() << '\n';
  for (const auto& g : m.groups) {
    o << "group " << g.size();
    for (const auto& [k, v] : g) o << ' ' << k << '=' << hexdouble(v);
    o << '\n';
  }
  o << "params " << m.params.size() << '\n';
  for (const auto& p : m.params) {
    const bool host = p.placement == Placement::kHost;
    o << "param " << p.name << ' ' << p.numel << ' ' << (host ? "host" : "nvme") << ' '
      << p.group << ' ' << p.step << ' ' << p.durable_step << '\n';
  }
  o << "end\n";
  return o.str();
}

namespace {
/// Reads a decimal count: digits only (istream's operator>> into an unsigned type takes
/// "-1" as 2^64 - 1, and "-18446744073709551615" as 1).
bool read_count(std::istream& in, uint64_t* v) {
  std::string t;
  if (!(in >> t)) return false;
  auto [end, err] = std::from_chars(t.data(), t.data() + t.size(), *v);
  return err == std::errc() && end == t.data() + t.size();
}
}  // namespace

Result<MetaRecord> offload_detail::parse_meta(const std::string& text, const std::string& key) {
  auto bad = [&](const std::string& what) {
    return data_loss("offload: checkpoint record '" + key + "' is malformed: " + what);
  };
  std::istringstream in(text);
  std::string word;
  int version = 0;
  MetaRecord m;
  if (!(in >> word >> version) || word != kMetaMagic) return bad("bad magic");
  if (version != kMetaVersion && version != 2) {
    return bad("unsupported version " + std::to_string(version));
  }
  if (!(in >> word >> m.rule >> m.num_states) || word != "rule") return bad("no rule line");
  if (version == 2) {
    std::string dt;
    if (!(in >> word >> dt) || word != "state_dtype" || dt != "bf16") {
      return bad("state_dtype line (expected 'state_dtype bf16')");
    }
    m.state_dtype = DType::kBFloat16;
  }
  uint64_t ng = 0;
  if (!(in >> word) || word != "groups" || !read_count(in, &ng) || ng == 0 || ng > 1000000) {
    return bad("groups");
  }
  for (size_t g = 0; g < ng; ++g) {
    uint64_t nk = 0;
    if (!(in >> word) || word != "group" || !read_count(in, &nk)) {
      return bad("group " + std::to_string(g));
    }
    Hyperparams hp;
    for (size_t k = 0; k < nk; ++k) {
      std::string kv;
      if (!(in >> kv)) return bad("group " + std::to_string(g) + " values");
      auto eq = kv.find('=');
      if (eq == std::string::npos) return bad("hyperparameter '" + kv + "'");
      char* end = nullptr;
      std::string val = kv.substr(eq + 1);
      double v = std::strtod(val.c_str(), &end);
      if (end == val.c_str() || *end != '\0') return bad("hyperparameter value '" + kv + "'");
      hp[kv.substr(0, eq)] = v;
    }
    m.groups.push_back(std::move(hp));
  }
  uint64_t np = 0;
  if (!(in >> word) || word != "params" || !read_count(in, &np)) return bad("params");
  for (size_t i = 0; i < np; ++i) {
    MetaRecord::P p;
    std::string tier;
    if (!(in >> word >> p.name) || word != "param" || !read_count(in, &p.numel) ||
        !(in >> tier >> p.group >> p.step >> p.durable_step)) {
      return bad("param line " + std::to_string(i));
    }
    // The name becomes part of object keys; numel * 4 bytes are read and allocated.
    if (!valid_name(p.name)) return bad("parameter name '" + p.name + "'");
    if (p.numel > UINT64_MAX / 4) return bad("param '" + p.name + "' numel " + std::to_string(p.numel));
    if (tier == "host") {
      p.placement = Placement::kHost;
    } else if (tier == "nvme") {
      p.placement = Placement::kNvme;
    } else {
      return bad("tier '" + tier + "'");
    }
    if (p.group < 0 || static_cast<size_t>(p.group) >= ng || p.step < 0 || p.durable_step < 0) {
      return bad("param '" + p.name + "' fields");
    }
    m.params.push_back(std::move(p));
  }
  if (!(in >> word) || word != "end") return bad("no end marker");
  return m;
}


std::string OffloadedOptimizer::Impl::serialize_meta() const {
  MetaRecord m;
  m.rule = rule_name;
  m.num_states = num_states;
  m.state_dtype = opts.state_dtype;
  for (const auto& g : groups) m.groups.push_back(g.hp);
  for (const auto& t : tensors) {
    const int64_t step = t.state.step();
    m.params.push_back({t.name, t.numel, t.placement, t.group, step, step});
  }
  return format_meta(m);
}

Status OffloadedOptimizer::Impl::put_meta() {
  std::string text = serialize_meta();
  PutOptions po;
  po.tier = Tier::kHost;
  po.overwrite = true;
  po.pin = true;
  return store
      ->put_async(meta_key(), text.data(), TensorDesc::bytes(text.size()), po)
      .result()
      .status()
      .with_context("offload: writing the checkpoint record");
}

std::vector<std::string> OffloadedOptimizer::Impl::all_keys() const {
  std::vector<std::string> keys{meta_key()};
  for (const auto& t : tensors) keys.insert(keys.end(), t.keys.begin(), t.keys.end());
  return keys;
}

Status OffloadedOptimizer::Impl::check_open(const char* what) const {
  if (closed) return failed_precondition(std::string(what) + ": the optimizer is closed");
  return Status::OK();
}

Status OffloadedOptimizer::Impl::checkpoint() {
  STRATA_RETURN_IF_ERROR(check_open("offload checkpoint"));
  if (!broken.ok()) {
    return failed_precondition(
        "offload checkpoint: a step failed after it may have changed some tensors (" +
        broken.to_string() + "), so the state since the last checkpoint cannot be saved; "
        "open the store again and resume (OffloadedOptimizer::open) to continue from the "
        "last checkpoint");
  }
  // Every object of the optimizer is held (Store::hold): nothing of what follows is
  // committed until the one Store::commit() below, whoever flushes the store meanwhile.
  std::vector<Future<void>> futs;
  for (const auto& t : tensors) {
    if (t.placement != Placement::kHost) continue;
    for (int s = 0; s < num_streams(); ++s) {
      futs.push_back(store->write_range_async(t.keys[s], 0, t.numel * elem_bytes(s),
                                              t.host[s].data()));
    }
  }
  STRATA_RETURN_IF_ERROR(when_all(futs).result().status().with_context(
      "offload checkpoint: writing host-tier tensors"));
  STRATA_RETURN_IF_ERROR(put_meta());
  // The savepoint of what is about to be committed replaces the last checkpoint's before
  // the commit, so the commit frees (and gives back) the chunks it replaces; a failed
  // commit then leaves no savepoint (a close keeps the holds).
  auto next = save_committed();
  committed = Savepoint();
  committed_keys.clear();
  STRATA_RETURN_IF_ERROR(
      store->commit(all_keys()).with_context("offload checkpoint: Store::commit"));
  changed = false;
  if (next.ok()) set_committed(std::move(next).value());
  return Status::OK();
}

void OffloadedOptimizer::Impl::set_committed(Savepoint sp) {
  committed = std::move(sp);
  committed_meta = serialize_meta();
  committed_keys = all_keys();
}

Result<Savepoint> OffloadedOptimizer::Impl::save_committed() {
  // Every tensor's objects (host-tier tensors' backing objects too: a failed checkpoint may
  // have rewritten part of them); the record is put again from its text.
  std::vector<std::string> keys;
  for (const auto& t : tensors) keys.insert(keys.end(), t.keys.begin(), t.keys.end());
  if (keys.empty()) return Savepoint();
  auto sp = store->savepoint(keys);
  if (!sp.ok()) {
    log_warn("offload: no savepoint of the checkpoint (" + sp.status().to_string() +
             "): a close() without a checkpoint leaves the optimizer's keys held until the "
             "store closes");
  }
  return sp;
}

Status OffloadedOptimizer::Impl::drop_uncommitted() {
  if (committed_keys.empty()) {
    return failed_precondition("no savepoint of the last checkpoint");
  }
  if (!committed.empty()) STRATA_RETURN_IF_ERROR(store->rollback(committed));
  PutOptions po;
  po.tier = Tier::kHost;
  po.overwrite = true;
  po.pin = true;
  STRATA_RETURN_IF_ERROR(store->put(meta_key(), committed_meta.data(),
                                    TensorDesc::bytes(committed_meta.size()), po));
  STRATA_RETURN_IF_ERROR(store->commit(committed_keys));
  store->release(committed_keys);
  committed = Savepoint();
  committed_keys.clear();
  return Status::OK();
}

Status OffloadedOptimizer::Impl::close(bool want_checkpoint) {
  if (closed) return Status::OK();
  Status st;
  if (want_checkpoint && (changed || !broken.ok())) st = checkpoint();
  // Without a checkpoint of the last changes, the NVMe objects go back to the last
  // checkpoint's version (committed again) and only then are released; when that cannot be
  // done the holds stay: no later flush of the store may commit part of the changes (its
  // close drops them).
  if (st.ok() && (want_checkpoint || !changed)) {
    store->release(all_keys());
  } else if (Status dropped = drop_uncommitted(); !dropped.ok()) {
    log_warn("offload close: the changes since the last checkpoint stay held until the store "
             "closes (" + dropped.to_string() + ")");
  }
  closed = true;
  committed = Savepoint();  // its chunk layouts are not needed once closed
  committed_keys.clear();
  claim = offload_detail::PrefixClaim();  // the key prefix is free for another optimizer
  for (auto& t : tensors) {
    t.host.clear();
    t.grad = nullptr;
    t.grad_key.clear();
    t.copy = nullptr;
  }
  host_bytes = 0;
  slots.clear();
  pinned.reset();
  pool.reset();
  if (st.ok()) return st;
  return Status(st.code(), "offload close: the state since the last checkpoint is not saved "
                           "(a resume restores the last checkpoint): " + st.message());
}

Result<std::vector<std::string>> OffloadedOptimizer::Impl::recorded_keys() {
  STRATA_ASSIGN_OR_RETURN(MetaRecord m, read_meta(*store, meta_key(), factory));
  if (m.groups.empty()) return data_loss("offload: checkpoint record '" + meta_key() +
                                         "' has no param group");
  auto built = build_rule(m.groups[0]);
  if (!built.ok()) {
    return failed_precondition("offload remove: the rule factory does not accept the "
                               "hyperparameters recorded for group 0 of rule '" + m.rule +
                               "': " + built.status().to_string());
  }
  STRATA_RETURN_IF_ERROR(init_from_rule(**built));
  std::vector<std::string> keys;
  for (const auto& p : m.params) {
    for (int s = 0; s < num_streams(); ++s) keys.push_back(key_of(p.name, s));
  }
  return keys;
}

Status OffloadedOptimizer::Impl::restore() {
  const std::string key = meta_key();
  STRATA_ASSIGN_OR_RETURN(ObjectInfo info, store->stat(key));
  // A key with uncommitted changes: an optimizer on this store object stopped after its
  // last checkpoint without a new one (failed step or checkpoint); its changes are held,
  // and only a reopen of the store drops them.
  auto check_clean = [&](const ObjectInfo& oi) -> Status {
    if (!oi.dirty) return Status::OK();
    return failed_precondition(
        "offload open: object '" + oi.key + "' of store " + store->options().path +
        " holds changes made after the last checkpoint by an optimizer that could not "
        "checkpoint them; close and reopen the store to resume from the last checkpoint");
  };
  STRATA_RETURN_IF_ERROR(check_clean(info));
  std::string text(info.nbytes, '\0');
  STRATA_RETURN_IF_ERROR(store->get_bytes(key, text.data(), text.size()));
  STRATA_ASSIGN_OR_RETURN(MetaRecord m, parse_meta(text, key));
  if (!factory) {
    STRATA_ASSIGN_OR_RETURN(factory, recorded_rule_factory(m.rule, key));
  }
  if (m.state_dtype != opts.state_dtype) {
    return failed_precondition(
        "offload open: the checkpoint under '" + opts.key_prefix + "' of store " +
        store->options().path + " holds " + std::string(dtype_name(m.state_dtype)) +
        " optimizer states, but OffloadOptions.state_dtype is " +
        std::string(dtype_name(opts.state_dtype)) + ": open it with state_dtype " +
        std::string(dtype_name(m.state_dtype)) + " (states are not converted on open)");
  }
  for (size_t g = 0; g < m.groups.size(); ++g) {
    auto built = build_rule(m.groups[g]);
    if (!built.ok()) {
      return failed_precondition("offload open: the rule factory does not accept the "
                                 "hyperparameters recorded for group " + std::to_string(g) +
                                 " of rule '" + m.rule + "': " + built.status().to_string());
    }
    auto rule = std::move(built).value();
    if (g == 0) {
      if (rule->name() != m.rule || rule->num_states() != m.num_states) {
        return failed_precondition("offload open: the checkpoint under '" + opts.key_prefix +
                                   "' was made by rule '" + m.rule + "' with " +
                                   std::to_string(m.num_states) +
                                   " state streams; the factory builds '" +
                                   std::string(rule->name()) + "' with " +
                                   std::to_string(rule->num_states()));
      }
      STRATA_RETURN_IF_ERROR(init_from_rule(*rule));
    }
    groups.push_back({m.groups[g], std::move(rule)});
  }
  STRATA_RETURN_IF_ERROR(setup_resources());
  for (const auto& p : m.params) {
    Tensor t;
    t.name = p.name;
    t.numel = p.numel;
    t.placement = p.placement;
    t.group = p.group;
    const bool host = p.placement == Placement::kHost;
    t.state.set_step(p.durable_step);
    for (int s = 0; s < num_streams(); ++s) {
      t.keys.push_back(key_of(p.name, s));
      STRATA_ASSIGN_OR_RETURN(ObjectInfo oi, store->stat(t.keys[s]));
      STRATA_RETURN_IF_ERROR(check_clean(oi));
      t.chunks.push_back(oi.chunk_bytes);
      if (oi.nbytes != p.numel * elem_bytes(s)) {
        return data_loss("offload open: object '" + t.keys[s] + "' holds " +
                         std::to_string(oi.nbytes) + " bytes, the record says " +
                         std::to_string(p.numel) + " " + (elem_bytes(s) == 2 ? "bf16" : "fp32") +
                         " elements");
      }
    }
    if (host) {
      for (int s = 0; s < num_streams(); ++s) {
        const uint64_t nb = p.numel * elem_bytes(s);
        STRATA_ASSIGN_OR_RETURN(HostArray a, HostArray::allocate(nb));
        STRATA_RETURN_IF_ERROR(store->read_range(t.keys[s], 0, nb, a.data()));
        t.host.push_back(std::move(a));
      }
      host_bytes += p.numel * bytes_per_element();
    }
    if (by_name.count(t.name)) return data_loss("offload open: duplicate parameter '" + t.name + "'");
    by_name[t.name] = static_cast<ParamHandle>(tensors.size());
    tensors.push_back(std::move(t));
  }
  return store->hold(all_keys());
}

}  // namespace strata::optimizer
