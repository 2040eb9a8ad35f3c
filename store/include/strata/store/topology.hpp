// strata::store — the machine as strata places data on it: NUMA nodes with their CPUs and
// memory, GPUs and NVMe block devices with their nearest NUMA node, and the block device
// (with its direct-I/O alignment) behind a filesystem path. Built on hwloc 2.
//
// Node numbers are the kernel's (hwloc "OS index", as in numactl --membind=N and
// /sys/devices/system/node/nodeN), CPU numbers are the kernel's logical CPU numbers.
//
// A topology can be the running machine, a synthetic description ("pack:2 numa:1 core:4
// pu:1") or an hwloc XML export; tests use the last two to exercise multi-socket
// placement on a one-socket machine. hwloc itself honours HWLOC_SYNTHETIC and
// HWLOC_XMLFILE for load(). Binding threads or memory needs the running machine
// (is_this_system()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/status.hpp"

namespace strata {

/// One NUMA node.
struct NumaNodeInfo {
  int os_index = -1;          ///< kernel node number
  std::vector<int> cpus;      ///< kernel CPU numbers (PUs) local to the node, ascending
  int cores = 0;              ///< physical cores whose PUs all belong to the node
  uint64_t memory_bytes = 0;  ///< node-local memory in bytes (0 when hwloc does not know)
  std::string cpulist;        ///< `cpus` as a kernel-style list, e.g. "0-3,8-11"
};

/// One PCI device kept by hwloc's "important devices" filter (GPUs, storage, NICs).
struct PciDeviceInfo {
  std::string bus_id;      ///< "dddd:bb:dd.f", lower-case hex
  uint16_t vendor_id = 0;  ///< e.g. 0x10de (NVIDIA)
  uint16_t device_id = 0;
  uint16_t class_id = 0;                ///< base class << 8 | subclass, e.g. 0x0302, 0x0108
  std::vector<std::string> os_devices;  ///< OS names below it: "nvme0n1", "cuda0", "eth0"
  int numa_node = -1;                   ///< nearest node (see Topology::nearest_numa_node)
  std::vector<int> local_numa_nodes;    ///< every node local to the device, ascending
};

/// One GPU.
struct GpuInfo {
  int cuda_index = -1;     ///< CUDA device ordinal; -1 when not known (XML topology)
  std::string name;        ///< product name ("NVIDIA H200"), "" when unknown
  std::string pci_bus_id;  ///< "dddd:bb:dd.f"
  int numa_node = -1;      ///< nearest node, -1 when unknown
};

/// One block device (a whole disk; partitions are resolved to their disk).
struct BlockDeviceInfo {
  std::string name;                   ///< kernel name of the disk: "nvme0n1", "vda"
  std::string pci_bus_id;             ///< PCI function behind it, "" when unknown
  int numa_node = -1;                 ///< nearest node, -1 when unknown
  std::vector<int> local_numa_nodes;  ///< every node local to the device
};

/// What lies behind a filesystem path: the block device and its direct-I/O alignment.
struct PathInfo {
  std::string path;        ///< as given
  uint32_t dev_major = 0;  ///< st_dev of the path
  uint32_t dev_minor = 0;
  std::string partition;  ///< "nvme0n1p2" when the path is on a partition, else ""
  /// The disk, or nullopt when st_dev is not a block device (tmpfs, overlayfs, NFS...).
  std::optional<BlockDeviceInfo> device;
  /// Node nearest the device. When the device's locality is unknown (e.g. virtio without
  /// NUMA information) and the machine has a single node, that node (0); when unknown on a
  /// multi-node machine, -1 (meaning: all nodes are equally near).
  int numa_node = -1;
  uint32_t logical_block_size = 0;   ///< /sys/block/<disk>/queue/logical_block_size; 0: none
  uint32_t physical_block_size = 0;  ///< /sys/block/<disk>/queue/physical_block_size
  /// statx(STATX_DIOALIGN) of a file in the path (the path itself when it is a file, an
  /// O_TMPFILE inside it when it is a directory): buffer and offset/length alignment for
  /// O_DIRECT in bytes. 0 and dio_from_statx == false when the kernel or filesystem does
  /// not report it; 0 with dio_from_statx == true means O_DIRECT is unsupported there.
  uint32_t dio_mem_align = 0;
  uint32_t dio_offset_align = 0;
  bool dio_from_statx = false;

