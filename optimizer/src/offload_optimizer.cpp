// The offloaded optimizer (see offload.hpp): create/open, the rules of the param groups,
// the pinned slots and kernel threads, and the public members (serialized by the baton).
// The tensors, the step and the checkpoint record live in offload_tensors.cpp,
// offload_pipeline.cpp and offload_checkpoint.cpp (offload_impl.hpp lists them).
#include <algorithm>
#include <cctype>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "offload_impl.hpp"
#include "strata/base/logging.hpp"
#include "strata/base/units.hpp"
#include "strata/optimizer/kernel_pool.hpp"
#include "strata/store/topology.hpp"

namespace strata::optimizer {

using namespace offload_detail;

namespace {

constexpr int kMaxBuffers = 16;
// num_buffers 0 (auto): the slots the sub-group is sized for, and the most slots.
constexpr uint64_t kAutoMinBuffers = 4;
constexpr uint64_t kAutoMaxBuffers = 64;
// num_buffers 0 (auto): a slot holds several sub-groups when they are smaller than the
// objects' chunk or than this many bytes per stream (fp32 states, page-multiple
// sub-groups). The consecutive sub-groups of a tensor in one batch are read and written
// with one request per stream (run_pipeline), so a small sub-group neither writes parts of
// chunks (read-modify-write, one after another) nor multiplies requests. 4 MiB: KvikIO's
// default task size; in one sweep over 1 MiB chunks the step with 4 MiB requests took 0.90
// of the one with 1 MiB ones (docs/benchmarks.md, the sub-group sweep's `earlier`).
constexpr uint64_t kAutoSlotStreamBytes = 4ull << 20;

// Slots of `slot_bytes` each under num_buffers 0: as many as `budget` holds, within
// [kAutoMinBuffers, kAutoMaxBuffers]; kAutoMinBuffers without a budget (0).
uint64_t auto_slot_count(uint64_t slot_bytes, uint64_t budget) {
  if (budget == 0 || slot_bytes == 0) return kAutoMinBuffers;
  return std::clamp<uint64_t>(budget / slot_bytes, kAutoMinBuffers, kAutoMaxBuffers);
}

bool valid_hp_key(std::string_view k) {
  if (k.empty()) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  }
  return true;
}

/// The (store, prefix) pairs of the optimizers open in this process (PrefixClaim).
struct ClaimRegistry {
  std::mutex mu;
  std::vector<std::pair<const Store*, std::string>> held;
};

ClaimRegistry& claims() {
  static ClaimRegistry* r = new ClaimRegistry;  // never destroyed: claims outlive statics
  return *r;
}

}  // namespace

// ------------------------------------------------------------------------------ PrefixClaim

Result<PrefixClaim> offload_detail::PrefixClaim::acquire(const Store* store, const std::string& prefix) {
  auto& r = claims();
  std::lock_guard<std::mutex> lk(r.mu);
  for (const auto& [s, p] : r.held) {
    if (s != store) continue;
    if (p.compare(0, prefix.size(), prefix) == 0 || prefix.compare(0, p.size(), p) == 0) {
      const std::string how = p == prefix ? "the same key_prefix '" + p + "'"
                                          : "key_prefix '" + p + "', which overlaps '" +
                                                prefix + "' (one is a prefix of the other)";
      return failed_precondition(
          "offload: another open optimizer on store " + store->options().path + " uses " +
          how + ": both would read and write the same keys. Close it first, or give this "
          "optimizer a key_prefix that neither starts nor is started by '" + p +
          "' (OffloadOptions::key_prefix; key_prefix= in Python)");
    }
  }
  r.held.emplace_back(store, prefix);
  PrefixClaim c;
  c.store_ = store;
  c.prefix_ = prefix;
  return c;
}

offload_detail::PrefixClaim& offload_detail::PrefixClaim::operator=(PrefixClaim&& o) noexcept {
  if (this != &o) {
    release();
    store_ = o.store_;
    prefix_ = std::move(o.prefix_);
    o.store_ = nullptr;
  }
  return *this;
}

void offload_detail::PrefixClaim::release() {
  if (store_ == nullptr) return;
  auto& r = claims();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = std::find(r.held.begin(), r.held.end(), std::make_pair(store_, prefix_));
  if (it != r.held.end()) r.held.erase(it);
  store_ = nullptr;
}

