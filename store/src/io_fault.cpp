// strata::store — the installed fault injector (io_fault.hpp).
#include "io_fault.hpp"

#include <atomic>

namespace strata::io::fault {
namespace {
std::atomic<Injector*> g_injector{nullptr};
}

void install(Injector* inj) { g_injector.store(inj, std::memory_order_release); }

namespace detail {
Injector* current() { return g_injector.load(std::memory_order_acquire); }
}  // namespace detail

}  // namespace strata::io::fault
