// The offloaded optimizer's step overlapped with backward (offload.hpp, OVERLAPPED STEP):
// begin_step / start_update / finish_step / abort_step.
//
// One background thread per open step takes the batches of start_update() in order (all
// those queued when it becomes free, merged into one). For each batch it takes a Store::savepoint() of the batch's NVMe objects (every stream), then
// runs the pipeline over the batch's items with the speculated gradient scale (the step's
// grad_scale: no clipping) while holding the baton, so other members wait for at most one
// batch. finish_step() joins the thread and runs step_impl() over the rest; a failed
// speculation rolls every savepoint back (in reverse order) and runs the whole step again.
#include <cmath>
#include <cstring>

#include "offload_impl.hpp"
#include "strata/optimizer/grad_utils.hpp"

#include <xxhash.h>

namespace strata::optimizer {

using namespace offload_detail;

Status OffloadedOptimizer::Impl::check_no_open_step(const char* what) const {
  if (early == nullptr) return Status::OK();
  return failed_precondition(std::string("offload ") + what +
                             ": an overlapped step is open (finish_step() or abort_step() "
                             "first)");
}

namespace {

/// XXH3-64 of the bytes of gradient entry `g` (numel elements of its dtype).
uint64_t grad_fingerprint(const OffloadedOptimizer::Impl& impl, const EarlyGrad& g) {
  const uint64_t n = impl.tensors[g.param].numel * dtype_size(g.grad_type);
  return XXH3_64bits(g.grad, n);
}

/// The early thread: one batch after another until stopped. Runs each batch holding the
/// baton (Impl::Baton) so that members called meanwhile wait for it.
void run_early_batches(OffloadedOptimizer::Impl* impl, OffloadedOptimizer::Impl::EarlyStep* e) {
  using Impl = OffloadedOptimizer::Impl;
  for (;;) {
    std::vector<uint32_t> batch;
    {
      std::unique_lock<std::mutex> lk(e->mu);
      e->cv.wait(lk, [&] { return e->stop || !e->queue.empty(); });
      if (e->queue.empty()) return;
      // Everything queued meanwhile runs as one batch: while a batch runs, the gradients
      // that become final accumulate, so the batches grow with the update's lag.
      for (auto& b : e->queue) batch.insert(batch.end(), b.begin(), b.end());
      e->queue.clear();
      e->running = true;
    }
    {
      Impl::Baton b(impl);
      if (e->error.ok() && !e->nonfinite) {
        const auto t0 = Clock::now();
        std::vector<std::string> keys;
        std::vector<std::pair<uint32_t, const EarlyGrad*>> work;
        for (uint32_t h : batch) {
          const auto& t = impl->tensors[h];
          for (const auto& k : t.keys) keys.push_back(k);
          work.emplace_back(h, &e->entries[h]);
          e->used_hp[h] = impl->groups[t.group].hp;
        }
        // A non-finite gradient fails the speculation for sure: its batch is not run.
        std::vector<GradView> views;
        for (uint32_t h : batch) {
          const auto& en = e->entries[h];
          views.push_back({en.grad, en.grad_type, impl->tensors[h].numel});
        }
        // The gradients' fingerprints, before the update reads them: finish_step() compares
        // them with the gradients then (an edit through .data bumps no version counter).
        for (uint32_t h : batch) {
          if (!e->entries[h].transient) e->grad_hash[h] = grad_fingerprint(*impl, e->entries[h]);
        }
        auto bad = has_inf_or_nan(views, impl->pool.get());
        std::vector<Impl::Item> items;
        std::vector<size_t> batches;
        impl->plan_items(work, items, batches);
        Result<Savepoint> sp = Savepoint{};
        if (!bad.ok()) {
          e->error = bad.status().with_context("offload overlapped step: gradient check");
        } else if (*bad) {
          e->nonfinite = true;  // finish_step() redoes the step (it will skip)
        } else if (sp = impl->store->savepoint(keys); !sp.ok()) {
          e->error = sp.status().with_context("offload overlapped step: savepoint");
        } else {
          e->savepoints.push_back(std::move(sp).value());
          const float scale = e->opts.grad_scale;
          bool skipped = false;
          Status st = impl->run_pipeline(
              items, batches, [scale]() -> Result<std::optional<float>> { return std::optional<float>(scale); },
              e->stats, &skipped);
          if (!st.ok()) {
            e->error = st.with_context("offload overlapped step: early update");
          } else {
            e->ran += static_cast<uint32_t>(batch.size());
            std::lock_guard<std::mutex> lk(e->mu);
            for (uint32_t h : batch) e->ran_early[h] = 1;
          }
        }
        e->stats.early_seconds += seconds_since(t0);
      }
    }
    {
      std::lock_guard<std::mutex> lk(e->mu);
      e->running = false;
    }
    e->cv.notify_all();
  }
}

/// True when every tensor of `hs` (updated early) still has the gradient bytes its early
/// update read.
bool grads_unchanged(const OffloadedOptimizer::Impl& impl,
                     const OffloadedOptimizer::Impl::EarlyStep& e,
                     const std::vector<uint32_t>& hs) {
  for (uint32_t h : hs) {
    if (e.entries[h].transient) continue;  // its buffer is gone: the caller vouches for it
    if (grad_fingerprint(impl, e.entries[h]) != e.grad_hash[h]) return false;
  }
  return true;
}

/// Stops and joins the early thread of `e` after the batches queued so far.
void join_early(OffloadedOptimizer::Impl::EarlyStep* e) {
  {
    std::lock_guard<std::mutex> lk(e->mu);
    e->stop = true;
  }
  e->cv.notify_all();
  if (e->thread.joinable()) e->thread.join();
}

/// Rolls back every batch's savepoint, the last first. \returns the first error.
Status roll_back(const std::shared_ptr<Store>& store, OffloadedOptimizer::Impl::EarlyStep* e) {
  Status first;
  for (auto it = e->savepoints.rbegin(); it != e->savepoints.rend(); ++it) {
    Status st = store->rollback(*it);
    if (first.ok() && !st.ok()) first = st.with_context("offload overlapped step: rollback");
  }
  e->savepoints.clear();
  return first;
}

/// After finish/abort: the gradients given to start_update() are detached (the caller's
/// buffers need not outlive the step).
void detach_early_grads(OffloadedOptimizer::Impl* impl, const OffloadedOptimizer::Impl::EarlyStep& e) {
  for (size_t h = 0; h < e.entries.size(); ++h) {
    if (e.entries[h].grad != nullptr && impl->tensors[h].grad == e.entries[h].grad) {
      impl->tensors[h].grad = nullptr;
    }
  }
}

}  // namespace

Status OffloadedOptimizer::begin_step(const StepOptions& o) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_open("offload begin_step"));
  if (impl_->early != nullptr) {
    return failed_precondition("offload begin_step: an overlapped step is open already");
  }
  if (!(o.max_grad_norm >= 0.0) || !std::isfinite(o.grad_scale)) {
    return invalid_argument("offload begin_step: max_grad_norm must be >= 0 and grad_scale "
                            "finite");
  }
  auto e = std::make_unique<Impl::EarlyStep>();
  e->opts = o;
  const size_t n = impl_->tensors.size();
  e->started.assign(n, 0);
  e->entries.assign(n, EarlyGrad{});
  e->used_hp.assign(n, Hyperparams{});
  e->grad_hash.assign(n, 0);
  e->ran_early.assign(n, 0);
  Impl::EarlyStep* raw = e.get();
  e->thread = std::thread(run_early_batches, impl_.get(), raw);
  impl_->early = std::move(e);
  return Status::OK();
}