// ------------------------------------------------------------------------------ Impl

OffloadedOptimizer::Impl::Baton::Baton(const Impl* impl) : impl_(impl) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->cv.wait(lk, [&] { return !impl_->busy; });
  impl_->busy = true;
}

OffloadedOptimizer::Impl::Baton::~Baton() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->busy = false;
  }
  impl_->cv.notify_all();
}

Status OffloadedOptimizer::Impl::check_handle(ParamHandle h) const {
  if (h >= tensors.size()) {
    return out_of_range("offload: parameter handle " + std::to_string(h) + " is out of range (" +
                        std::to_string(tensors.size()) + " parameters)");
  }
  return Status::OK();
}

Result<std::unique_ptr<UpdateRule>> OffloadedOptimizer::Impl::build_rule(
    const Hyperparams& hp) const {
  for (const auto& kv : hp) {
    if (!valid_hp_key(kv.first)) {
      return invalid_argument("offload: bad hyperparameter name '" + kv.first + "'");
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto rule, factory(hp));
  if (rule == nullptr) return invalid_argument("offload: the rule factory returned null");
  if (!rule_name.empty()) {
    if (rule->name() != rule_name || rule->num_states() != num_states) {
      return invalid_argument("offload: hyperparameters change the rule from '" + rule_name +
                              "' with " + std::to_string(num_states) + " state streams to '" +
                              std::string(rule->name()) + "' with " +
                              std::to_string(rule->num_states()) +
                              " (e.g. amsgrad or momentum switched after creation)");
    }
  }
  return rule;
}

Status OffloadedOptimizer::Impl::init_from_rule(const UpdateRule& rule) {
  rule_name = std::string(rule.name());
  num_states = rule.num_states();
  if (num_states < 0 || num_states > kMaxStateStreams) {
    return invalid_argument("offload: rule '" + rule_name + "' has " +
                            std::to_string(num_states) + " state streams");
  }
  for (int i = 0; i < num_states; ++i) {
    std::string n(rule.state_name(i));
    if (!valid_name(n) || n == "param") {
      return invalid_argument("offload: rule '" + rule_name + "' state stream " +
                              std::to_string(i) + " has an unusable name '" + n + "'");
    }
    state_names.push_back(n);
    state_inits.push_back(rule.state_init_value(i));
  }
  return Status::OK();
}

Status OffloadedOptimizer::Impl::setup_resources() {
  if (opts.num_buffers < 0 || opts.num_buffers > kMaxBuffers) {
    return invalid_argument("OffloadOptions.num_buffers " + std::to_string(opts.num_buffers) +
                            " is outside 0.." + std::to_string(kMaxBuffers) + " (0 = auto)");
  }
  if (opts.state_dtype != DType::kFloat32 && opts.state_dtype != DType::kBFloat16) {
    return invalid_argument(std::string("OffloadOptions.state_dtype ") +
                            std::string(dtype_name(opts.state_dtype)) +
                            " is not supported (fp32 or bf16)");
  }
  chunk_bytes = store->chunk_bytes();
  // num_buffers 0 (auto): the sub-group is sized for kAutoMinBuffers slots, then the slots
  // are as many as pinned_budget_bytes holds (at most kAutoMaxBuffers), so a small
  // sub-group still keeps the pipeline's bytes in flight.
  const bool auto_buffers = opts.num_buffers == 0;
  const uint64_t B = auto_buffers ? kAutoMinBuffers : static_cast<uint64_t>(opts.num_buffers);
  const uint64_t S = static_cast<uint64_t>(num_streams());
  auto slot_bytes = [&](uint64_t n) { return S * align_up(n * 4, kAlign); };
  if (opts.sub_group_numel > 0) {
    sg = opts.sub_group_numel;
    if (sg > (~uint64_t{0} / 4 - kAlign) / (B * (S + 1))) {  // B * (S + 1) * 4 * sg overflows
      return invalid_argument("OffloadOptions.sub_group_numel " + std::to_string(sg) +
                              " is too large: " + std::to_string(B) + " buffers x " +
                              std::to_string(S + 1) + " regions x 4 bytes overflow 64 bits");
    }
    if (opts.pinned_budget_bytes > 0 && B * slot_bytes(sg) > opts.pinned_budget_bytes) {
      return invalid_argument("OffloadOptions: " + std::to_string(B) + " buffers of sub_group_numel " +
                              std::to_string(sg) + " need " + format_bytes(B * slot_bytes(sg)) +
                              " of pinned memory, more than pinned_budget_bytes " +
                              format_bytes(opts.pinned_budget_bytes));
    }
  } else {
    sg = std::max<uint64_t>(chunk_bytes / 4, kAlign / 4);
    if (opts.pinned_budget_bytes > 0 && B * slot_bytes(sg) > opts.pinned_budget_bytes) {
      uint64_t fit = opts.pinned_budget_bytes / (B * S) / kAlign * kAlign / 4;
      if (fit == 0) {
        return invalid_argument("OffloadOptions.pinned_budget_bytes " +
                                format_bytes(opts.pinned_budget_bytes) + " cannot hold " +
                                std::to_string(B) + " buffers of one 4 KiB page per stream");
      }
      sg = fit;
    }
  }
  if ((sg * 4) % kAlign == 0 && sg * 4 < chunk_bytes) {
    const uint64_t sgb = sg * 4;
    const uint64_t per_chunk = (kMinStateChunk + sgb - 1) / sgb;  // sub-groups per chunk
    if (per_chunk * sgb <= chunk_bytes) chunk_bytes = per_chunk * sgb;
  }
  // The slot's elements per stream: one sub-group; under auto buffers (fp32 states, a
  // page-multiple sub-group) whole sub-groups up to the larger of the objects' chunk and
  // kAutoSlotStreamBytes, fewer when kAutoMinBuffers slots of them would not fit the budget.
  uint64_t slot_numel = sg;
  const uint64_t target = std::max(chunk_bytes, kAutoSlotStreamBytes);
  if (auto_buffers && !bf16_states() && (sg * 4) % kAlign == 0 && sg * 4 < target) {
    uint64_t per = (target + sg * 4 - 1) / (sg * 4);  // slot_bytes(per * sg) = per * S * sg * 4
    if (opts.pinned_budget_bytes > 0) {
      per = std::clamp<uint64_t>(opts.pinned_budget_bytes / (B * S * sg * 4), 1, per);
    }
    slot_numel = per * sg;
  }
  stream_stride = align_up(slot_numel * 4, kAlign);
  const uint64_t nslots =
      auto_buffers ? auto_slot_count(slot_bytes(slot_numel), opts.pinned_budget_bytes) : B;
  // One topology, one numbering: the pinned pool and the kernel threads both place by the
  // store's Topology (kernel node numbers). A foreign one (HWLOC_XMLFILE) gives the
  // targets; nothing is bound on it, as in the store.
  STRATA_ASSIGN_OR_RETURN(auto topology, Topology::system());
  const bool here = topology->is_this_system();
  PinnedPoolOptions po;
  po.budget_bytes = nslots * slot_bytes(slot_numel);
  po.numa_node = here ? opts.numa_node : -1;
  po.alignment = kAlign;
  STRATA_ASSIGN_OR_RETURN(pinned, PinnedPool::create(po, store->engine()));
  for (uint64_t b = 0; b < nslots; ++b) {
    STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, pinned->try_allocate(slot_bytes(slot_numel)));
    slots.push_back(std::move(buf));
  }
  KernelPoolPlacement kp;
  STRATA_ASSIGN_OR_RETURN(pool, make_kernel_pool({opts.num_threads, opts.numa_node}, *topology, &kp));
  placement.numa_node = opts.numa_node;
  placement.thread_cpus = std::move(kp.cpus);
  placement.threads_bound = kp.bound;
  placement.memory_node = opts.numa_node;
  placement.memory_bound = opts.numa_node >= 0 && pinned->numa_node() == opts.numa_node;
  return Status::OK();
}

