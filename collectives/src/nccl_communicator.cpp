// The NCCL backend: CUDA device memory; NCCL's unique id travels through our store.
// Compiled only with STRATA_HAVE_CUDA (the CUDA toolkit's and NCCL's headers found at
// configure time). The CUDA runtime and NCCL are not linked: every call goes through the
// function tables strata::base fills with dlopen/dlsym on first use (gpu_libraries.hpp),
// and a host where either cannot be loaded has no NCCL backend (nccl_available() is false,
// create_nccl says which library and why).
#ifdef STRATA_HAVE_CUDA

#include <thread>

#include "backend.hpp"
#include "strata/base/detail/cuda_api.hpp"
#include "strata/base/detail/nccl_api.hpp"
#include "strata/base/gpu_libraries.hpp"

namespace strata {
namespace {

// The loaded libraries; only called once create_nccl() found both loaded.
const detail::CudartApi& cu() { return *detail::cudart(); }
const detail::NcclApi& nc() { return *detail::nccl(); }

}  // namespace

bool nccl_available() {
  const detail::CudartApi* cudart = detail::cudart();
  if (cudart == nullptr || detail::nccl() == nullptr) return false;
  int n = 0;
  if (cudart->cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudart->cudaGetLastError();
    return false;
  }
  return n > 0;
}

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_text(ncclResult_t r) {
  return std::string(nc().ncclGetErrorString(r)) + " (ncclResult " + std::to_string(static_cast<int>(r)) + ")";
}

struct NcclType {
  ncclDataType_t type;
  bool reducible;  // NCCL has no 16-bit integer type
};

NcclType nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return {ncclFloat32, true};
    case DType::kFloat16: return {ncclFloat16, true};
    case DType::kBFloat16: return {ncclBfloat16, true};
    case DType::kFloat64: return {ncclFloat64, true};
    case DType::kInt8: return {ncclInt8, true};
    case DType::kInt16: return {ncclUint8, false};
    case DType::kInt32: return {ncclInt32, true};
    case DType::kInt64: return {ncclInt64, true};
    case DType::kUInt8: return {ncclUint8, true};
    case DType::kBool: return {ncclUint8, true};
  }
  return {ncclUint8, false};
}

ncclRedOp_t nccl_op(DType t, ReduceOp op) {
  if (t == DType::kBool) return ncclMax;  // logical OR, as torch.distributed does
  return op == ReduceOp::kSum ? ncclSum : ncclMax;
}

class NcclCommunicator final : public BootstrappedCommunicator {
 public:
  NcclCommunicator(std::unique_ptr<Bootstrap> boot, std::unique_ptr<ThreadPool> queue,
                   int device, ncclComm_t comm, cudaStream_t stream, int* scratch)
      : BootstrappedCommunicator(std::move(boot)), device_(device), comm_(comm), stream_(stream), scratch_(scratch),
        queue_(std::move(queue)) {}

  ~NcclCommunicator() override {
    composite_.shutdown();  // finishes queued composites (they use queue_)
    queue_.reset();
    cu().cudaSetDevice(device_);
    if (broken_.ok()) {
      nc().ncclCommFinalize(comm_);
      poll_async(Clock::now() + options().timeout);
      nc().ncclCommDestroy(comm_);
    } else {
      nc().ncclCommAbort(comm_);
    }
    cu().cudaStreamDestroy(stream_);
    cu().cudaFree(scratch_);
  }

  Backend backend() const override { return Backend::kNccl; }
  int device() const override { return device_; }

