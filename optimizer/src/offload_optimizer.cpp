// The offloaded optimizer (see offload.hpp): tensors in DRAM or NVMe, the sub-group
// pipeline over pinned slots, the checkpoint record.
//
// Pipeline (one step, NVMe tensors): the work is a list of items (tensor, begin, count) of
// at most sub_group_numel elements, in handle order. Item j uses slot j % B. Its reads
// (one read_range per stream) are issued as soon as the slot is free, i.e. when the writes
// of item j - B are complete, and at most B - 1 items ahead of the item being updated. The
// calling thread waits for the reads of item i, runs apply_update() on the slot (the
// kernel's thread pool), then issues the writes of item i (write_range per stream) and
// moves on. Completions wake the loop through one condition variable, so reads of later
// items are issued the moment a slot frees, whatever the loop is waiting for. Two items of
// one tensor whose boundary is not on a store chunk boundary share a chunk; the store
// forbids concurrent write_range() on one chunk (read-modify-write), so the writes of the
// second wait for those of the first.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <functional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "strata/base/logging.hpp"
#include "strata/base/units.hpp"
#include "strata/optimizer/grad_utils.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/optimizer/thread_pool.hpp"
#include "strata/store/pinned_pool.hpp"

namespace strata::optimizer {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kAlign = 4096;
constexpr int kMaxBuffers = 16;
constexpr const char* kMetaMagic = "strata-offload-meta";
constexpr int kMetaVersion = 1;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Anonymous private memory (transparent huge pages when allowed), zero-filled.
class HostArray {
 public:
  HostArray() = default;
  static Result<HostArray> allocate(uint64_t nbytes) {
    HostArray a;
    a.nbytes_ = std::max<uint64_t>(align_up(nbytes, kAlign), kAlign);
    void* p = ::mmap(nullptr, a.nbytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (p == MAP_FAILED) {
      return errno_status(errno, "host tier: mmap of " + format_bytes(a.nbytes_));
    }
    (void)::madvise(p, a.nbytes_, MADV_HUGEPAGE);
    a.p_ = static_cast<float*>(p);
    return a;
  }
  HostArray(HostArray&& o) noexcept : p_(o.p_), nbytes_(o.nbytes_) { o.p_ = nullptr; }
  HostArray& operator=(HostArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(nbytes_, o.nbytes_);
    return *this;
  }
  ~HostArray() {
    if (p_ != nullptr) ::munmap(p_, nbytes_);
  }
  float* data() const { return p_; }

 private:
  float* p_ = nullptr;
  uint64_t nbytes_ = 0;
};

// A read-only view of `nbytes` zero bytes that costs no DRAM: untouched anonymous pages
// all map the kernel's shared zero page (not counted in RSS).
class ZeroView {
 public:
  explicit ZeroView(uint64_t nbytes) : nbytes_(std::max<uint64_t>(align_up(nbytes, kAlign), kAlign)) {
    void* p = ::mmap(nullptr, nbytes_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    p_ = p == MAP_FAILED ? nullptr : p;
  }
  ~ZeroView() {
    if (p_ != nullptr) ::munmap(p_, nbytes_);
  }
  ZeroView(const ZeroView&) = delete;
  ZeroView& operator=(const ZeroView&) = delete;
  const void* data() const { return p_; }

 private:
  uint64_t nbytes_;
  void* p_ = nullptr;
};

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

bool valid_hp_key(std::string_view k) {
  if (k.empty()) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  }
  return true;
}

std::string hexdouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

}  // namespace

// ------------------------------------------------------------------------------ Impl

struct OffloadedOptimizer::Impl {
  struct Group {
    Hyperparams hp;
    std::unique_ptr<UpdateRule> rule;
  };
  struct Tensor {
    std::string name;
    uint64_t numel = 0;
    Placement placement = Placement::kNvme;
    int group = 0;
    ParamState state;
    int64_t durable_step = 0;  // host tensors: step of the backing objects' contents
    const void* grad = nullptr;
    DType grad_type = DType::kFloat32;
    void* copy = nullptr;
    DType copy_type = DType::kBFloat16;
    std::vector<std::string> keys;  // [0] master, [1 + k] state stream k
    std::vector<HostArray> host;    // kHost only: same indexing as keys
  };