// ------------------------------------------------------------------------------ public

OffloadedOptimizer::OffloadedOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OffloadedOptimizer::~OffloadedOptimizer() {
  if (!impl_) return;
  Status st = close();
  if (!st.ok()) log_warn(st.to_string());
}

Status OffloadedOptimizer::close(bool checkpoint) {
  Status st;
  // An open overlapped step is rolled back first: nothing of it stays or is checkpointed.
  if (impl_->early != nullptr) st = abort_step();
  {
    Impl::Baton b(impl_.get());  // waits for an in-flight step
    Status closed = impl_->close(checkpoint);
    if (st.ok()) st = closed;
  }
  impl_->step_queue.reset();  // joins the step worker (its step is done: the baton is free)
  return st;
}

static Status check_store(const std::shared_ptr<Store>& store) {
  if (store == nullptr) return invalid_argument("offload: store is null");
  if (store->options().read_only) {
    return failed_precondition("offload: store " + store->options().path + " is read-only");
  }
  return Status::OK();
}

Result<std::unique_ptr<OffloadedOptimizer>> OffloadedOptimizer::create(
    std::shared_ptr<Store> store, RuleFactory factory, const Hyperparams& defaults,
    const OffloadOptions& options) {
  STRATA_RETURN_IF_ERROR(check_store(store));
  if (!factory) return invalid_argument("offload create: the rule factory is empty");
  auto impl = std::make_unique<Impl>();
  STRATA_ASSIGN_OR_RETURN(impl->claim, PrefixClaim::acquire(store.get(), options.key_prefix));
  impl->store = std::move(store);
  impl->factory = std::move(factory);
  impl->opts = options;
  if (impl->store->contains(impl->meta_key())) {
    return already_exists("offload create: store " + impl->store->options().path +
                          " already holds an optimizer under '" + options.key_prefix +
                          "' (use OffloadedOptimizer::open to resume it)");
  }
  STRATA_ASSIGN_OR_RETURN(auto rule, impl->build_rule(defaults));
  STRATA_RETURN_IF_ERROR(impl->init_from_rule(*rule));
  impl->groups.push_back({defaults, std::move(rule)});
  STRATA_RETURN_IF_ERROR(impl->setup_resources());
  STRATA_RETURN_IF_ERROR(impl->check_disk_space({}, "offload create"));
  STRATA_RETURN_IF_ERROR(impl->store->hold({impl->meta_key()}));
  impl->changed = true;  // close() makes even an optimizer without steps resumable
  return std::unique_ptr<OffloadedOptimizer>(new OffloadedOptimizer(std::move(impl)));
}