  Future<void> all_gather_async(const void* send, void* recv, size_t count,
                                DType dtype) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_args("all_gather", send, recv, count, dtype));
    const size_t nbytes = count * dtype_size(dtype);
    return submit("all_gather", nbytes, [=, this] {
      return nc().ncclAllGather(send, recv, nbytes, ncclUint8, comm_, stream_);
    });
  }

  Future<void> reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dtype,
                                    ReduceOp op) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_args("reduce_scatter", send, recv, recv_count, dtype));
    STRATA_RETURN_FUTURE_IF_ERROR(check_reducible("reduce_scatter", dtype));
    return submit("reduce_scatter", recv_count * dtype_size(dtype) * size(), [=, this] {
      return nc().ncclReduceScatter(send, recv, recv_count, nccl_type(dtype).type, nccl_op(dtype, op),
                               comm_, stream_);
    });
  }

  Future<void> all_reduce_async(const void* send, void* recv, size_t count, DType dtype,
                                ReduceOp op) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_args("all_reduce", send, recv, count, dtype));
    STRATA_RETURN_FUTURE_IF_ERROR(check_reducible("all_reduce", dtype));
    return submit("all_reduce", count * dtype_size(dtype), [=, this] {
      return nc().ncclAllReduce(send, recv, count, nccl_type(dtype).type, nccl_op(dtype, op), comm_,
                           stream_);
    });
  }

  Future<void> broadcast_async(void* buf, size_t count, DType dtype, int root) override {
    STRATA_RETURN_FUTURE_IF_ERROR(check_broadcast_args(buf, count, dtype, root, size()));
    const size_t nbytes = count * dtype_size(dtype);
    return submit("broadcast", nbytes, [=, this] {
      return nc().ncclBroadcast(buf, buf, nbytes, ncclUint8, root, comm_, stream_);
    });
  }

  Future<void> barrier_async() override {
    // NCCL has no barrier: an all-reduce of one int on the device does the job.
    return submit("barrier", sizeof(int), [this] {
      return nc().ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

 private:
  static Status check_reducible(std::string_view what, DType dtype) {
    if (!nccl_type(dtype).reducible)
      return unimplemented(std::string(what) + ": NCCL has no " + std::string(dtype_name(dtype)) +
                           " reduction (no 16-bit integer type)");
    return Status::OK();
  }

  // Polls until the communicator has no operation in progress; ncclInProgress past deadline.
  ncclResult_t poll_async(Clock::time_point deadline) {
    ncclResult_t r = ncclInProgress;
    while (true) {
      nc().ncclCommGetAsyncError(comm_, &r);
      if (r != ncclInProgress || Clock::now() >= deadline) return r;
      std::this_thread::yield();
    }
  }

  Future<void> submit(std::string_view what, size_t nbytes, std::function<ncclResult_t()> launch) {
    std::string label = std::string(what) + " of " + std::to_string(nbytes) + " bytes";
    return queue_->async([this, label, nbytes, launch = std::move(launch)]() -> Status {
      if (!broken_.ok())
        return failed_precondition("rank " + std::to_string(rank()) + ": " + label +
                                   ": the communicator is broken by an earlier error: " +
                                   broken_.message());
      if (nbytes == 0) return Status::OK();
      cu().cudaSetDevice(device_);
      const auto deadline = Clock::now() + options().timeout;
      ncclResult_t r = launch();
      if (r != ncclSuccess && r != ncclInProgress) return fail(label, "launch: " + nccl_text(r), false);
      r = poll_async(deadline);
      if (r == ncclInProgress) return fail(label, "NCCL enqueue did not finish", true);
      if (r != ncclSuccess) return fail(label, nccl_text(r), false);
      while (true) {
        cudaError_t q = cu().cudaStreamQuery(stream_);
        if (q == cudaSuccess) return Status::OK();
        if (q != cudaErrorNotReady)
          return fail(label, std::string("CUDA stream error: ") + cu().cudaGetErrorString(q), false);
        ncclResult_t a = ncclSuccess;
        nc().ncclCommGetAsyncError(comm_, &a);
        if (a != ncclSuccess && a != ncclInProgress) return fail(label, nccl_text(a), false);
        if (Clock::now() >= deadline) return fail(label, "the kernel did not complete", true);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }

  Status fail(const std::string& label, const std::string& detail, bool timed_out) {
    nc().ncclCommAbort(comm_);
    broken_ = describe_failure(*boot_->client, rank(), label, "NCCL: " + detail, timed_out,
                               options().timeout);
    aborted_ = true;
    return broken_;
  }

  int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int* scratch_;
  Status broken_;
  bool aborted_ = false;
  std::unique_ptr<ThreadPool> queue_;  // one worker: operations in submission order
};

}  // namespace

Result<std::unique_ptr<Communicator>> create_nccl(std::unique_ptr<Bootstrap> boot) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ThreadPool> queue, make_op_queue());
  const auto& env = boot->env;
  const auto& opt = boot->options;
  const std::string who = "rank " + std::to_string(env.rank);
  // No GPU where the CUDA runtime cannot be loaded (as when it reports no device); NCCL
  // itself missing is Unavailable. Both messages name each file tried and dlerror().
  if (detail::cudart() == nullptr)
    return failed_precondition(who + ": the NCCL backend needs a GPU; " +
                               cuda_runtime_library().error);
  STRATA_RETURN_IF_ERROR(require_nccl(who + ": the NCCL backend"));
  int ndev = 0;
  cudaError_t ce = cu().cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess || ndev == 0)
    return failed_precondition(who + ": the NCCL backend needs a GPU; cudaGetDeviceCount: " +
                               (ce != cudaSuccess ? std::string(cu().cudaGetErrorString(ce))
                                                  : std::string("0 devices")));
  int device = opt.cuda_device >= 0 ? opt.cuda_device : env.local_rank % ndev;
  if (device >= ndev)
    return invalid_argument(who + ": cuda_device " + std::to_string(device) + " but only " +
                            std::to_string(ndev) + " device(s)");
  ce = cu().cudaSetDevice(device);
  if (ce != cudaSuccess)
    return unavailable(who + ": cudaSetDevice(" + std::to_string(device) + "): " + cu().cudaGetErrorString(ce));

  // Rank 0 creates the unique id; every other rank reads it from the store.
  ncclUniqueId id;
  const std::string key = boot->prefix + "nccl/unique_id";
  if (env.rank == 0) {
    ncclResult_t r = nc().ncclGetUniqueId(&id);
    if (r != ncclSuccess) return unavailable(who + ": ncclGetUniqueId: " + nccl_text(r));
    STRATA_RETURN_IF_ERROR(boot->client->set(key, std::string_view(id.internal, sizeof(id.internal))));
  } else {
    STRATA_ASSIGN_OR_RETURN(std::string bytes, boot->client->get(key, opt.timeout));
    if (bytes.size() != sizeof(id.internal))
      return internal_error(who + ": NCCL unique id under '" + key + "' has " +
                            std::to_string(bytes.size()) + " bytes, expected " +
                            std::to_string(sizeof(id.internal)));
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing peer gives a timeout instead of a hang
  ncclResult_t r = nc().ncclCommInitRankConfig(&comm, env.world_size, id, env.rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + opt.timeout;
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    nc().ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) {
    if (comm) nc().ncclCommAbort(comm);
    return describe_failure(*boot->client, env.rank, "ncclCommInitRank",
                            r == ncclInProgress ? std::string("not complete") : nccl_text(r),
                            r == ncclInProgress, opt.timeout);
  }
  cudaStream_t stream;
  ce = cu().cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  int* scratch = nullptr;
  if (ce == cudaSuccess) ce = cu().cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(int));
  if (ce != cudaSuccess) {
    nc().ncclCommAbort(comm);
    return resource_exhausted(who + ": CUDA stream/scratch allocation: " + cu().cudaGetErrorString(ce));
  }
  cu().cudaMemset(scratch, 0, sizeof(int));
  STRATA_RETURN_IF_ERROR(boot->client->barrier(boot->prefix + "ready", env.world_size, opt.timeout));
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(std::move(boot), std::move(queue), device, comm, stream, scratch));
}

}  // namespace detail
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