  /// The O_DIRECT offset/length alignment to use, as DESIGN.md specifies:
  /// dio_offset_align when reported (non-zero), else logical_block_size when known, else
  /// 4096.
  uint32_t dio_alignment() const;
};

/// Which topology an object describes. See Topology::load*.
enum class TopologySource { kSystem, kSynthetic, kXml };

/// A loaded hwloc topology with strata's view of it precomputed.
/// \threadsafety immutable after load: every const member may be called concurrently
///     (hwloc permits concurrent queries and binding calls on a loaded topology).
class Topology {
 public:
  /// The running machine, including I/O devices (PCI, block, GPU OS devices). hwloc reads
  /// HWLOC_SYNTHETIC / HWLOC_XMLFILE itself: when one is set, this loads that instead and
  /// source()/is_this_system() say so. Costs a few to tens of milliseconds.
  /// \error Internal naming the hwloc call that failed (errno kept).
  static Result<std::shared_ptr<const Topology>> load();

  /// The running machine, loaded once per process (load() on first use) and shared.
  /// \error as load(); a failed load is retried on the next call.
  static Result<std::shared_ptr<const Topology>> system();

  /// A synthetic topology, hwloc's syntax: "pack:2 numa:1 core:4 pu:1" (2 sockets, one
  /// NUMA node each, 4 single-PU cores per node). Synthetic topologies have no I/O devices.
  /// \error InvalidArgument naming `description` when hwloc rejects it.
  static Result<std::shared_ptr<const Topology>> load_synthetic(std::string_view description);

  /// An hwloc XML export (lstopo --of xml), including its I/O devices.
  /// \error NotFound when `path` does not exist; InvalidArgument naming `path` when hwloc
  ///     cannot parse it.
  static Result<std::shared_ptr<const Topology>> load_xml(const std::string& path);

  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  TopologySource source() const;
  /// True when the topology describes the running machine (binding works).
  bool is_this_system() const;

  int num_packages() const;  ///< sockets
  int num_cores() const;     ///< physical cores
  int num_pus() const;       ///< logical CPUs (hardware threads)

  /// NUMA nodes, ascending by os_index. Never empty (hwloc always reports one node).
  const std::vector<NumaNodeInfo>& numa_nodes() const;
  /// The node with kernel number `os_index`, or nullptr.
  const NumaNodeInfo* numa_node(int os_index) const;

  /// PCI devices kept by hwloc (ascending bus id). Empty for synthetic topologies.
  const std::vector<PciDeviceInfo>& pci_devices() const;

  /// GPUs. On the running machine with a CUDA GPU: one entry per CUDA device (ordinal,
  /// name, bus id, node by bus id). Otherwise (XML topologies, no CUDA): one entry per
  /// NVIDIA display-class PCI device (vendor 0x10de, class 0x03xx), with cuda_index taken
  /// from a "cudaN" OS device below it when present, else -1.
  std::vector<GpuInfo> gpus() const;

  /// Block devices (hwloc OS devices of type BLOCK: "nvme0n1", "vda", ...).
  const std::vector<BlockDeviceInfo>& block_devices() const;

  /// Nearest node of the PCI function `bus_id` ("0000:41:00.0"; the domain may be
  /// omitted or 8 hex digits as CUDA prints it). -1 when the device's locality spans
  /// several nodes. On the running machine a device hwloc filtered out is looked up in
  /// sysfs (/sys/bus/pci/devices/<id>/numa_node).
  /// \error InvalidArgument for a malformed id; NotFound when no such device.
  Result<int> numa_node_of_pci(std::string_view bus_id) const;

  /// Nearest node of block device `name` ("nvme0n1"; a partition name resolves to its
  /// disk on the running machine). \error NotFound when no such device.
  Result<int> numa_node_of_block_device(std::string_view name) const;

  /// Nearest node of CUDA device `cuda_index` (via gpus()).
  /// \error NotFound when there is no such GPU.
  Result<int> numa_node_of_gpu(int cuda_index) const;

  /// The node whose CPUs include every CPU in `cpus` (kernel CPU numbers).
  /// \error InvalidArgument when `cpus` is empty or names a CPU the topology lacks;
  ///     NotFound when the CPUs span several nodes.
  Result<int> numa_node_of_cpus(const std::vector<int>& cpus) const;