Result<std::unique_ptr<OffloadedOptimizer>> OffloadedOptimizer::open(
    std::shared_ptr<Store> store, RuleFactory factory, const OffloadOptions& options) {
  STRATA_RETURN_IF_ERROR(check_store(store));
  auto impl = std::make_unique<Impl>();
  STRATA_ASSIGN_OR_RETURN(impl->claim, PrefixClaim::acquire(store.get(), options.key_prefix));
  impl->store = std::move(store);
  impl->factory = std::move(factory);
  impl->opts = options;
  if (!impl->store->contains(impl->meta_key())) {
    return not_found("offload open: store " + impl->store->options().path +
                     " holds no checkpoint record '" + impl->meta_key() + "'");
  }
  if (options.verify_on_open) {
    STRATA_ASSIGN_OR_RETURN(VerifyReport rep, impl->store->verify());
    if (!rep.errors.empty()) {
      return data_loss("offload open: " + std::to_string(rep.errors.size()) +
                       " bad chunk(s) in store " + impl->store->options().path + ", first: " +
                       rep.errors.front().to_string());
    }
  }
  STRATA_RETURN_IF_ERROR(impl->restore());
  if (auto sp = impl->save_committed(); sp.ok()) {  // what open() resumed is committed
    impl->set_committed(std::move(sp).value());
  }
  return std::unique_ptr<OffloadedOptimizer>(new OffloadedOptimizer(std::move(impl)));
}

Status OffloadedOptimizer::remove(std::shared_ptr<Store> store, RuleFactory factory,
                                  const OffloadOptions& options) {
  STRATA_RETURN_IF_ERROR(check_store(store));
  Impl impl;
  impl.store = std::move(store);
  impl.factory = std::move(factory);
  impl.opts = options;
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> keys, impl.recorded_keys());
  for (const auto& k : keys) {
    Status st = impl.store->remove(k);
    if (!st.ok() && st.code() != StatusCode::kNotFound) return st;
  }
  STRATA_RETURN_IF_ERROR(impl.store->remove(impl.meta_key()));
  return impl.store->flush().with_context("offload remove: Store::flush");
}

