// The offloaded optimizer's step (see offload.hpp): gradient checks, DRAM tensors in place,
// and the sub-group pipeline of the NVMe tensors over the pinned slots.
//
// Pipeline (one step, NVMe tensors): the work is a list of items (tensor, begin, count) of
// at most sub_group_numel elements, in handle order, packed into batches: consecutive
// items that fit one slot together (each at a 4 KiB-aligned offset of the slot's streams),
// so a model of many small tensors costs a few round trips to the disk per step, not one
// per tensor. Batch j uses slot j % B. The reads of the first B batches (one read_range
// per run and stream, below) are issued at once; the reads of batch j >= B are a
// continuation (Future::then) of the writes of batch j - B, issued the moment they complete
// and the slot is free, whatever the calling thread is doing. The calling thread waits for
// the reads of batch i, runs apply_update() on each of its items (the kernel threads; an
// fp32 parameter copy is taken from the slot there), issues the writes of batch i
// (write_range per run and stream) and moves on.
//
// Runs: under num_buffers 0 a slot may hold several sub-groups (setup_resources), so the
// consecutive items of one tensor in a batch (continues_run: next in the tensor and in the
// slot) form a run, read and written as one range per fp32 stream (bf16 state streams:
// per item, their regions not being contiguous). A tensor has at most one run per batch;
// otherwise (a slot of one sub-group) its items never share a batch. Two runs of one
// tensor in consecutive batches whose boundary is not on a store chunk boundary share a
// chunk; the store forbids concurrent write_range() on one chunk (read-modify-write), so
// the writes of the second are a continuation of those of the first. The objects
// add_param() creates have chunks of whole sub-groups (Impl::chunk_bytes: at least
// kMinStateChunk where the store's chunk allows), and a slot of several sub-groups holds at
// least one such chunk, so that happens to objects made with other chunks (a store opened
// with another sub-group size), to sub-groups smaller than kMinStateChunk in slots of one,
// and at the ends of a tensor's runs that do not start on a chunk (after another tensor in
// the slot).
//
// Gradients in store objects (set_grad_object): an item of such a tensor also reads its
// slice of the gradient object (read_range, bytes [begin, begin + count) times the element
// size) into its slot's gradient region, at the item's offset; that read is one more
// future of the batch's reads, so it completes before the update, and the update takes
// the gradient from the region. Nothing is written back from it. The gate cannot scan such
// gradients (they are not in memory): a step that would scan them is refused up front
// (step_impl) unless StepOptions::grad_summary gives the gate's inputs.
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>

#include "offload_impl.hpp"
#include "strata/base/units.hpp"
#include "strata/optimizer/grad_utils.hpp"

namespace strata::optimizer {

using namespace offload_detail;

namespace {

/// The streams of host-tier tensors before a transactional step updates them (copies),
/// put back by restore() when the step fails.
class HostBackup {
 public:
  void save(const OffloadedOptimizer::Impl& impl, const OffloadedOptimizer::Impl::Tensor& t) {
    for (size_t s = 0; s < t.host.size(); ++s) {
      const char* p = reinterpret_cast<const char*>(t.host[s].data());
      saved_.emplace_back(reinterpret_cast<char*>(t.host[s].data()),
                          std::vector<char>(p, p + t.numel * impl.elem_bytes(static_cast<int>(s))));
    }
  }
  void restore() {
    for (auto& [dst, copy] : saved_) std::memcpy(dst, copy.data(), copy.size());
    saved_.clear();
  }

