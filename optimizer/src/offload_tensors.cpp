// The offloaded optimizer's tensors (see offload.hpp): host-tier memory, add_param, and the
// range accessors behind read_param / write_param / read_state / write_state.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "offload_impl.hpp"
#include "strata/base/half.hpp"
#include "strata/base/units.hpp"

namespace strata::optimizer {

using namespace offload_detail;

namespace {

// One chunk of zeros (4 KiB-aligned), which a put repeats over a whole object
// (PutOptions::repeat_bytes). (A read-only anonymous mapping of the object's size, the
// kernel's zero page, is not free: reading it for the put made every page resident here,
// +384 MiB of RSS for a 384 MiB tensor.)
class ZeroChunk {
 public:
  explicit ZeroChunk(uint64_t nbytes) : nbytes_(std::max<uint64_t>(align_up(nbytes, kAlign), kAlign)) {
    p_ = std::aligned_alloc(kAlign, nbytes_);
    if (p_ != nullptr) std::memset(p_, 0, nbytes_);
  }
  ~ZeroChunk() { std::free(p_); }
  ZeroChunk(const ZeroChunk&) = delete;
  ZeroChunk& operator=(const ZeroChunk&) = delete;
  const void* data() const { return p_; }

 private:
  uint64_t nbytes_;
  void* p_ = nullptr;
};

}  // namespace

// ------------------------------------------------------------------------------ HostArray

bool offload_detail::valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

Result<HostArray> HostArray::allocate(uint64_t nbytes) {
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

HostArray& HostArray::operator=(HostArray&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(nbytes_, o.nbytes_);
  return *this;
}

HostArray::~HostArray() {
  if (p_ != nullptr) ::munmap(p_, nbytes_);
}

// ------------------------------------------------------------------------------ tensors

// Writes `value` over elements [0, numel) of NVMe state object `key` (elements of
// elem_bytes(1) bytes: fp32, or `value` rounded to bf16) through slot 0.
Status OffloadedOptimizer::Impl::fill_object(const std::string& key, uint64_t numel,
                                             float value) {
  float* buf = slot_stream(0, 0);
  const uint64_t n = std::min<uint64_t>(sg, numel);
  const uint64_t es = elem_bytes(1);
  if (es == 2) {
    uint16_t* h = reinterpret_cast<uint16_t*>(buf);
    std::fill(h, h + n, strata::detail::to_bf16(value).bits);
  } else {
    std::fill(buf, buf + n, value);
  }
  for (uint64_t b = 0; b < numel; b += sg) {
    const uint64_t c = std::min(sg, numel - b);
    STRATA_RETURN_IF_ERROR(store->write_range(key, b * es, c * es, buf));
  }
  return Status::OK();
}

Result<ParamHandle> OffloadedOptimizer::Impl::add_param(std::string_view name_in, uint64_t numel,
                                                        const float* init, int group,
                                                        Placement placement) {
  std::string name(name_in);
  STRATA_RETURN_IF_ERROR(check_open("offload add_param"));
  if (!valid_name(name)) {
    return invalid_argument("offload: parameter name '" + name +
                            "' must be non-empty printable ASCII without whitespace");
  }
  if (by_name.count(name)) {
    return invalid_argument("offload: parameter '" + name + "' already exists");
  }
  if (group < 0 || static_cast<size_t>(group) >= groups.size()) {
    return invalid_argument("offload: parameter '" + name + "': no param group " +
                            std::to_string(group));
  }
  const uint64_t bytes_all = numel * bytes_per_element();
  if (placement == Placement::kAuto) placement = opts.default_placement;
  if (placement == Placement::kAuto) {
    placement = host_bytes + bytes_all <= opts.host_budget_bytes ? Placement::kHost
                                                                  : Placement::kNvme;
  }
  STRATA_RETURN_IF_ERROR(check_disk_space({numel}, "offload add_param '" + name + "'"));
  Tensor t;
  t.name = name;
  t.numel = numel;
  t.placement = placement;
  t.group = group;
  for (int s = 0; s < num_streams(); ++s) t.keys.push_back(key_of(name, s));
  t.chunks.assign(t.keys.size(), state_chunk_bytes());
  t.chunks[0] = chunk_bytes;
  // Held before they are written: only checkpoint()'s commit makes their changes durable.
  STRATA_RETURN_IF_ERROR(store->hold(t.keys));
  const TensorDesc desc{DType::kFloat32, {static_cast<int64_t>(numel)}};
  const TensorDesc state_desc{opts.state_dtype, {static_cast<int64_t>(numel)}};
  PutOptions po;
  po.tier = Tier::kNvme;
  po.overwrite = true;  // leftovers of a crashed, never-checkpointed add_param
  po.chunk_bytes = chunk_bytes;  // sub-groups of whole chunks (Impl::chunk_bytes)
  // The objects' initial bytes: the host arrays, or `init` and one chunk of zeros repeated.
  std::vector<const void*> srcs;
  std::vector<PutOptions> pos(num_streams(), po);
  for (int s = 1; s < num_streams(); ++s) pos[s].chunk_bytes = t.chunks[s];
  std::optional<ZeroChunk> zeros;
  if (placement == Placement::kHost) {
    for (int s = 0; s < num_streams(); ++s) {
      STRATA_ASSIGN_OR_RETURN(HostArray a, HostArray::allocate(numel * elem_bytes(s)));
      if (s == 0 && init != nullptr) std::memcpy(a.data(), init, numel * 4);
      if (s > 0 && state_inits[s - 1] != 0.0f) {
        if (elem_bytes(s) == 2) {
          uint16_t* h = reinterpret_cast<uint16_t*>(a.data());
          std::fill(h, h + numel, strata::detail::to_bf16(state_inits[s - 1]).bits);
        } else {
          std::fill(a.data(), a.data() + numel, state_inits[s - 1]);
        }
      }
      srcs.push_back(a.data());
      t.host.push_back(std::move(a));
    }
  } else {
    zeros.emplace(chunk_bytes);
    if (zeros->data() == nullptr) {
      return resource_exhausted("offload: allocating " + format_bytes(chunk_bytes) + " of zeros");
    }
    for (int s = 0; s < num_streams(); ++s) {
      if (s == 0 && init != nullptr) {
        srcs.push_back(init);
      } else {
        srcs.push_back(zeros->data());
        pos[s].repeat_bytes = chunk_bytes;
      }
    }
  }
  std::vector<Future<void>> futs;
  for (int s = 0; s < num_streams(); ++s) {
    futs.push_back(store->put_async(t.keys[s], srcs[s], s == 0 ? desc : state_desc, pos[s]));
  }
  STRATA_RETURN_IF_ERROR(when_all(futs).result().status().with_context(
      "offload: creating parameter '" + name + "'"));
  if (placement == Placement::kHost) {
    host_bytes += bytes_all;
  } else {
    for (int s = 1; s < num_streams(); ++s) {
      if (state_inits[s - 1] != 0.0f) {
        STRATA_RETURN_IF_ERROR(fill_object(t.keys[s], numel, state_inits[s - 1]));
      }
    }
  }
  const ParamHandle h = static_cast<ParamHandle>(tensors.size());
  changed = true;
  by_name[name] = h;
  tensors.push_back(std::move(t));
  return h;
}

// ------------------------------------------------------------------------------ ranges

Status OffloadedOptimizer::Impl::check_range(ParamHandle h, int stream, uint64_t offset,
                                             uint64_t& count) const {
  STRATA_RETURN_IF_ERROR(check_open("offload read/write"));
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

Status OffloadedOptimizer::Impl::read_stream(ParamHandle h, int stream, float* dst,
                                             uint64_t offset, uint64_t count) {
  STRATA_RETURN_IF_ERROR(check_range(h, stream, offset, count));
  if (count == 0) return Status::OK();
  if (dst == nullptr) return invalid_argument("offload: destination is null");
  const Tensor& t = tensors[h];
  if (elem_bytes(stream) == 2) {  // bf16 state: widened to fp32 (exact)
    if (t.placement == Placement::kHost) {
      load_scaled_grad(reinterpret_cast<const uint16_t*>(t.host[stream].data()) + offset,
                       DType::kBFloat16, 1.0f, dst, count);
      return Status::OK();
    }
    // The bf16 bytes land in the upper half of dst's fp32 range, then widen front to back.
    STRATA_RETURN_IF_ERROR(store->read_range(t.keys[stream], offset * 2, count * 2,
                                             reinterpret_cast<char*>(dst) + count * 2));
    widen_bf16_in_place(dst, count * 2, count);
    return Status::OK();
  }
  if (t.placement == Placement::kHost) {
    std::memcpy(dst, t.host[stream].data() + offset, count * 4);
    return Status::OK();
  }
  return store->read_range(t.keys[stream], offset * 4, count * 4, dst);
}

Status OffloadedOptimizer::Impl::write_stream(ParamHandle h, int stream, const float* src,
                                              uint64_t offset, uint64_t count) {
  STRATA_RETURN_IF_ERROR(check_range(h, stream, offset, count));
  if (count == 0) return Status::OK();
  if (src == nullptr) return invalid_argument("offload: source is null");
  Tensor& t = tensors[h];
  changed = true;
  if (elem_bytes(stream) == 2) {  // bf16 state: rounded to nearest even
    if (t.placement == Placement::kHost) {
      store_converted(src, DType::kBFloat16,
                      reinterpret_cast<uint16_t*>(t.host[stream].data()) + offset, count);
      return Status::OK();
    }
    // In pieces of at most sg elements through a DRAM buffer (the caller's src is const).
    std::vector<uint16_t> buf(std::min<uint64_t>(count, std::max<uint64_t>(sg, 1)));
    for (uint64_t b = 0; b < count; b += buf.size()) {
      const uint64_t c = std::min<uint64_t>(buf.size(), count - b);
      store_converted(src + b, DType::kBFloat16, buf.data(), c);
      STRATA_RETURN_IF_ERROR(store->write_range(t.keys[stream], (offset + b) * 2, c * 2, buf.data()));
    }
    return Status::OK();
  }
  if (t.placement == Placement::kHost) {
    std::memcpy(t.host[stream].data() + offset, src, count * 4);
    return Status::OK();
  }
  return store->write_range(t.keys[stream], offset * 4, count * 4, src);
}

}  // namespace strata::optimizer