Result<int> OffloadedOptimizer::add_param_group(const Hyperparams& hp) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_open("offload add_param_group"));
  STRATA_RETURN_IF_ERROR(impl_->check_no_open_step("add_param_group"));
  Hyperparams merged = impl_->groups[0].hp;
  for (const auto& kv : hp) merged[kv.first] = kv.second;
  STRATA_ASSIGN_OR_RETURN(auto rule, impl_->build_rule(merged));
  impl_->groups.push_back({std::move(merged), std::move(rule)});
  impl_->changed = true;
  return static_cast<int>(impl_->groups.size() - 1);
}

int OffloadedOptimizer::num_param_groups() const {
  Impl::Baton b(impl_.get());
  return static_cast<int>(impl_->groups.size());
}

Result<Hyperparams> OffloadedOptimizer::hyperparams(int group) const {
  Impl::Baton b(impl_.get());
  if (group < 0 || static_cast<size_t>(group) >= impl_->groups.size()) {
    return out_of_range("offload: no param group " + std::to_string(group));
  }
  return impl_->groups[group].hp;
}

Status OffloadedOptimizer::set_hyperparams(int group, const Hyperparams& hp) {
  Impl::Baton b(impl_.get());
  if (group < 0 || static_cast<size_t>(group) >= impl_->groups.size()) {
    return out_of_range("offload: no param group " + std::to_string(group));
  }
  STRATA_RETURN_IF_ERROR(impl_->check_open("offload set_hyperparams"));
  Hyperparams merged = impl_->groups[group].hp;
  for (const auto& kv : hp) merged[kv.first] = kv.second;
  STRATA_ASSIGN_OR_RETURN(auto rule, impl_->build_rule(merged));
  impl_->groups[group] = {std::move(merged), std::move(rule)};
  impl_->changed = true;
  return Status::OK();
}

Status OffloadedOptimizer::set_lr(int group, double lr) { return set_hyperparams(group, {{"lr", lr}}); }

Result<ParamHandle> OffloadedOptimizer::add_param(std::string_view name, uint64_t numel,
                                                  const float* init, int group,
                                                  Placement placement) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_no_open_step("add_param"));
  return impl_->add_param(name, numel, init, group, placement);
}

size_t OffloadedOptimizer::num_params() const {
  Impl::Baton b(impl_.get());
  return impl_->tensors.size();
}

Result<ParamInfo> OffloadedOptimizer::param_info(ParamHandle h) const {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  const auto& t = impl_->tensors[h];
  ParamInfo i;
  i.name = t.name;
  i.numel = t.numel;
  i.placement = t.placement;
  i.group = t.group;
  i.step = t.state.step();
  i.has_grad = t.has_grad();
  i.master_key = t.keys.empty() ? std::string() : t.keys[0];
  return i;
}

Result<ParamHandle> OffloadedOptimizer::find_param(std::string_view name) const {
  Impl::Baton b(impl_.get());
  auto it = impl_->by_name.find(std::string(name));
  if (it == impl_->by_name.end()) {
    return not_found("offload: no parameter named '" + std::string(name) + "'");
  }
  return it->second;
}

Status OffloadedOptimizer::set_grad(ParamHandle h, const void* data, DType type) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_open("offload set_grad"));
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  if (type != DType::kFloat32 && type != DType::kFloat16 && type != DType::kBFloat16) {
    return invalid_argument("offload set_grad '" + impl_->tensors[h].name +
                            "': gradients must be fp32, fp16 or bf16");
  }
  impl_->tensors[h].grad = data;
  impl_->tensors[h].grad_type = type;
  impl_->tensors[h].grad_key.clear();  // replaces (or, null, detaches) a gradient object
  return Status::OK();
}

Status OffloadedOptimizer::Impl::check_grad_object(const Tensor& t, const std::string& key,
                                                   DType type, const std::string& what) const {
  Result<ObjectInfo> info = store->stat(key);
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) {
      return not_found(what + ": the gradient object '" + key + "' is not in the store");
    }
    return info.status().with_context(what + ": stat of the gradient object '" + key + "'");
  }
  if (!info->damage.empty()) {
    return data_loss(what + ": the gradient object '" + key + "' is damaged: " + info->damage);
  }
  const uint64_t need = t.numel * dtype_size(type);
  if (info->dtype != type && info->dtype != DType::kUInt8) {
    return invalid_argument(what + ": the gradient object '" + key + "' holds " +
                            to_string(TensorDesc{info->dtype, info->shape}) + ", not " +
                            std::string(dtype_name(type)) + " (the gradient's dtype)");
  }
  if (info->nbytes != need) {
    return invalid_argument(what + ": the gradient object '" + key + "' holds " +
                            std::to_string(info->nbytes) + " bytes, the gradient " +
                            std::to_string(need) + " (" + std::to_string(t.numel) +
                            " elements of " + std::string(dtype_name(type)) + ")");
  }
  return Status::OK();
}