  std::shared_ptr<Store> store;
  RuleFactory factory;
  OffloadOptions opts;
  std::string rule_name;
  int num_states = 0;
  std::vector<std::string> state_names;
  std::vector<float> state_inits;
  std::vector<Group> groups;
  std::vector<Tensor> tensors;
  std::unordered_map<std::string, ParamHandle> by_name;
  uint64_t host_bytes = 0;

  std::unique_ptr<ThreadPool> pool;
  std::shared_ptr<PinnedPool> pinned;
  std::vector<PinnedBuffer> slots;
  uint64_t sg = 0;            // sub-group elements
  uint64_t stream_stride = 0; // bytes between streams inside a slot
  uint64_t chunk_bytes = 0;

  // Serialization of members: the baton (busy) is held by one call at a time.
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  mutable bool busy = false;
  std::thread async_thread;

  class Baton {
   public:
    explicit Baton(const Impl* impl) : impl_(impl) {
      std::unique_lock<std::mutex> lk(impl_->mu);
      impl_->cv.wait(lk, [&] { return !impl_->busy; });
      impl_->busy = true;
    }
    ~Baton() {
      {
        std::lock_guard<std::mutex> lk(impl_->mu);
        impl_->busy = false;
      }
      impl_->cv.notify_all();
    }
    Baton(const Baton&) = delete;
    Baton& operator=(const Baton&) = delete;

   private:
    const Impl* impl_;
  };

  std::string key_of(const std::string& name, int stream) const {
    return opts.key_prefix + "p/" + name + "/" +
           (stream == 0 ? std::string("param") : state_names[stream - 1]);
  }
  std::string meta_key() const { return opts.key_prefix + "meta"; }
  int num_streams() const { return 1 + num_states; }

  Status check_handle(ParamHandle h) const {
    if (h >= tensors.size()) {
      return out_of_range("offload: parameter handle " + std::to_string(h) + " is out of range (" +
                          std::to_string(tensors.size()) + " parameters)");
    }
    return Status::OK();
  }