bool OffloadedOptimizer::step_open() const {
  Impl::Baton b(impl_.get());
  return impl_->early != nullptr;
}

Status OffloadedOptimizer::start_update(const std::vector<EarlyGrad>& grads) {
  // Not under the baton: the early thread holds it while it runs a batch, and this call
  // must not wait for that (it runs during backward). Only tensors not started yet are
  // touched, and the thread only reads the tensors of its batches.
  Impl* impl = impl_.get();
  Impl::EarlyStep* e = impl->early.get();
  if (e == nullptr) return failed_precondition("offload start_update: no overlapped step is open");
  std::vector<uint32_t> batch;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    for (const auto& g : grads) {
      STRATA_RETURN_IF_ERROR(impl->check_handle(g.param));
      const auto& t = impl->tensors[g.param];
      if (e->started[g.param] || e->entries[g.param].grad != nullptr) {
        return failed_precondition("offload start_update '" + t.name +
                                   "': its update was started already in this step");
      }
      if (g.grad == nullptr) {
        return invalid_argument("offload start_update '" + t.name + "': the gradient is null");
      }
      auto ok_type = [](DType d) {
        return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
      };
      if (!ok_type(g.grad_type) || (g.param_copy != nullptr && !ok_type(g.param_copy_type))) {
        return invalid_argument("offload start_update '" + t.name +
                                "': gradients and param copies must be fp32, fp16 or bf16");
      }
    }
    for (const auto& g : grads) {
      auto& t = impl->tensors[g.param];
      e->entries[g.param] = g;
      t.grad = g.grad;
      t.grad_type = g.grad_type;
      t.grad_key.clear();  // attached as set_grad: replaces a gradient object
      if (t.placement == Placement::kHost || t.numel == 0) continue;
      e->started[g.param] = 1;
      batch.push_back(g.param);
    }
    if (!batch.empty()) e->queue.push_back(std::move(batch));
  }
  e->cv.notify_all();
  return Status::OK();
}