Status OffloadedOptimizer::Impl::ensure_grad_regions() {
  if (!grad_slots.empty()) return Status::OK();
  PinnedPoolOptions po;
  po.budget_bytes = slots.size() * stream_stride;
  po.numa_node = pinned->numa_node();
  po.alignment = kAlign;
  STRATA_ASSIGN_OR_RETURN(grad_pinned, PinnedPool::create(po, store->engine()));
  std::vector<PinnedBuffer> bufs;
  for (size_t i = 0; i < slots.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, grad_pinned->try_allocate(stream_stride));
    bufs.push_back(std::move(buf));
  }
  grad_slots = std::move(bufs);
  return Status::OK();
}

Status OffloadedOptimizer::set_grad_object(ParamHandle h, std::string key, DType type) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_open("offload set_grad_object"));
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  Impl::Tensor& t = impl_->tensors[h];
  const std::string what = "offload set_grad_object '" + t.name + "'";
  if (type != DType::kFloat32 && type != DType::kFloat16 && type != DType::kBFloat16) {
    return invalid_argument(what + ": gradients must be fp32, fp16 or bf16");
  }
  if (t.placement != Placement::kNvme) {
    return invalid_argument(what + ": the tensor is host-tier; only NVMe-tier tensors take "
                            "a gradient object (attach this one's with set_grad)");
  }
  if (key.empty()) return invalid_argument(what + ": the key is empty");
  STRATA_RETURN_IF_ERROR(impl_->check_grad_object(t, key, type, what));
  STRATA_RETURN_IF_ERROR(impl_->ensure_grad_regions());
  t.grad = nullptr;
  t.grad_type = type;
  t.grad_key = std::move(key);
  return Status::OK();
}

void OffloadedOptimizer::clear_grads() {
  Impl::Baton b(impl_.get());
  for (auto& t : impl_->tensors) {
    t.grad = nullptr;
    t.grad_key.clear();
  }
}

Status OffloadedOptimizer::set_param_copy(ParamHandle h, void* dst, DType type) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_open("offload set_param_copy"));
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  if (type != DType::kFloat16 && type != DType::kBFloat16 && type != DType::kFloat32) {
    return invalid_argument("offload set_param_copy '" + impl_->tensors[h].name +
                            "': the copy must be fp16, bf16 or fp32");
  }
  impl_->tensors[h].copy = dst;
  impl_->tensors[h].copy_type = type;
  return Status::OK();
}

Result<StepStats> OffloadedOptimizer::step(const StepOptions& options) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_no_open_step("step"));
  return impl_->step(options);
}

void OffloadedOptimizer::Impl::record(const StepStats& s) {
  std::lock_guard<std::mutex> lk(stats_mu);
  OptimizerStats& t = totals;
  t.steps += 1;
  t.steps_skipped += s.skipped ? 1 : 0;
  t.steps_rolled_back += s.rolled_back ? 1 : 0;
  t.sub_groups += s.sub_groups;
  t.tensors_updated += s.tensors_updated;
  t.numel_updated += s.numel_updated;
  t.bytes_read += s.bytes_read;
  t.bytes_written += s.bytes_written;
  t.step_seconds += s.seconds;
  t.update_seconds += s.compute_seconds;
  t.io_wait_seconds += s.io_wait_seconds;
  t.early_seconds += s.early_seconds;
}

OptimizerStats OffloadedOptimizer::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  return impl_->totals;
}

void OffloadedOptimizer::reset_stats() {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  impl_->totals = OptimizerStats{};
}