  // Builds a group's rule and checks it matches the optimizer's state streams.
  Result<std::unique_ptr<UpdateRule>> build_rule(const Hyperparams& hp) const {
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

  Status init_from_rule(const UpdateRule& rule) {
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

  // Resolves the sub-group size and allocates the pinned slots and the thread pool.
  Status setup_resources() {
    if (opts.num_buffers < 1 || opts.num_buffers > kMaxBuffers) {
      return invalid_argument("OffloadOptions.num_buffers " + std::to_string(opts.num_buffers) +
                              " is outside 1.." + std::to_string(kMaxBuffers));
    }
    chunk_bytes = store->chunk_bytes();
    const uint64_t B = static_cast<uint64_t>(opts.num_buffers);
    const uint64_t S = static_cast<uint64_t>(num_streams());
    auto slot_bytes = [&](uint64_t n) { return S * align_up(n * 4, kAlign); };
    if (opts.sub_group_numel > 0) {
      sg = opts.sub_group_numel;
      if (sg > (~uint64_t{0} / 4 - kAlign) / (B * S)) {  // B * S * 4 * sg would overflow
        return invalid_argument("OffloadOptions.sub_group_numel " + std::to_string(sg) +
                                " is too large: " + std::to_string(B) + " buffers x " +
                                std::to_string(S) + " streams x 4 bytes overflow 64 bits");
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
    stream_stride = align_up(sg * 4, kAlign);
    PinnedPoolOptions po;
    po.budget_bytes = B * slot_bytes(sg);
    po.numa_node = opts.numa_node;
    po.alignment = kAlign;
    STRATA_ASSIGN_OR_RETURN(pinned, PinnedPool::create(po, store->engine()));
    for (uint64_t b = 0; b < B; ++b) {
      STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, pinned->try_allocate(slot_bytes(sg)));
      slots.push_back(std::move(buf));
    }
    ThreadPoolOptions to;
    to.num_threads = opts.num_threads;
    to.numa_node = opts.numa_node;
    STRATA_ASSIGN_OR_RETURN(pool, ThreadPool::create(to));
    return Status::OK();
  }

  float* slot_stream(size_t slot, int stream) const {
    return reinterpret_cast<float*>(static_cast<char*>(slots[slot].data()) +
                                    static_cast<uint64_t>(stream) * stream_stride);
  }

  // ---- checkpoint record ----------------------------------------------------------------

  std::string serialize_meta() const {
    std::ostringstream o;
    o << kMetaMagic << ' ' << kMetaVersion << '\n';
    o << "rule " << rule_name << ' ' << num_states << '\n';
    o << "groups " << groups.size() << '\n';
    for (const auto& g : groups) {
      o << "group " << g.hp.size();
      for (const auto& [k, v] : g.hp) o << ' ' << k << '=' << hexdouble(v);
      o << '\n';
    }
    o << "params " << tensors.size() << '\n';
    for (const auto& t : tensors) {
      const bool host = t.placement == Placement::kHost;
      o << "param " << t.name << ' ' << t.numel << ' ' << (host ? "host" : "nvme") << ' '
        << t.group << ' ' << t.state.step() << ' ' << (host ? t.durable_step : t.state.step())
        << '\n';
    }
    o << "end\n";
    return o.str();
  }

  struct MetaRecord {
    std::string rule;
    int num_states = 0;
    std::vector<Hyperparams> groups;
    struct P {
      std::string name;
      uint64_t numel;
      Placement placement;
      int group;
      int64_t step, durable_step;
    };
    std::vector<P> params;
  };

  static Result<MetaRecord> parse_meta(const std::string& text, const std::string& key) {
    auto bad = [&](const std::string& what) {
      return data_loss("offload: checkpoint record '" + key + "' is malformed: " + what);
    };
    std::istringstream in(text);
    std::string word;
    int version = 0;
    MetaRecord m;
    if (!(in >> word >> version) || word != kMetaMagic) return bad("bad magic");
    if (version != kMetaVersion) return bad("unsupported version " + std::to_string(version));
    if (!(in >> word >> m.rule >> m.num_states) || word != "rule") return bad("no rule line");
    size_t ng = 0;
    if (!(in >> word >> ng) || word != "groups" || ng == 0 || ng > 1000000) return bad("groups");
    for (size_t g = 0; g < ng; ++g) {
      size_t nk = 0;
      if (!(in >> word >> nk) || word != "group") return bad("group " + std::to_string(g));
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
    size_t np = 0;
    if (!(in >> word >> np) || word != "params") return bad("params");
    for (size_t i = 0; i < np; ++i) {
      MetaRecord::P p;
      std::string tier;
      if (!(in >> word >> p.name >> p.numel >> tier >> p.group >> p.step >> p.durable_step) ||
          word != "param") {
        return bad("param line " + std::to_string(i));
      }
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

  // Replaces the record by the current state: a pinned, dirty host-tier object, committed by
  // the next Store::flush() together with the NVMe tensors' pending chunks.
  Status put_meta() {
    std::string text = serialize_meta();
    PutOptions po;
    po.tier = Tier::kHost;
    po.overwrite = true;
    po.pin = true;
    return store
        ->put(meta_key(), text.data(), TensorDesc::bytes(text.size()), po)
        .result()
        .status()
        .with_context("offload: writing the checkpoint record");
  }

  // ---- tensors --------------------------------------------------------------------------

  // Writes `value` over elements [0, numel) of NVMe object `key` through slot 0.
  Status fill_object(const std::string& key, uint64_t numel, float value) {
    float* buf = slot_stream(0, 0);
    const uint64_t n = std::min<uint64_t>(sg, numel);
    std::fill(buf, buf + n, value);
    for (uint64_t b = 0; b < numel; b += sg) {
      const uint64_t c = std::min(sg, numel - b);
      STRATA_RETURN_IF_ERROR(store->write_range_sync(key, b * 4, c * 4, buf));
    }
    return Status::OK();
  }

  Result<ParamHandle> add_param(std::string_view name_in, uint64_t numel, const float* init,
                                int group, Placement placement) {
    std::string name(name_in);
    if (!valid_name(name)) {
      return invalid_argument("offload: parameter name '" + name +
                              "' must be non-empty printable ASCII without whitespace");
    }
    if (by_name.count(name)) {
      return invalid_argument("offload: parameter '" + name + "' already exists");
    }
    if (numel == 0) return invalid_argument("offload: parameter '" + name + "' has numel 0");
    if (group < 0 || static_cast<size_t>(group) >= groups.size()) {
      return invalid_argument("offload: parameter '" + name + "': no param group " +
                              std::to_string(group));
    }
    const uint64_t bytes_all = numel * 4 * static_cast<uint64_t>(num_streams());
    if (placement == Placement::kAuto) placement = opts.default_placement;
    if (placement == Placement::kAuto) {
      placement = host_bytes + bytes_all <= opts.host_budget_bytes ? Placement::kHost
                                                                    : Placement::kNvme;
    }
    Tensor t;
    t.name = name;
    t.numel = numel;
    t.placement = placement;
    t.group = group;
    for (int s = 0; s < num_streams(); ++s) t.keys.push_back(key_of(name, s));
    const TensorDesc desc{DType::kFloat32, {static_cast<int64_t>(numel)}};
    PutOptions po;
    po.tier = Tier::kNvme;
    po.overwrite = true;  // leftovers of a crashed, never-checkpointed add_param
    if (placement == Placement::kHost) {
      for (int s = 0; s < num_streams(); ++s) {
        STRATA_ASSIGN_OR_RETURN(HostArray a, HostArray::allocate(numel * 4));
        if (s == 0 && init != nullptr) std::memcpy(a.data(), init, numel * 4);
        if (s > 0 && state_inits[s - 1] != 0.0f) {
          std::fill(a.data(), a.data() + numel, state_inits[s - 1]);
        }
        t.host.push_back(std::move(a));
      }
      std::vector<Future<void>> futs;
      for (int s = 0; s < num_streams(); ++s) {
        futs.push_back(store->put(t.keys[s], t.host[s].data(), desc, po));
      }
      STRATA_RETURN_IF_ERROR(when_all(futs).result().status().with_context(
          "offload: creating parameter '" + name + "'"));
      host_bytes += bytes_all;
    } else {
      ZeroView zeros(numel * 4);
      if (zeros.data() == nullptr) {
        return errno_status(errno, "offload: mapping " + format_bytes(numel * 4) + " of zeros");
      }
      std::vector<Future<void>> futs;
      for (int s = 0; s < num_streams(); ++s) {
        const void* src = (s == 0 && init != nullptr) ? static_cast<const void*>(init) : zeros.data();
        futs.push_back(store->put(t.keys[s], src, desc, po));
      }
      STRATA_RETURN_IF_ERROR(when_all(futs).result().status().with_context(
          "offload: creating parameter '" + name + "'"));
      for (int s = 1; s < num_streams(); ++s) {
        if (state_inits[s - 1] != 0.0f) {
          STRATA_RETURN_IF_ERROR(fill_object(t.keys[s], numel, state_inits[s - 1]));
        }
      }
    }
    const ParamHandle h = static_cast<ParamHandle>(tensors.size());
    by_name[name] = h;
    tensors.push_back(std::move(t));
    return h;
  }

  // Range helpers for read/write_param/state.
  Status check_range(ParamHandle h, int stream, uint64_t offset, uint64_t& count) const {
    STRATA_RETURN_IF_ERROR(check_handle(h));
    if (stream < 0 || stream >= num_streams()) {
      return out_of_range("offload: state stream " + std::to_string(stream - 1) +
                          " is out of range (" + std::to_string(num_states) + " streams)");
    }
    const uint64_t numel = tensors[h].numel;
    if (count == kToEnd) count = offset <= numel ? numel - offset : 0;
    if (offset > numel || count > numel - offset) {
      return out_of_range("offload: elements [" + std::to_string(offset) + ", " +
                          std::to_string(offset + count) + ") of '" + tensors[h].name +
                          "' are past its end (" + std::to_string(numel) + ")");
    }
    return Status::OK();
  }

  Status read_stream(ParamHandle h, int stream, float* dst, uint64_t offset, uint64_t count) {
    STRATA_RETURN_IF_ERROR(check_range(h, stream, offset, count));
    if (count == 0) return Status::OK();
    if (dst == nullptr) return invalid_argument("offload: destination is null");
    const Tensor& t = tensors[h];
    if (t.placement == Placement::kHost) {
      std::memcpy(dst, t.host[stream].data() + offset, count * 4);
      return Status::OK();
    }
    return store->read_range_sync(t.keys[stream], offset * 4, count * 4, dst);
  }

  Status write_stream(ParamHandle h, int stream, const float* src, uint64_t offset,
                      uint64_t count) {
    STRATA_RETURN_IF_ERROR(check_range(h, stream, offset, count));
    if (count == 0) return Status::OK();
    if (src == nullptr) return invalid_argument("offload: source is null");
    Tensor& t = tensors[h];
    if (t.placement == Placement::kHost) {
      std::memcpy(t.host[stream].data() + offset, src, count * 4);
      return Status::OK();
    }
    return store->write_range_sync(t.keys[stream], offset * 4, count * 4, src);
  }

  // ---- step -----------------------------------------------------------------------------

  UpdateSpans host_spans(const Tensor& t) const {
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

  struct Item {
    uint32_t t;
    uint64_t begin, count;
  };

  /// Decides, once the first reads are in flight, whether the step goes ahead and with which
  /// gradient scale: nullopt skips the step (nothing is written).
  using Gate = std::function<Result<std::optional<float>>()>;

  /// Runs the NVMe pipeline over `items`. The reads of the first B items are issued before
  /// `gate` runs, so the gradient checks (inf/NaN scan, global norm: a pass over every
  /// gradient) and the in-place update of DRAM tensors overlap the first reads instead of
  /// leaving the disk idle. Sets *skipped when the gate says skip.
  Status run_pipeline(const std::vector<Item>& items, const Gate& gate, StepStats& stats,
                      bool* skipped) {
    *skipped = false;
    float grad_scale = 1.0f;
    const size_t n = items.size();
    const size_t B = slots.size();
    const int S = num_streams();
    struct Sync {
      std::mutex mu;
      std::condition_variable cv;
      uint64_t events = 0;
    };
    auto sync = std::make_shared<Sync>();
    auto watch = [sync](const Future<void>& f) {
      f.on_ready([sync](const Result<void>&) {
        {
          std::lock_guard<std::mutex> lk(sync->mu);
          ++sync->events;
        }
        sync->cv.notify_all();
      });
    };
    std::vector<std::vector<Future<void>>> reads(n), writes(n);
    auto all_ready = [](const std::vector<Future<void>>& fs) {
      for (const auto& f : fs) {
        if (!f.ready()) return false;
      }
      return true;
    };
    auto first_error = [](const std::vector<Future<void>>& fs) -> Status {
      for (const auto& f : fs) {
        if (!f.result().ok()) return f.result().status();
      }
      return Status::OK();
    };
    auto issue_reads = [&](size_t j) {
      const Item& it = items[j];
      const Tensor& t = tensors[it.t];
      for (int s = 0; s < S; ++s) {
        auto f = store->read_range(t.keys[s], it.begin * 4, it.count * 4, slot_stream(j % B, s));
        watch(f);
        reads[j].push_back(std::move(f));
      }
    };
    size_t next = 0;
    Status st;
    while (next < n && next < B) issue_reads(next++);
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
      // Issue every read whose slot is free, then wait for this item's reads.
      const auto t_wait = Clock::now();
      for (;;) {
        uint64_t seen;
        {
          std::lock_guard<std::mutex> lk(sync->mu);
          seen = sync->events;
        }
        while (next < n && next < i + B && (next < B || all_ready(writes[next - B]))) {
          issue_reads(next++);
        }
        if (next > i && all_ready(reads[i])) break;
        std::unique_lock<std::mutex> lk(sync->mu);
        sync->cv.wait(lk, [&] { return sync->events != seen; });
      }
      stats.io_wait_seconds += seconds_since(t_wait);
      st = first_error(reads[i]);
      if (!st.ok()) break;
      // Update.
      const Item& it = items[i];
      Tensor& t = tensors[it.t];
      const size_t slot = i % B;
      UpdateSpans sp;
      sp.param = slot_stream(slot, 0);
      sp.grad = static_cast<const char*>(t.grad) + it.begin * dtype_size(t.grad_type);
      sp.grad_type = t.grad_type;
      for (int k = 0; k < num_states; ++k) sp.states[k] = slot_stream(slot, 1 + k);
      if (t.copy != nullptr) {
        sp.param_copy = static_cast<char*>(t.copy) + it.begin * dtype_size(t.copy_type);
        sp.param_copy_type = t.copy_type;
      }
      sp.numel = it.count;
      StepInfo info;
      info.step = t.state.step() + 1;
      info.grad_scale = grad_scale;
      const auto t_compute = Clock::now();
      st = apply_update(*groups[t.group].rule, sp, info, pool.get());
      stats.compute_seconds += seconds_since(t_compute);
      if (!st.ok()) break;
      // Write back; a chunk shared with the previous item's writes must wait for them.
      if (i > 0 && items[i - 1].t == it.t && (it.begin * 4) % chunk_bytes != 0) {
        const auto t_w = Clock::now();
        for (const auto& f : writes[i - 1]) f.wait();
        stats.io_wait_seconds += seconds_since(t_w);
      }
      for (int s = 0; s < S; ++s) {
        auto f = store->write_range(t.keys[s], it.begin * 4, it.count * 4, slot_stream(slot, s));
        watch(f);
        writes[i].push_back(std::move(f));
      }
      stats.bytes_read += static_cast<uint64_t>(S) * it.count * 4;
      stats.bytes_written += static_cast<uint64_t>(S) * it.count * 4;
    }
    // Every issued request completes before the slots can be reused or the step returns.
    const auto t_drain = Clock::now();
    for (size_t j = 0; j < n; ++j) {
      for (const auto& f : reads[j]) f.wait();
      for (const auto& f : writes[j]) f.wait();
    }
    stats.io_wait_seconds += seconds_since(t_drain);
    if (!st.ok() || *skipped) return st;
    for (size_t j = 0; j < n; ++j) {
      STRATA_RETURN_IF_ERROR(first_error(writes[j]));
    }
    return Status::OK();
  }

  Result<StepStats> step(const StepOptions& o) {
    const auto t0 = Clock::now();
    StepStats stats;
    if (!(o.max_grad_norm >= 0.0) || !std::isfinite(o.grad_scale)) {
      return invalid_argument("offload step: max_grad_norm must be >= 0 and grad_scale finite");
    }
    std::vector<uint32_t> active;
    std::vector<GradView> views;
    for (uint32_t h = 0; h < tensors.size(); ++h) {
      if (tensors[h].grad != nullptr) {
        active.push_back(h);
        views.push_back({tensors[h].grad, tensors[h].grad_type, tensors[h].numel});
      }
    }
    std::vector<Item> items;
    for (uint32_t h : active) {
      const Tensor& t = tensors[h];
      if (t.placement == Placement::kHost) continue;
      for (uint64_t b = 0; b < t.numel; b += sg) items.push_back({h, b, std::min(sg, t.numel - b)});
    }
    // Runs while the first NVMe reads are in flight: gradient checks, then DRAM tensors in
    // place. nullopt = skip the step (nothing has changed yet).
    auto gate = [&]() -> Result<std::optional<float>> {
      float scale = o.grad_scale;
      if (o.max_grad_norm > 0.0) {
        STRATA_ASSIGN_OR_RETURN(double norm, global_l2_norm(views, pool.get()));
        stats.grad_norm = norm * std::fabs(static_cast<double>(o.grad_scale));
        if (!std::isfinite(stats.grad_norm)) {
          if (o.skip_if_nonfinite) return std::optional<float>();
        } else {
          stats.clip_coef = clip_coefficient(stats.grad_norm, o.max_grad_norm);
          scale = static_cast<float>(static_cast<double>(o.grad_scale) * stats.clip_coef);
        }
      } else if (o.skip_if_nonfinite) {
        STRATA_ASSIGN_OR_RETURN(bool bad, has_inf_or_nan(views, pool.get()));
        if (bad) return std::optional<float>();
      }
      for (uint32_t h : active) {
        Tensor& t = tensors[h];
        stats.tensors_updated += 1;
        stats.numel_updated += t.numel;
        if (t.placement != Placement::kHost) continue;
        StepInfo info;
        info.step = t.state.step() + 1;
        info.grad_scale = scale;
        const auto tc = Clock::now();
        STRATA_RETURN_IF_ERROR(apply_update(*groups[t.group].rule, host_spans(t), info, pool.get()));
        stats.compute_seconds += seconds_since(tc);
      }
      return std::optional<float>(scale);
    };
    bool skipped = false;
    STRATA_RETURN_IF_ERROR(run_pipeline(items, gate, stats, &skipped));
    if (skipped) {
      stats.skipped = true;
      stats.tensors_updated = 0;
      stats.numel_updated = 0;
      stats.seconds = seconds_since(t0);
      return stats;
    }
    for (uint32_t h : active) tensors[h].state.advance();
    STRATA_RETURN_IF_ERROR(put_meta());
    stats.seconds = seconds_since(t0);
    return stats;
  }

  Status checkpoint() {
    std::vector<Future<void>> futs;
    for (const auto& t : tensors) {
      if (t.placement != Placement::kHost) continue;
      for (int s = 0; s < num_streams(); ++s) {
        futs.push_back(store->write_range(t.keys[s], 0, t.numel * 4, t.host[s].data()));
      }
    }
    STRATA_RETURN_IF_ERROR(when_all(futs).result().status().with_context(
        "offload checkpoint: writing host-tier tensors"));
    std::vector<int64_t> saved;
    for (auto& t : tensors) {
      saved.push_back(t.durable_step);
      t.durable_step = t.state.step();
    }
    Status st = put_meta();
    if (st.ok()) st = store->flush_sync().with_context("offload checkpoint: Store::flush");
    if (!st.ok()) {
      for (size_t i = 0; i < tensors.size(); ++i) tensors[i].durable_step = saved[i];
    }
    return st;
  }

  // ---- open -----------------------------------------------------------------------------

  Status restore() {
    const std::string key = meta_key();
    STRATA_ASSIGN_OR_RETURN(ObjectInfo info, store->stat(key));
    std::string text(info.nbytes, '\0');
    STRATA_RETURN_IF_ERROR(store->get_bytes_sync(key, text.data(), text.size()));
    STRATA_ASSIGN_OR_RETURN(MetaRecord m, parse_meta(text, key));
    if (!factory) {
      STRATA_ASSIGN_OR_RETURN(factory, builtin_rule_factory(m.rule));
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
      t.state.set_step(host ? p.durable_step : p.step);
      t.durable_step = t.state.step();
      for (int s = 0; s < num_streams(); ++s) {
        t.keys.push_back(key_of(p.name, s));
        STRATA_ASSIGN_OR_RETURN(ObjectInfo oi, store->stat(t.keys[s]));
        if (oi.nbytes != p.numel * 4) {
          return data_loss("offload open: object '" + t.keys[s] + "' holds " +
                           std::to_string(oi.nbytes) + " bytes, the record says " +
                           std::to_string(p.numel) + " fp32 elements");
        }
      }
      if (host) {
        for (int s = 0; s < num_streams(); ++s) {
          STRATA_ASSIGN_OR_RETURN(HostArray a, HostArray::allocate(p.numel * 4));
          STRATA_RETURN_IF_ERROR(store->read_range_sync(t.keys[s], 0, p.numel * 4, a.data()));
          t.host.push_back(std::move(a));
        }
        host_bytes += p.numel * 4 * static_cast<uint64_t>(num_streams());
      }
      if (by_name.count(t.name)) return data_loss("offload open: duplicate parameter '" + t.name + "'");
      by_name[t.name] = static_cast<ParamHandle>(tensors.size());
      tensors.push_back(std::move(t));
    }
    return Status::OK();
  }
};

// ------------------------------------------------------------------------------ public

OffloadedOptimizer::OffloadedOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OffloadedOptimizer::~OffloadedOptimizer() {
  if (impl_ && impl_->async_thread.joinable()) impl_->async_thread.join();
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
  return std::unique_ptr<OffloadedOptimizer>(new OffloadedOptimizer(std::move(impl)));
}

Result<std::unique_ptr<OffloadedOptimizer>> OffloadedOptimizer::open(
    std::shared_ptr<Store> store, RuleFactory factory, const OffloadOptions& options) {
  STRATA_RETURN_IF_ERROR(check_store(store));
  auto impl = std::make_unique<Impl>();
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
  return std::unique_ptr<OffloadedOptimizer>(new OffloadedOptimizer(std::move(impl)));
}

Result<int> OffloadedOptimizer::add_param_group(const Hyperparams& hp) {
  Impl::Baton b(impl_.get());
  Hyperparams merged = impl_->groups[0].hp;
  for (const auto& kv : hp) merged[kv.first] = kv.second;
  STRATA_ASSIGN_OR_RETURN(auto rule, impl_->build_rule(merged));
  impl_->groups.push_back({std::move(merged), std::move(rule)});
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
  Hyperparams merged = impl_->groups[group].hp;
  for (const auto& kv : hp) merged[kv.first] = kv.second;
  STRATA_ASSIGN_OR_RETURN(auto rule, impl_->build_rule(merged));
  impl_->groups[group] = {std::move(merged), std::move(rule)};
  return Status::OK();
}

Status OffloadedOptimizer::set_lr(int group, double lr) { return set_hyperparams(group, {{"lr", lr}}); }

Result<ParamHandle> OffloadedOptimizer::add_param(std::string_view name, uint64_t numel,
                                                  const float* init, int group,
                                                  Placement placement) {
  Impl::Baton b(impl_.get());
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
  i.has_grad = t.grad != nullptr;
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
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  if (type != DType::kFloat32 && type != DType::kFloat16 && type != DType::kBFloat16) {
    return invalid_argument("offload set_grad '" + impl_->tensors[h].name +
                            "': gradients must be fp32, fp16 or bf16");
  }
  impl_->tensors[h].grad = data;
  impl_->tensors[h].grad_type = type;
  return Status::OK();
}

void OffloadedOptimizer::clear_grads() {
  Impl::Baton b(impl_.get());
  for (auto& t : impl_->tensors) t.grad = nullptr;
}

Status OffloadedOptimizer::set_param_copy(ParamHandle h, void* dst, DType type) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  if (type != DType::kFloat16 && type != DType::kBFloat16) {
    return invalid_argument("offload set_param_copy '" + impl_->tensors[h].name +
                            "': the copy must be fp16 or bf16");
  }
  impl_->tensors[h].copy = dst;
  impl_->tensors[h].copy_type = type;
  return Status::OK();
}

Result<StepStats> OffloadedOptimizer::step(const StepOptions& options) {
  Impl::Baton b(impl_.get());
  return impl_->step(options);
}

Future<StepStats> OffloadedOptimizer::step_async(const StepOptions& options) {
  Impl* impl = impl_.get();
  {
    std::unique_lock<std::mutex> lk(impl->mu);
    impl->cv.wait(lk, [&] { return !impl->busy; });
    impl->busy = true;
  }
  if (impl->async_thread.joinable()) impl->async_thread.join();
  auto promise = std::make_shared<Promise<StepStats>>();
  Future<StepStats> fut = promise->future();
  impl->async_thread = std::thread([impl, options, promise] {
    Result<StepStats> r = impl->step(options);
    {
      std::lock_guard<std::mutex> lk(impl->mu);
      impl->busy = false;
    }
    impl->cv.notify_all();
    promise->set(std::move(r));
  });
  return fut;
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
  return impl_->write_stream(h, 0, src, offset, count);
}
Status OffloadedOptimizer::read_state(ParamHandle h, int stream, float* dst, uint64_t offset,
                                      uint64_t count) {
  Impl::Baton b(impl_.get());
  return impl_->read_stream(h, stream + 1, dst, offset, count);
}
Status OffloadedOptimizer::write_state(ParamHandle h, int stream, const float* src,
                                       uint64_t offset, uint64_t count) {
  Impl::Baton b(impl_.get());
  return impl_->write_stream(h, stream + 1, src, offset, count);
}

Result<int64_t> OffloadedOptimizer::step_count(ParamHandle h) const {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  return impl_->tensors[h].state.step();
}

Status OffloadedOptimizer::set_step_count(ParamHandle h, int64_t step) {
  Impl::Baton b(impl_.get());
  STRATA_RETURN_IF_ERROR(impl_->check_handle(h));
  if (step < 0) return invalid_argument("offload set_step_count: step " + std::to_string(step) + " < 0");
  impl_->tensors[h].state.set_step(step);
  return Status::OK();
}

Status OffloadedOptimizer::checkpoint() {
  Impl::Baton b(impl_.get());
  return impl_->checkpoint();
}

const OffloadOptions& OffloadedOptimizer::options() const { return impl_->opts; }
uint64_t OffloadedOptimizer::sub_group_numel() const { return impl_->sg; }
uint64_t OffloadedOptimizer::pinned_bytes() const { return impl_->pinned ? impl_->pinned->budget_bytes() : 0; }
uint64_t OffloadedOptimizer::host_bytes() const {
  Impl::Baton b(impl_.get());
  return impl_->host_bytes;
}
const std::shared_ptr<Store>& OffloadedOptimizer::store() const { return impl_->store; }

}  // namespace strata::optimizer