 private:
  std::vector<std::pair<char*, std::vector<char>>> saved_;
};

/// Elements per tile of the in-place conversions (8 KiB of fp32 on the stack).
constexpr uint64_t kConvertTile = 2048;

}  // namespace

void offload_detail::widen_bf16_in_place(float* data, uint64_t src_offset, uint64_t n) {
  const char* src = reinterpret_cast<const char*>(data) + src_offset;
  uint16_t tile[kConvertTile];
  for (uint64_t b = 0; b < n; b += kConvertTile) {
    const uint64_t c = std::min(kConvertTile, n - b);
    std::memcpy(tile, src + b * 2, c * 2);
    load_scaled_grad(tile, DType::kBFloat16, 1.0f, data + b, c);
  }
}

void offload_detail::narrow_bf16_in_place(float* data, uint64_t n) {
  char* dst = reinterpret_cast<char*>(data);
  uint16_t tile[kConvertTile];
  for (uint64_t b = 0; b < n; b += kConvertTile) {
    const uint64_t c = std::min(kConvertTile, n - b);
    store_converted(data + b, DType::kBFloat16, tile, c);
    std::memcpy(dst + b * 2, tile, c * 2);
  }
}

Status OffloadedOptimizer::Impl::update_host_bf16(const Tensor& t, const UpdateSpans& whole,
                                                  const StepInfo& info) {
  if (host_scratch.size() < static_cast<size_t>(num_states) * sg) {
    host_scratch.assign(static_cast<size_t>(num_states) * sg, 0.0f);
  }
  for (uint64_t b = 0; b < t.numel; b += sg) {
    const uint64_t c = std::min(sg, t.numel - b);
    UpdateSpans sp = whole;
    sp.param = whole.param + b;
    sp.grad = static_cast<const char*>(whole.grad) + b * dtype_size(whole.grad_type);
    if (whole.param_copy != nullptr) {
      sp.param_copy = static_cast<char*>(whole.param_copy) + b * dtype_size(whole.param_copy_type);
    }
    sp.numel = c;
    for (int k = 0; k < num_states; ++k) {
      float* w = host_scratch.data() + static_cast<uint64_t>(k) * sg;
      const uint16_t* src = reinterpret_cast<const uint16_t*>(t.host[1 + k].data()) + b;
      load_scaled_grad(src, DType::kBFloat16, 1.0f, w, c);
      sp.states[k] = w;
    }
    StepInfo in = info;
    in.offset = info.offset + b;
    STRATA_RETURN_IF_ERROR(apply_update(*groups[t.group].rule, sp, in, pool.get()));
    for (int k = 0; k < num_states; ++k) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(t.host[1 + k].data()) + b;
      store_converted(sp.states[k], DType::kBFloat16, dst, c);
    }
  }
  return Status::OK();
}

UpdateSpans OffloadedOptimizer::Impl::host_spans(const Tensor& t) const {
  UpdateSpans s;
  s.param = t.host[0].data();
  s.grad = t.grad;
  s.grad_type = t.grad_type;
  for (int k = 0; k < num_states; ++k) s.states[k] = t.host[1 + k].data();
  s.param_copy = t.copy;
  s.param_copy_type = t.copy_type;
  s.numel = t.numel;
  return s;
}

