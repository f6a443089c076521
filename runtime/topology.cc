#include "runtime/topology.h"

#include <hwloc.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace braid::runtime {

std::string local_host_id(const Config& config) {
  if (!config.host_id.empty()) return config.host_id;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat shm {};
  const std::string memory = ::stat("/dev/shm", &shm) == 0
                                 ? "/shm" + std::to_string(shm.st_dev) + ":" + std::to_string(shm.st_ino)
                                 : "";
  return std::string(host) + "/" + boot_id + memory;
}

std::string host_name(const std::string& host_id) { return host_id.substr(0, host_id.find('/')); }

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return CPU_COUNT(&set);
}

std::string allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
  if (!cpus) return "0-" + std::to_string(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)) - 1);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) hwloc_bitmap_set(cpus, static_cast<unsigned>(cpu));
  } else {
    hwloc_bitmap_set_range(cpus, 0, static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)) - 1));
  }
  char* text = nullptr;
  std::string list = hwloc_bitmap_list_asprintf(&text, cpus) >= 0 && text ? text : "";
  std::free(text);
  hwloc_bitmap_free(cpus);
  return list;
}

int distinct_cpus(const std::vector<std::string>& lists) {
  hwloc_bitmap_t all = hwloc_bitmap_alloc(), one = hwloc_bitmap_alloc();
  bool parsed = all && one;
  for (const auto& list : lists) {
    if (!parsed) break;
    parsed = !list.empty() && hwloc_bitmap_list_sscanf(one, list.c_str()) == 0 && hwloc_bitmap_weight(one) > 0;
    if (parsed) hwloc_bitmap_or(all, all, one);
  }
  const int count = parsed ? hwloc_bitmap_weight(all) : 0;
  hwloc_bitmap_free(one);
  hwloc_bitmap_free(all);
  return std::max(count, 0);
}

std::string describe_placement() {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return "placement unknown (hwloc failed)";
  std::string text = "placement unknown";
  if (hwloc_topology_load(topology) == 0) {
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
    hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(topology, cpus, HWLOC_CPUBIND_PROCESS) == 0) {
      hwloc_cpuset_to_nodeset(topology, cpus, nodes);
      char* cpu_list = nullptr;
      char* node_list = nullptr;
      hwloc_bitmap_list_asprintf(&cpu_list, cpus);
      hwloc_bitmap_list_asprintf(&node_list, nodes);
      text = std::string("NUMA node(s) ") + node_list + ", cores " + cpu_list;
      free(cpu_list);
      free(node_list);
    }
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
  }
  hwloc_topology_destroy(topology);
  return text;
}

}  // namespace braid::runtime