Future<StepStats> OffloadedOptimizer::step_async(const StepOptions& options) {
  Impl* impl = impl_.get();
  // The baton is taken here (waiting for an in-flight step or member) and handed to the
  // step, which lets it go when the step is done, just before the future completes.
  auto baton = std::make_shared<std::optional<Impl::Baton>>();
  baton->emplace(impl);
  impl->last_step.wait();  // as before: the previous step's future is ready first
  if (Status st = impl->check_no_open_step("step_async"); !st.ok()) {
    return make_ready_future(Result<StepStats>(st));
  }
  // The step runs on the optimizer's step queue: a ThreadPool of one worker, owned by the
  // optimizer and joined by close(). Not the kernel pool (the step runs parallel_for on it,
  // which must not be called from one of its workers), not the store's workers (the step
  // waits for store reads and writes). Under the baton, one step is queued at a time.
  if (impl->step_queue == nullptr) {
    auto q = ThreadPool::create(1);
    if (!q.ok()) return make_ready_future(Result<StepStats>(q.status()));
    impl->step_queue = std::move(*q);
  }
  impl->last_step = impl->step_queue->async([impl, options, baton]() -> Result<StepStats> {
    Result<StepStats> r = impl->step(options);
    baton->reset();
    return r;
  });
  return impl->last_step;
}

int OffloadedOptimizer::num_states() const { return impl_->num_states; }
std::string OffloadedOptimizer::state_name(int i) const {
  if (i < 0 || i >= impl_->num_states) return {};
  return impl_->state_names[i];
}
std::string OffloadedOptimizer::rule_name() const { return impl_->rule_name; }

Status OffloadedOptimizer::read_param(ParamHandle h, float* dst, uint64_t offset, uint64_t count) {
  Impl::Baton b(impl_.get());
  return impl_->read_stream(h, 0, dst, offset, count);
}
Status OffloadedOptimizer::write_param(ParamHandle h, const float* src, uint64_t offset,
                                       uint64_t count) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_no_open_step("write_param"));
  return impl_->write_stream(h, 0, src, offset, count);
}
namespace {
/// OutOfRange for a state stream index outside [0, num_states) (stream -1 would otherwise
/// reach internal stream 0, the fp32 master).
Status check_state_stream(int stream, int num_states) {
  if (stream < 0 || stream >= num_states) {
    return out_of_range("offload: state stream " + std::to_string(stream) +
                        " is out of range (" + std::to_string(num_states) + " streams)");
  }
  return Status::OK();
}
}  // namespace

Status OffloadedOptimizer::read_state(ParamHandle h, int stream, float* dst, uint64_t offset,
                                      uint64_t count) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(check_state_stream(stream, impl_->num_states));
  return impl_->read_stream(h, stream + 1, dst, offset, count);
}
Status OffloadedOptimizer::write_state(ParamHandle h, int stream, const float* src,
                                       uint64_t offset, uint64_t count) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_no_open_step("write_state"));
  STRATA_RETURN_IF_ERROR(check_state_stream(stream, impl_->num_states));
  return impl_->write_stream(h, stream + 1, src, offset, count);
}

Result<int64_t> OffloadedOptimizer::step_count(ParamHandle h) const {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  return impl_->tensors[h].state.step();
}

Status OffloadedOptimizer::set_step_count(ParamHandle h, int64_t step) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_no_open_step("set_step_count"));
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  if (step < 0) return invalid_argument("offload set_step_count: step " + std::to_string(step) + " < 0");
  STRATA_RETURN_IF_ERROR(impl_->check_open("offload set_step_count"));
  impl_->tensors[h].state.set_step(step);
  impl_->changed = true;
  return Status::OK();
}

Status OffloadedOptimizer::checkpoint() {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_no_open_step("checkpoint"));
  return impl_->checkpoint();
}

const OffloadOptions& OffloadedOptimizer::options() const { return impl_->opts; }
uint64_t OffloadedOptimizer::sub_group_numel() const { return impl_->sg; }
int OffloadedOptimizer::num_buffers() const { return static_cast<int>(impl_->slots.size()); }
uint64_t OffloadedOptimizer::pinned_bytes() const {
  return (impl_->pinned ? impl_->pinned->budget_bytes() : 0) +
         (impl_->grad_pinned ? impl_->grad_pinned->budget_bytes() : 0);
}
uint64_t OffloadedOptimizer::host_bytes() const {
  Impl::Baton b(impl_.get());
  return impl_->host_bytes;
}
const std::shared_ptr<Store>& OffloadedOptimizer::store() const { return impl_->store; }
const OffloadPlacement& OffloadedOptimizer::placement() const { return impl_->placement; }

}  // namespace strata::optimizer