/// Runs the NVMe pipeline over `items` (packed into `batches`). The reads of the first B
/// batches are issued before `gate` runs, so the gradient checks (inf/NaN scan, global
/// norm: a pass over every gradient) and the in-place update of DRAM tensors overlap the
/// first reads instead of leaving the disk idle. Sets *skipped when the gate says skip.
Status OffloadedOptimizer::Impl::run_pipeline(const std::vector<Item>& items,
                                              const std::vector<size_t>& batches,
                                              const Gate& gate, StepStats& stats,
                                              bool* skipped) {
  *skipped = false;
  float grad_scale = 1.0f;
  const size_t n = batches.size() > 0 ? batches.size() - 1 : 0;  // batches[j]..batches[j+1]
  const size_t B = slots.size();
  const int S = num_streams();
  // reads[j] / writes[j]: every stream of every item of batch j read into / written from
  // its slot.
  std::vector<Future<void>> reads(n), writes(n);
  // Set when the loop ends: reads chained on earlier writes are no longer issued.
  auto stop = std::make_shared<std::atomic<bool>>(false);
  // Issues the reads or the writes of batch j; may run on the thread completing a previous
  // future (a continuation), which only issues requests and never blocks.
  auto issue = [this, &items, &batches, B, S](size_t j, bool write) -> Future<void> {
    std::vector<Future<void>> fs;
    for (size_t k = batches[j]; k < batches[j + 1];) {
      // The run [k, e): consecutive sub-groups of one tensor, consecutive in the slot too
      // (a slot of several sub-groups, num_buffers 0): one request per fp32 stream.
      size_t e = k + 1;
      while (e < batches[j + 1] && continues_run(items[e - 1], items[e])) ++e;
      const Item& first = items[k];
      const Tensor& t = tensors[first.t];
      const uint64_t run_count = items[e - 1].begin + items[e - 1].count - first.begin;
      // f(begin, count, slot_off) once over the run for 4-byte elements, else once per item
      // (2-byte elements sit at the start of each item's region: not contiguous).
      auto requests = [&](uint64_t es, auto&& f) {
        if (es == 4) return f(first.begin, run_count, first.slot_off);
        for (size_t q = k; q < e; ++q) f(items[q].begin, items[q].count, items[q].slot_off);
      };
      for (int s = 0; s < S; ++s) {
        if (!write && s == 0 && first.master != nullptr) {  // the master is in memory already
          std::memcpy(slot_stream(j % B, s) + first.slot_off, first.master + first.begin,
                      run_count * 4);
          continue;
        }
        // bf16 states: written from the region's start (narrowed there after the update),
        // read to its upper part (bf16_read_offset) and widened from there before it.
        const uint64_t es = elem_bytes(s);
        requests(es, [&](uint64_t begin, uint64_t count, uint64_t slot_off) {
          char* io = reinterpret_cast<char*>(slot_stream(j % B, s) + slot_off);
          if (!write && es == 2) io += bf16_read_offset(count);
          fs.push_back(write ? store->write_range_async(t.keys[s], begin * es, count * es, io)
                             : store->read_range_async(t.keys[s], begin * es, count * es, io));
        });
      }
      if (!write && first.grad_object) {  // the gradient's slice, into the gradient region
        const uint64_t es = dtype_size(first.grad_type);
        requests(es, [&](uint64_t begin, uint64_t count, uint64_t slot_off) {
          fs.push_back(store->read_range_async(t.grad_key, begin * es, count * es,
                                               slot_grad(j % B) + slot_off * 4));
        });
      }
      k = e;
    }
    return when_all(fs);
  };
  for (size_t j = 0; j < n && j < B; ++j) reads[j] = issue(j, false);
  Status st;
  {
    auto g = gate();
    if (!g.ok()) {
      st = g.status();
    } else if (!g->has_value()) {
      *skipped = true;
    } else {
      grad_scale = **g;
    }
  }
  for (size_t i = 0; i < n && st.ok() && !*skipped; ++i) {
    const auto t_wait = Clock::now();
    st = reads[i].result().status();
    stats.io_wait_seconds += seconds_since(t_wait);
    if (!st.ok()) break;
    // Update every item of the batch.
    const size_t slot = i % B;
    for (size_t k = batches[i]; k < batches[i + 1] && st.ok(); ++k) {
      const Item& it = items[k];
      Tensor& t = tensors[it.t];
      UpdateSpans sp;
      sp.param = slot_stream(slot, 0) + it.slot_off;
      if (it.grad_object) {  // read with the batch into the slot's gradient region
        sp.grad = slot_grad(slot) + it.slot_off * 4;
        sp.grad_type = it.grad_type;
      } else {
        const void* grad = it.grad != nullptr ? it.grad : t.grad;
        const DType grad_type = it.grad != nullptr ? it.grad_type : t.grad_type;
        sp.grad = static_cast<const char*>(grad) + it.begin * dtype_size(grad_type);
        sp.grad_type = grad_type;
      }
      for (int s = 0; s < num_states; ++s) sp.states[s] = slot_stream(slot, 1 + s) + it.slot_off;
      void* copy = it.copy != nullptr ? it.copy : t.copy;
      const DType copy_type = it.copy != nullptr ? it.copy_type : t.copy_type;
      if (copy != nullptr) {
        sp.param_copy = static_cast<char*>(copy) + it.begin * dtype_size(copy_type);
        sp.param_copy_type = copy_type;
      }
      sp.numel = it.count;
      if (bf16_states()) {  // widen the states read as bf16 (exact), in place
        for (int s = 0; s < num_states; ++s) {
          widen_bf16_in_place(sp.states[s], bf16_read_offset(it.count), it.count);
        }
      }
      StepInfo info;
      info.step = t.state.step() + 1;
      info.grad_scale = grad_scale;
      info.param = it.t;
      info.param_name = t.name;
      info.offset = it.begin;
      const auto t_compute = Clock::now();
      st = apply_update(*groups[t.group].rule, sp, info, pool.get());
      if (st.ok() && bf16_states()) {  // narrow the updated states (RNE) for the writes
        for (int s = 0; s < num_states; ++s) {
          narrow_bf16_in_place(sp.states[s], it.count);
        }
      }
      stats.compute_seconds += seconds_since(t_compute);
      stats.bytes_read += (bytes_per_element() - (it.master != nullptr ? 4 : 0)) * it.count;
      if (it.grad_object) stats.bytes_read += it.count * dtype_size(it.grad_type);
      stats.bytes_written += bytes_per_element() * it.count;
    }
    if (!st.ok()) break;
    stats.sub_groups += 1;
    // Write back; a chunk shared with the previous batch's writes waits for them.
    const Item& first = items[batches[i]];
    bool shares_chunk = false;  // with the previous item of its tensor, in some stream
    if (i > 0 && items[batches[i] - 1].t == first.t) {
      const auto& chunks = tensors[first.t].chunks;
      for (size_t s = 0; s < chunks.size(); ++s) {
        shares_chunk |= (first.begin * elem_bytes(static_cast<int>(s))) % chunks[s] != 0;
      }
    }
    if (shares_chunk) {
      writes[i] = writes[i - 1].then([issue, i](const Result<void>&) { return issue(i, true); });
    } else {
      writes[i] = issue(i, true);
    }
    // The slot is free once these writes are done: then the reads of batch i + B start.
    if (i + B < n) {
      reads[i + B] = writes[i].then([issue, stop, j = i + B](const Result<void>&) {
        if (stop->load()) return make_ready_future(Result<void>(cancelled("offload step stopped")));
        return issue(j, false);
      });
    }
  }
  stop->store(true);
  // Every issued request completes before the slots can be reused or the step returns.
  const auto t_drain = Clock::now();
  for (size_t j = 0; j < n; ++j) {
    reads[j].wait();
    writes[j].wait();
  }
  stats.io_wait_seconds += seconds_since(t_drain);
  if (!st.ok() || *skipped) return st;
  for (size_t j = 0; j < n; ++j) STRATA_RETURN_IF_ERROR(writes[j].result().status());
  return Status::OK();
}

