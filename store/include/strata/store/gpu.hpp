// strata::store — the few CUDA runtime calls the store needs outside the device tier:
// counting GPUs, page-locking host memory for them, and naming their PCI bus id (which
// the topology uses to find each GPU's nearest NUMA node).
//
// One build runs with or without a GPU: when strata is built without CUDA
// (STRATA_WITH_CUDA=OFF or no toolkit) or the CUDA runtime reports any error (no driver,
// "driver version is insufficient", no device), there are zero GPUs.
#pragma once

#include <cstdint>
#include <string>

#include "strata/base/status.hpp"

namespace strata {

/// True when this build of strata was compiled against the CUDA runtime.
/// \threadsafety safe.
bool built_with_cuda() noexcept;

/// Number of CUDA devices usable by this process: cudaGetDeviceCount(), or 0 when it
/// returns any error or strata was built without CUDA. Probed once and cached.
/// \threadsafety safe to call concurrently.
int gpu_count() noexcept;

/// Page-locks [ptr, ptr + nbytes) for the CUDA driver (cudaHostRegister with
/// cudaHostRegisterDefault), so host<->device copies from it run at full speed and
/// asynchronously. The memory must stay mapped until host_unregister(ptr).
/// \param ptr host memory (page-aligned recommended); \param nbytes > 0.
/// \error Unimplemented when built without CUDA; Unavailable when gpu_count() == 0;
///     InvalidArgument when ptr is null or nbytes is 0; Internal naming the CUDA error
///     (e.g. cudaErrorHostMemoryAlreadyRegistered) otherwise.
/// \threadsafety safe; registering the same range twice is an error.
Status host_register(void* ptr, uint64_t nbytes);

/// Undoes host_register(ptr). \error as host_register; Internal when ptr was not
/// registered (cudaErrorHostMemoryNotRegistered).
Status host_unregister(void* ptr);

/// PCI bus id of CUDA device `index` in the form hwloc and sysfs use:
/// "dddd:bb:dd.f", lower-case hex (e.g. "0000:65:00.0"), from cudaDeviceGetPCIBusId.
/// \error OutOfRange when index is not in [0, gpu_count()); Unimplemented without CUDA.
Result<std::string> gpu_pci_bus_id(int index);

/// Product name of CUDA device `index` (cudaDeviceProp::name), e.g. "NVIDIA H200".
/// \error as gpu_pci_bus_id.
Result<std::string> gpu_name(int index);

/// Total memory of CUDA device `index` in bytes (cudaDeviceProp::totalGlobalMem).
/// \error as gpu_pci_bus_id.
Result<uint64_t> gpu_memory_bytes(int index);

}  // namespace strata
