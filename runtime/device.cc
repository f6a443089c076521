#include "runtime/device.h"

#include <dlfcn.h>
#include <link.h>
#include <time.h>

#include <atomic>
#include <mutex>

namespace braid::runtime {
namespace {

// The few driver API values used, from cuda.h (stable ABI since CUDA 9.2),
// so that this file builds without the toolkit.
using CuResult = int;
using CuPointerGetAttribute = CuResult (*)(void* data, int attribute, unsigned long long pointer);
constexpr int kAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttributeIsManaged = 8;      // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kAttributeRangeStart = 11;    // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kAttributeRangeSize = 12;     // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned kMemoryTypeDevice = 2;   // CU_MEMORYTYPE_DEVICE

std::mutex locator_mu;
std::function<Location(const void*)> test_locator;
std::atomic<bool> testing{false};  // test_locator is set: read it under locator_mu

int count_loads(dl_phdr_info* info, std::size_t, void* adds) {
  *static_cast<unsigned long long*>(adds) = info->dlpi_adds;
  return 1;  // the counter is on every entry: the first is enough
}

// The coarse clock's tick (1-4 ms), read from the vDSO's data without the
// time stamp counter: about 5 ns.
long coarse_tick() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return now.tv_sec * 1'000'000'000L + now.tv_nsec;
}

// The driver's cuPointerGetAttribute if libcuda is loaded. A lookup by name
// costs ~20 us, so it is repeated only after the loader has loaded something
// new (dl_iterate_phdr's counter). Reading that counter takes the loader's
// lock and walks its list (~150 instructions, a fifth of a small
// collective's), so it is read at most once per tick of the coarse clock:
// device memory exists only once the driver is loaded and initialised
// (cuInit, a context, an allocation: tens of milliseconds and more), so a
// driver loaded since the last look cannot have produced a device pointer
// within the same tick. A collective on host memory thus pays a clock read.
// Once found, or while nothing new was loaded, it answers without a lock.
CuPointerGetAttribute driver_query() {
  static std::mutex mu;
  static std::atomic<CuPointerGetAttribute> query{nullptr};
  static std::atomic<unsigned long long> looked_at{~0ull};
  static std::atomic<long> looked_at_tick{-1};
  if (CuPointerGetAttribute found = query.load(std::memory_order_acquire)) return found;
  const long tick = coarse_tick();
  if (tick == looked_at_tick.load(std::memory_order_relaxed)) return nullptr;
  unsigned long long adds = 0;
  dl_iterate_phdr(count_loads, &adds);
  looked_at_tick.store(tick, std::memory_order_relaxed);
  if (adds == looked_at.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(mu);
  if (CuPointerGetAttribute found = query.load(std::memory_order_acquire)) return found;
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver) query.store(reinterpret_cast<CuPointerGetAttribute>(dlsym(driver, "cuPointerGetAttribute")),
                          std::memory_order_release);
  looked_at.store(adds, std::memory_order_release);
  return query.load(std::memory_order_acquire);
}

}  // namespace

std::string describe(const Location& location) {
  return location.kind == MemoryKind::host ? "host memory"
                                           : "CUDA device " + std::to_string(location.device) + " memory";
}

Location locate(const void* pointer) {
  if (testing.load(std::memory_order_acquire)) {
    std::lock_guard lock(locator_mu);
    if (test_locator) return test_locator(pointer);
  }
  if (pointer == nullptr) return {};
  CuPointerGetAttribute query = driver_query();
  if (!query) return {};
  const auto address = reinterpret_cast<unsigned long long>(pointer);
  unsigned memory_type = 0, managed = 0;
  int ordinal = -1;
  // Errors (a host pointer the driver never saw, no context) mean host memory.
  if (query(&memory_type, kAttributeMemoryType, address) != 0 || memory_type != kMemoryTypeDevice) return {};
  if (query(&managed, kAttributeIsManaged, address) == 0 && managed != 0) return {};
  if (query(&ordinal, kAttributeDeviceOrdinal, address) != 0) ordinal = 0;
  unsigned long long start = 0;
  std::size_t size = 0;
  if (query(&start, kAttributeRangeStart, address) != 0 || query(&size, kAttributeRangeSize, address) != 0)
    start = 0, size = 0;
  return {MemoryKind::device, ordinal, reinterpret_cast<const void*>(start), size};
}

bool device_memory_possible() { return testing.load(std::memory_order_acquire) || driver_query() != nullptr; }

bool cuda_built() {
#ifdef BRAID_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void set_locator_for_testing(std::function<Location(const void*)> locator) {
  std::lock_guard lock(locator_mu);
  test_locator = std::move(locator);
  testing.store(test_locator != nullptr, std::memory_order_release);
}

}  // namespace braid::runtime