void OffloadedOptimizer::Impl::plan_items(
    const std::vector<std::pair<uint32_t, const EarlyGrad*>>& work, std::vector<Item>& items,
    std::vector<size_t>& batches) const {
  const uint64_t slot_numel = stream_stride / 4, page_numel = kAlign / 4;
  uint64_t fill = slot_numel;  // elements taken in the current batch (none open yet)
  for (const auto& [h, e] : work) {
    const Tensor& t = tensors[h];
    for (uint64_t b = 0; b < t.numel; b += sg) {
      const uint64_t count = std::min(sg, t.numel - b);
      const uint64_t padded = align_up(count, page_numel);
      if (fill + padded > slot_numel) {
        batches.push_back(items.size());
        fill = 0;
      }
      Item it{h, b, count, fill};
      if (e != nullptr) {
        it.grad = e->grad;
        it.grad_type = e->grad_type;
        it.copy = e->param_copy;
        it.copy_type = e->param_copy_type;
        it.master = e->master;
      } else if (!t.grad_key.empty()) {  // set_grad_object: read with the batch
        it.grad_object = true;
        it.grad_type = t.grad_type;
      }
      items.push_back(it);
      fill += padded;
    }
  }
  batches.push_back(items.size());  // the end of the last batch
}

Result<StepStats> OffloadedOptimizer::Impl::step_impl(const StepOptions& o,
                                                      const StartedSet* started,
                                                      bool* mismatch) {
  const auto t0 = Clock::now();
  StepStats stats;
  STRATA_RETURN_IF_ERROR(check_open("offload step"));
  // grad_scale 0 is a gradient scaled to nothing (a clip coefficient that underflowed, as
  // torch's clip_grad_norm_ would multiply by it); a negative one would ascend.
  if (!(o.max_grad_norm >= 0.0) || !std::isfinite(o.grad_scale) || o.grad_scale < 0.0f) {
    return invalid_argument("offload step: max_grad_norm must be >= 0 and grad_scale finite "
                            "and >= 0, got max_grad_norm " + std::to_string(o.max_grad_norm) +
                            ", grad_scale " + std::to_string(o.grad_scale));
  }
  if (o.grad_summary && o.grad_summary->grad_norm < 0.0) {
    return invalid_argument("offload step: grad_summary.grad_norm must be >= 0 (an L2 norm), "
                            "got " + std::to_string(o.grad_summary->grad_norm));
  }
  // Early updates: the tensors already updated (skipped here unless redoing), and each
  // tensor's start_update() entry (its gradient and param copy override the attached ones).
  const bool speculating = started != nullptr && !started->redo;
  auto is_started = [&](uint32_t h) { return speculating && (*started->started)[h]; };
  auto early_entry = [&](uint32_t h) -> const EarlyGrad* {
    if (started == nullptr) return nullptr;
    const EarlyGrad& e = (*started->early_grads)[h];
    return e.grad != nullptr ? &e : nullptr;
  };
  std::vector<uint32_t> active;
  std::vector<GradView> views;
  std::vector<GradView> unscanned;  // speculating: the gradients of tensors not started
  // A gradient in a store object (set_grad_object, no start_update() entry) is read by the
  // pipeline and never in memory: not in `views`, so the gate must not need to scan it.
  const bool scan = !o.grad_summary && (o.max_grad_norm > 0.0 || o.skip_if_nonfinite);
  for (uint32_t h = 0; h < tensors.size(); ++h) {
    const Tensor& t = tensors[h];
    if (!t.has_grad()) continue;
    active.push_back(h);
    const EarlyGrad* e = early_entry(h);
    if (e == nullptr && !t.grad_key.empty()) {
      if (t.numel == 0) continue;  // nothing to scan or read
      if (scan) {
        return invalid_argument(
            "offload step: the gradient of '" + t.name + "' is the store object '" +
            t.grad_key + "' (set_grad_object), which the step cannot scan from memory for " +
            (o.max_grad_norm > 0.0 ? "clipping (max_grad_norm > 0)"
                                   : "the inf/NaN check (skip_if_nonfinite)") +
            ": pass StepOptions::grad_summary (the global norm and inf/NaN flag of every "
            "gradient, computed by the caller), or max_grad_norm=0 and "
            "skip_if_nonfinite=false");
      }
      // The object may have been replaced or removed since set_grad_object(): checked
      // again before anything changes, so it is never read past its end or as another dtype.
      STRATA_RETURN_IF_ERROR(check_grad_object(t, t.grad_key, t.grad_type, "offload step"));
      continue;
    }
    views.push_back(e != nullptr ? GradView{e->grad, e->grad_type, t.numel}
                                 : GradView{t.grad, t.grad_type, t.numel});
    if (started == nullptr || started->redo || !(*started->started)[h]) {
      unscanned.push_back(views.back());
    }
  }
  // Items of at most sg elements, packed into batches of one slot each: batch j holds
  // items [batches[j], batches[j + 1]), each at a 4 KiB-aligned offset of the streams.
  std::vector<std::pair<uint32_t, const EarlyGrad*>> work;
  for (uint32_t h : active) {
    if (tensors[h].placement == Placement::kHost || is_started(h)) continue;
    work.emplace_back(h, early_entry(h));
  }
  std::vector<Item> items;
  std::vector<size_t> batches;
  plan_items(work, items, batches);
  // A rule that may fail (UpdateRule::may_fail: a Python callable) makes the step a
  // transaction: a savepoint of the NVMe tensors' objects and a copy of each host tensor's
  // streams before its update, restored when the step fails. Overlapped steps have their
  // own savepoints (offload_overlap.cpp).
  bool transactional = false;
  for (uint32_t h : active) transactional |= groups[tensors[h].group].rule->may_fail();
  transactional = transactional && started == nullptr;
  Savepoint savepoint;
  HostBackup host_backup;
  if (transactional) {
    std::vector<std::string> keys;
    for (const auto& [h, e] : work) {
      for (const std::string& k : tensors[h].keys) keys.push_back(k);
    }
    if (!keys.empty()) {
      STRATA_ASSIGN_OR_RETURN(savepoint, store->savepoint(keys));
    }
  }
  // Runs while the first NVMe reads are in flight: gradient checks, then DRAM tensors in
  // place. nullopt = skip the step (nothing has changed yet).
  auto gate = [&]() -> Result<std::optional<float>> {
    // The inputs: given by the caller (grad_summary), else scanned from the attached
    // gradients; the decision is decide_gate()'s either way.
    double norm = 0.0;
    bool nonfinite = false;
    NormArithmetic arithmetic = NormArithmetic::kStrata;
    if (o.grad_summary) {
      norm = o.grad_summary->grad_norm;
      nonfinite = o.grad_summary->nonfinite;
      arithmetic = o.grad_summary->arithmetic;
    } else if (o.max_grad_norm > 0.0) {
      STRATA_ASSIGN_OR_RETURN(norm, global_l2_norm(views, pool.get()));
      nonfinite = !std::isfinite(norm);
    } else if (o.skip_if_nonfinite) {
      STRATA_ASSIGN_OR_RETURN(nonfinite,
                              has_inf_or_nan(speculating ? unscanned : views, pool.get()));
    }
    const GateDecision d = decide_gate(o.max_grad_norm, o.grad_scale, o.skip_if_nonfinite,
                                       norm, nonfinite, arithmetic);
    stats.grad_norm = d.grad_norm;
    stats.clip_coef = d.clip_coef;
    if (d.skip) {
      if (speculating) *mismatch = true;
      return std::optional<float>();
    }
    const float scale = d.grad_scale;
    if (speculating && scale != started->expected_scale) {
      *mismatch = true;  // the early updates used another scale: nothing more is updated
      return std::optional<float>();
    }
    for (uint32_t h : active) {
      Tensor& t = tensors[h];
      stats.tensors_updated += 1;
      stats.numel_updated += t.numel;
      if (t.placement != Placement::kHost) continue;
      StepInfo info;
      info.step = t.state.step() + 1;
      info.grad_scale = scale;
      info.param = h;
      info.param_name = t.name;
      UpdateSpans sp = host_spans(t);
      if (const EarlyGrad* e = early_entry(h); e != nullptr && e->param_copy != nullptr) {
        sp.param_copy = e->param_copy;
        sp.param_copy_type = e->param_copy_type;
      }
      if (transactional) host_backup.save(*this, t);
      const auto tc = Clock::now();
      if (bf16_states()) {
        STRATA_RETURN_IF_ERROR(update_host_bf16(t, sp, info));
      } else {
        STRATA_RETURN_IF_ERROR(apply_update(*groups[t.group].rule, sp, info, pool.get()));
      }
      stats.compute_seconds += seconds_since(tc);
    }
    return std::optional<float>(scale);
  };
  bool skipped = false;
  if (Status st = run_pipeline(items, batches, gate, stats, &skipped); !st.ok()) {
    // A rule that may fail: the step is undone (savepoint, host copies) and the optimizer
    // stays usable; else, or when undoing fails, host tensors or NVMe chunks may be
    // updated while the counters are not.
    if (transactional) {
      Status undo = savepoint.empty() ? Status::OK() : store->rollback(savepoint);
      if (undo.ok()) {
        host_backup.restore();
        return st.with_context("offload step (rolled back: every tensor is as before the "
                               "step)");
      }
      broken = st;
      return st.with_context("offload step (rolling it back failed too: " + undo.message() +
                             ")");
    }
    broken = st;  // host tensors or NVMe chunks may be updated, counters are not
    return st;
  }
  if (skipped) {
    stats.skipped = true;
    stats.tensors_updated = 0;
    stats.numel_updated = 0;
    stats.seconds = seconds_since(t0);
    return stats;
  }
  for (uint32_t h : active) tensors[h].state.advance();
  changed = changed || !active.empty();
  stats.seconds = seconds_since(t0);
  return stats;
}

}  // namespace strata::optimizer