  /// Nearest node(s) of a set of CPUs (an I/O device's locality): the nodes whose CPUs
  /// include all of `cpus` — the smallest such node wins — or, when none does, the nodes
  /// lying inside `cpus` (a unique one wins). Returns -1 and fills `local` with the
  /// candidates when the answer is ambiguous. Formula of hwloc's
  /// hwloc_get_local_numanode_objs (LARGER then SMALLER locality).
  int nearest_numa_node(const std::vector<int>& cpus, std::vector<int>* local = nullptr) const;

  /// The block device behind `path` (st_dev -> /sys/dev/block/MAJ:MIN, partitions
  /// resolved to the disk), its nearest node, block sizes and STATX_DIOALIGN values.
  /// Reads the running machine's sysfs; the node comes from this topology's block and PCI
  /// objects (so an XML topology maps only devices it names).
  /// \error NotFound naming `path` when it does not exist; IoError with errno otherwise.
  Result<PathInfo> path_info(const std::string& path) const;

  /// Binds the calling thread to the CPUs of node `os_index` (hwloc_set_cpubind,
  /// HWLOC_CPUBIND_THREAD). The thread may still run on any of those CPUs.
  /// \error FailedPrecondition when !is_this_system(); InvalidArgument for an unknown
  ///     node; IoError with errno when the kernel refuses.
  Status bind_thread_to_numa_node(int os_index) const;

  /// Binds the calling thread to `cpus` (kernel CPU numbers). Errors as above.
  Status bind_thread_to_cpus(const std::vector<int>& cpus) const;

  /// The CPUs the calling thread may run on (hwloc_get_cpubind, HWLOC_CPUBIND_THREAD).
  /// \error FailedPrecondition when !is_this_system(); IoError with errno.
  Result<std::vector<int>> thread_cpus() const;

  /// Binds pages of [addr, addr + nbytes) to node `os_index` (hwloc_set_area_membind,
  /// HWLOC_MEMBIND_BIND, by nodeset): pages not yet touched are allocated there; pages
  /// already present are left where they are unless `migrate`.
  /// \error FailedPrecondition when !is_this_system(); InvalidArgument for an unknown node;
  ///     IoError with errno when the kernel refuses (e.g. mbind blocked by seccomp).
  Status bind_memory_to_numa_node(void* addr, uint64_t nbytes, int os_index,
                                  bool migrate = false) const;

  /// The nodes holding the pages of [addr, addr + nbytes) that are present
  /// (hwloc_get_area_memlocation). \error as bind_memory_to_numa_node.
  Result<std::vector<int>> memory_location(const void* addr, uint64_t nbytes) const;

  struct Impl;  ///< implementation detail (hwloc handle and the precomputed tables)

 private:
  explicit Topology(std::unique_ptr<Impl> impl);
  static Result<std::shared_ptr<const Topology>> finish(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Kernel features strata's I/O engine and pinned pool depend on, probed on the running
/// machine (not on a loaded topology).
struct HostFeatures {
  bool io_uring = false;             ///< io_uring_queue_init(8 entries) succeeded
  int io_uring_errno = 0;            ///< its errno when it failed (ENOSYS, EPERM: seccomp...)
  std::string thp_mode;              ///< transparent huge pages: "always" | "madvise" |
                                     ///< "never" | "" (kernel without THP)
  uint64_t hugetlb_page_bytes = 0;   ///< default hugetlb page size (Hugepagesize)
  uint64_t hugetlb_pages_total = 0;  ///< reserved hugetlb pages (vm.nr_hugepages)
  uint64_t hugetlb_pages_free = 0;   ///< of which free
  uint64_t memlock_limit_bytes = 0;  ///< RLIMIT_MEMLOCK soft limit; UINT64_MAX = unlimited
  bool cap_ipc_lock = false;         ///< CAP_IPC_LOCK effective: may lock beyond the limit
};

/// Probes the features above (sysfs, /proc, one io_uring setup and teardown). ~1 ms.
/// \threadsafety safe.
HostFeatures probe_host_features();

/// Formats CPU numbers as a kernel-style list: {0,1,2,3,8} -> "0-3,8".
std::string format_cpulist(const std::vector<int>& cpus);

/// Parses a kernel-style CPU list ("0-3,8,10-11"). \error InvalidArgument naming `text`.
Result<std::vector<int>> parse_cpulist(std::string_view text);

}  // namespace strata