Status OffloadedOptimizer::wait_started() {
  Impl::EarlyStep* e = impl_->early.get();
  if (e == nullptr) return failed_precondition("offload wait_started: no overlapped step is open");
  std::unique_lock<std::mutex> lk(e->mu);
  e->cv.wait(lk, [&] { return e->queue.empty() && !e->running; });
  return Status::OK();
}

Result<StepStats> OffloadedOptimizer::finish_step(const StepOptions& o) {
  Impl* impl = impl_.get();
  if (impl->early == nullptr) {
    return failed_precondition("offload finish_step: no overlapped step is open");
  }
  const auto t0 = Clock::now();
  // The gradients of the batches that ran are checked while the last ones still run (every
  // gradient is final now); those of the later batches once they ran (their fingerprint may
  // have been taken while the caller still edited the gradient: then it differs).
  Impl::EarlyStep* early = impl->early.get();
  std::vector<uint32_t> before, after;
  {
    std::lock_guard<std::mutex> lk(early->mu);
    for (uint32_t h = 0; h < early->started.size(); ++h) {
      if (early->started[h]) (early->ran_early[h] ? before : after).push_back(h);
    }
  }
  bool grads_same = grads_unchanged(*impl, *early, before);
  join_early(early);  // every queued batch has run
  {
    std::vector<uint32_t> ran_after;
    for (uint32_t h : after) {
      if (early->ran_early[h]) ran_after.push_back(h);
    }
    grads_same = grads_same && grads_unchanged(*impl, *early, ran_after);
  }
  Impl::Baton b(impl);
  std::unique_ptr<Impl::EarlyStep> e = std::move(impl->early);
  struct Detach {
    Impl* impl;
    const Impl::EarlyStep& e;
    ~Detach() { detach_early_grads(impl, e); }
  } detach{impl, *e};
  if (!e->error.ok()) {
    Status rb = roll_back(impl->store, e.get());
    return rb.ok() ? e->error : rb;
  }
  // The speculation also assumed these options and each started tensor's hyperparameters.
  bool valid = grads_same && !e->nonfinite && o.grad_scale == e->opts.grad_scale &&
               o.max_grad_norm == e->opts.max_grad_norm &&
               o.skip_if_nonfinite == e->opts.skip_if_nonfinite;
  bool transient = false;
  for (uint32_t h = 0; h < impl->tensors.size(); ++h) {
    if (e->started[h] && e->used_hp[h] != impl->groups[impl->tensors[h].group].hp) valid = false;
    transient = transient || (e->started[h] && e->entries[h].transient);
  }
  // The global norm of a step with transient gradients comes from the caller (their
  // buffers are gone): without grad_summary it cannot be computed.
  if (transient && o.max_grad_norm > 0.0 && !o.grad_summary) valid = false;
  // Every batch that ran had its gradients scanned finite (a non-finite one made the
  // speculation invalid above): step_impl scans only the others.
  Impl::StartedSet set{&e->started, &e->entries, e->opts.grad_scale, false};
  Result<StepStats> r = Status::OK();
  bool mismatch = false;
  if (valid) {
    r = impl->step_impl(o, &set, &mismatch);
    if (!r.ok()) {
      Status rb = roll_back(impl->store, e.get());
      return rb.ok() ? r.status() : rb;
    }
  }
  if (!valid || mismatch) {
    STRATA_RETURN_IF_ERROR(roll_back(impl->store, e.get()));
    for (uint32_t h = 0; h < impl->tensors.size(); ++h) {
      if (e->started[h] && e->entries[h].transient) {
        return failed_precondition("offload finish_step: the step must be redone (skipped, "
                                   "clipped, or its options or hyperparameters changed) but "
                                   "the gradient of '" + impl->tensors[h].name +
                                   "' was not kept for a redo; every early update was rolled "
                                   "back");
      }
    }
    set.redo = true;
    r = impl->step_impl(o, &set, nullptr);
    if (!r.ok()) return r.status();
    r->rolled_back = true;
  }
  StepStats& s = *r;
  s.tensors_started_early = e->ran;
  s.early_seconds = e->stats.early_seconds;
  s.bytes_read += e->stats.bytes_read;
  s.bytes_written += e->stats.bytes_written;
  s.compute_seconds += e->stats.compute_seconds;
  s.io_wait_seconds += e->stats.io_wait_seconds;
  s.sub_groups += e->stats.sub_groups;
  s.seconds = seconds_since(t0);  // the exposed part: from finish_step() to its end
  impl->record(s);
  return r;
}

Status OffloadedOptimizer::abort_step() {
  Impl* impl = impl_.get();
  if (impl->early == nullptr) return Status::OK();
  join_early(impl->early.get());
  Impl::Baton b(impl);
  std::unique_ptr<Impl::EarlyStep> e = std::move(impl->early);
  detach_early_grads(impl, *e);
  return roll_back(impl->store, e.get());
}

}  // namespace strata::optimizer
