// Topology: synthetic 2- and 4-socket machines, an XML 2-socket machine with GPUs and NVMe
// drives on different sockets (tests/store/data/two_socket_gpu_nvme.xml, written by
// make_two_socket_xml.py next to it), the running machine, and path -> block device.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>

#include "strata/base/units.hpp"
#include "strata/store/gpu.hpp"
#include "strata/store/topology.hpp"

namespace strata {
namespace {

const std::string kXml = std::string(STRATA_STORE_TEST_DATA) + "/two_socket_gpu_nvme.xml";

std::vector<int> range(int lo, int hi) {  // [lo, hi)
  std::vector<int> v(hi - lo);
  std::iota(v.begin(), v.end(), lo);
  return v;
}

TEST(Cpulist, FormatAndParse) {
  EXPECT_EQ(format_cpulist({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpulist({5, 3, 4, 4}), "3-5");
  EXPECT_EQ(format_cpulist({}), "");
  auto v = parse_cpulist("0-3,8,10-11\n");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(*v, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpulist("3-1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_cpulist("a").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_cpulist("1,,2").status().code(), StatusCode::kInvalidArgument);
}

TEST(Topology, Synthetic2Socket) {
  auto t = Topology::load_synthetic("pack:2 numa:1(memory=8GiB) core:4 pu:1");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Topology& topo = **t;
  EXPECT_EQ(topo.source(), TopologySource::kSynthetic);
  EXPECT_FALSE(topo.is_this_system());
  EXPECT_EQ(topo.num_packages(), 2);
  EXPECT_EQ(topo.num_cores(), 8);
  EXPECT_EQ(topo.num_pus(), 8);
  ASSERT_EQ(topo.numa_nodes().size(), 2u);
  for (int n = 0; n < 2; ++n) {
    const NumaNodeInfo& node = topo.numa_nodes()[n];
    EXPECT_EQ(node.os_index, n);
    EXPECT_EQ(node.cpus, range(4 * n, 4 * n + 4));
    EXPECT_EQ(node.cores, 4);
    EXPECT_EQ(node.memory_bytes, 8 * kGiB);
  }
  EXPECT_EQ(topo.numa_nodes()[1].cpulist, "4-7");
  EXPECT_EQ(topo.numa_node(1), &topo.numa_nodes()[1]);
  EXPECT_EQ(topo.numa_node(2), nullptr);

  EXPECT_EQ(*topo.numa_node_of_cpus({0}), 0);
  EXPECT_EQ(*topo.numa_node_of_cpus({5, 6}), 1);
  EXPECT_EQ(*topo.numa_node_of_cpus({7, 4, 5, 6}), 1);
  EXPECT_EQ(topo.numa_node_of_cpus({3, 4}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(topo.numa_node_of_cpus({8}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(topo.numa_node_of_cpus({}).status().code(), StatusCode::kInvalidArgument);

  // Locality of an I/O device attached to a package / to the whole machine.
  std::vector<int> local;
  EXPECT_EQ(topo.nearest_numa_node(range(4, 8), &local), 1);
  EXPECT_EQ(local, std::vector<int>{1});
  EXPECT_EQ(topo.nearest_numa_node(range(0, 8), &local), -1);
  EXPECT_EQ(local, (std::vector<int>{0, 1}));

  EXPECT_TRUE(topo.pci_devices().empty());
  EXPECT_TRUE(topo.block_devices().empty());
  EXPECT_TRUE(topo.gpus().empty());
  // Binding needs the real machine.
  EXPECT_EQ(topo.bind_thread_to_numa_node(0).code(), StatusCode::kFailedPrecondition);
  char page[64];
  EXPECT_EQ(topo.bind_memory_to_numa_node(page, sizeof(page), 0).code(),
            StatusCode::kFailedPrecondition);
}

TEST(Topology, Synthetic4SocketWithSmt) {
  auto t = Topology::load_synthetic("pack:4 numa:1 core:6 pu:2");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Topology& topo = **t;
  EXPECT_EQ(topo.num_packages(), 4);
  EXPECT_EQ(topo.num_cores(), 24);
  EXPECT_EQ(topo.num_pus(), 48);
  ASSERT_EQ(topo.numa_nodes().size(), 4u);
  for (int n = 0; n < 4; ++n) {
    EXPECT_EQ(topo.numa_nodes()[n].os_index, n);
    EXPECT_EQ(topo.numa_nodes()[n].cpus, range(12 * n, 12 * n + 12));
    EXPECT_EQ(topo.numa_nodes()[n].cores, 6);
  }
  EXPECT_EQ(topo.numa_nodes()[2].cpulist, "24-35");
  EXPECT_EQ(*topo.numa_node_of_cpus({30}), 2);
  EXPECT_EQ(*topo.numa_node_of_cpus({36, 47}), 3);
  EXPECT_EQ(topo.numa_node_of_cpus({11, 12}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(topo.numa_node_of_cpus({48}).status().code(), StatusCode::kInvalidArgument);
}

TEST(Topology, SyntheticTwoNodesPerSocket) {
  // Sub-NUMA clustering: a device attached to a package lies near both of its nodes.
  auto t = Topology::load_synthetic("pack:2 numa:2 core:2 pu:1");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Topology& topo = **t;
  ASSERT_EQ(topo.numa_nodes().size(), 4u);
  EXPECT_EQ(topo.numa_nodes()[3].cpus, (std::vector<int>{6, 7}));
  EXPECT_EQ(topo.numa_nodes()[3].cores, 2);
  std::vector<int> local;
  EXPECT_EQ(topo.nearest_numa_node(range(0, 4), &local), -1);
  EXPECT_EQ(local, (std::vector<int>{0, 1}));
  EXPECT_EQ(topo.nearest_numa_node({5}, &local), 2);
  EXPECT_EQ(local, std::vector<int>{2});
}

TEST(Topology, SyntheticRejectsGarbage) {
  auto t = Topology::load_synthetic("pack:two");
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("pack:two"), std::string::npos);
}

void expect_two_socket_xml(const Topology& topo) {
  EXPECT_EQ(topo.num_packages(), 2);
  EXPECT_EQ(topo.num_cores(), 8);
  ASSERT_EQ(topo.numa_nodes().size(), 2u);
  EXPECT_EQ(topo.numa_nodes()[0].cpus, range(0, 4));
  EXPECT_EQ(topo.numa_nodes()[1].cpus, range(4, 8));
  EXPECT_EQ(topo.numa_nodes()[0].memory_bytes, 16 * kGiB);
  EXPECT_EQ(topo.numa_nodes()[1].cores, 4);

  // GPUs: cuda0 on socket 1, cuda1 on socket 0.
  auto gpus = topo.gpus();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].cuda_index, 0);
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:41:00.0");
  EXPECT_EQ(gpus[0].numa_node, 1);
  EXPECT_EQ(gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(gpus[1].cuda_index, 1);
  EXPECT_EQ(gpus[1].pci_bus_id, "0000:02:00.0");
  EXPECT_EQ(gpus[1].numa_node, 0);
  EXPECT_EQ(*topo.numa_node_of_gpu(0), 1);
  EXPECT_EQ(*topo.numa_node_of_gpu(1), 0);
  EXPECT_EQ(topo.numa_node_of_gpu(2).status().code(), StatusCode::kNotFound);

  // PCI lookups accept the forms CUDA and lspci print.
  EXPECT_EQ(*topo.numa_node_of_pci("0000:41:00.0"), 1);
  EXPECT_EQ(*topo.numa_node_of_pci("00000000:41:00.0"), 1);
  EXPECT_EQ(*topo.numa_node_of_pci("C1:00.0"), 1);
  EXPECT_EQ(*topo.numa_node_of_pci("0000:01:00.0"), 0);
  EXPECT_EQ(topo.numa_node_of_pci("0000:99:00.0").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(topo.numa_node_of_pci("nvme0").status().code(), StatusCode::kInvalidArgument);

  // NVMe drives: nvme0n1 on socket 0, nvme1n1 on socket 1; vdb hangs off the machine.
  const auto& blocks = topo.block_devices();
  ASSERT_EQ(blocks.size(), 3u);
  std::map<std::string, BlockDeviceInfo> by_name;
  for (const auto& b : blocks) by_name[b.name] = b;
  ASSERT_EQ(by_name.count("nvme0n1"), 1u);
  EXPECT_EQ(by_name["nvme0n1"].numa_node, 0);
  EXPECT_EQ(by_name["nvme0n1"].pci_bus_id, "0000:01:00.0");
  EXPECT_EQ(by_name["nvme1n1"].numa_node, 1);
  EXPECT_EQ(by_name["nvme1n1"].local_numa_nodes, std::vector<int>{1});
  EXPECT_EQ(by_name["vdb"].numa_node, -1);
  EXPECT_EQ(by_name["vdb"].local_numa_nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(*topo.numa_node_of_block_device("nvme1n1"), 1);
  EXPECT_EQ(*topo.numa_node_of_block_device("nvme0n1"), 0);
  EXPECT_EQ(topo.numa_node_of_block_device("sdz").status().code(), StatusCode::kNotFound);

  ASSERT_EQ(topo.pci_devices().size(), 5u);
  EXPECT_EQ(topo.pci_devices()[0].bus_id, "0000:00:04.0");
  EXPECT_EQ(topo.pci_devices()[4].bus_id, "0000:c1:00.0");
  EXPECT_EQ(topo.pci_devices()[4].class_id, 0x0108);
  EXPECT_EQ(topo.pci_devices()[4].vendor_id, 0x144d);
  EXPECT_EQ(topo.pci_devices()[4].os_devices, std::vector<std::string>{"nvme1n1"});
}

TEST(Topology, XmlGpusAndNvmeOnDifferentSockets) {
  auto t = Topology::load_xml(kXml);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->source(), TopologySource::kXml);
  EXPECT_FALSE((*t)->is_this_system());
  expect_two_socket_xml(**t);
}

TEST(Topology, XmlErrors) {
  EXPECT_EQ(Topology::load_xml("/nonexistent/topo.xml").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Topology::load_xml("/proc/self/status").status().code(), StatusCode::kInvalidArgument);
}

// hwloc honours HWLOC_XMLFILE / HWLOC_SYNTHETIC for the default (this-machine) load.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

TEST(Topology, LoadHonoursHwlocXmlFileEnv) {
  ScopedEnv env("HWLOC_XMLFILE", kXml);
  auto t = Topology::load();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->source(), TopologySource::kXml);
  expect_two_socket_xml(**t);
}

TEST(Topology, LoadHonoursHwlocSyntheticEnv) {
  ScopedEnv env("HWLOC_SYNTHETIC", "pack:4 numa:1 core:2 pu:1");
  auto t = Topology::load();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->source(), TopologySource::kSynthetic);
  EXPECT_FALSE((*t)->is_this_system());
  ASSERT_EQ((*t)->numa_nodes().size(), 4u);
  EXPECT_EQ((*t)->numa_nodes()[3].cpus, range(6, 8));
}

// --- The running machine ---------------------------------------------------------------

std::shared_ptr<const Topology> this_machine() {
  auto t = Topology::load();
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : nullptr;
}

TEST(Topology, ThisMachine) {
  auto topo = this_machine();
  ASSERT_TRUE(topo);
  EXPECT_EQ(topo->source(), TopologySource::kSystem);
  EXPECT_TRUE(topo->is_this_system());
  ASSERT_GE(topo->numa_nodes().size(), 1u);
  // Every PU belongs to exactly one node.
  size_t cpus = 0;
  for (const auto& n : topo->numa_nodes()) {
    cpus += n.cpus.size();
    // The kernel's own view of the node's memory (kB in .../nodeN/meminfo).
    std::ifstream in("/sys/devices/system/node/node" + std::to_string(n.os_index) + "/meminfo");
    std::string line;
    while (std::getline(in, line)) {
      auto pos = line.find("MemTotal:");
      if (pos == std::string::npos) continue;
      uint64_t kb = std::stoull(line.substr(pos + 9));
      EXPECT_EQ(n.memory_bytes, kb * 1024) << "node " << n.os_index;
    }
  }
  EXPECT_EQ(cpus, static_cast<size_t>(topo->num_pus()));
  // GPUs: one per CUDA device (none on a machine without a GPU).
  EXPECT_EQ(topo->gpus().size(), static_cast<size_t>(gpu_count()));
  // Each GPU's node is the kernel's (its PCI device's numa_node in sysfs); where the kernel
  // does not say (-1), the only node of a one-node machine, else unknown (-1).
  for (const auto& g : topo->gpus()) {
    long kernel_node = -1;
    std::ifstream("/sys/bus/pci/devices/" + g.pci_bus_id + "/numa_node") >> kernel_node;
    const int one_node = topo->numa_nodes().size() == 1 ? topo->numa_nodes()[0].os_index : -1;
    EXPECT_EQ(g.numa_node, kernel_node >= 0 ? static_cast<int>(kernel_node) : one_node)
        << g.pci_bus_id;
  }
}

TEST(Topology, SystemIsCachedAndShared) {
  auto a = Topology::system();
  auto b = Topology::system();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
}

TEST(Topology, BindThreadToNodeAndCpu) {
  auto topo = this_machine();
  ASSERT_TRUE(topo);
  const NumaNodeInfo& node = topo->numa_nodes().back();
  if (node.cpus.empty()) GTEST_SKIP() << "last NUMA node has no CPUs";
  Status st1, st2;
  Result<std::vector<int>> cpus1 = std::vector<int>{}, cpus2 = std::vector<int>{};
  std::thread th([&] {
    st1 = topo->bind_thread_to_numa_node(node.os_index);
    cpus1 = topo->thread_cpus();
    st2 = topo->bind_thread_to_cpus({node.cpus.front()});
    cpus2 = topo->thread_cpus();
  });
  th.join();
  ASSERT_TRUE(st1.ok()) << st1.to_string();
  ASSERT_TRUE(cpus1.ok());
  EXPECT_EQ(*cpus1, node.cpus);
  ASSERT_TRUE(st2.ok()) << st2.to_string();
  EXPECT_EQ(*cpus2, std::vector<int>{node.cpus.front()});
  EXPECT_EQ(topo->bind_thread_to_numa_node(4095).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(topo->bind_thread_to_cpus({1 << 20}).code(), StatusCode::kInvalidArgument);
}

TEST(Topology, PathOnBlockDevice) {
  auto topo = this_machine();
  ASSERT_TRUE(topo);
  const std::string path = STRATA_STORE_TEST_DATA;  // the source tree, on a disk
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  auto info = topo->path_info(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->dev_major, major(st.st_dev));
  EXPECT_EQ(info->dev_minor, minor(st.st_dev));
  const std::string sys =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  if (!std::filesystem::exists(sys)) {
    EXPECT_FALSE(info->device.has_value());
    GTEST_SKIP() << path << " is not on a block device";
  }
  ASSERT_TRUE(info->device.has_value());
  std::filesystem::path real = std::filesystem::canonical(sys);
  std::filesystem::path disk =
      std::filesystem::exists(real / "partition") ? real.parent_path() : real;
  EXPECT_EQ(info->device->name, disk.filename().string());
  std::ifstream lbs(disk / "queue/logical_block_size");
  uint32_t expect_lbs = 0;
  lbs >> expect_lbs;
  EXPECT_EQ(info->logical_block_size, expect_lbs);
  EXPECT_TRUE(info->logical_block_size == 512 || info->logical_block_size == 4096);
  if (topo->numa_nodes().size() == 1) {
    EXPECT_EQ(info->numa_node, topo->numa_nodes()[0].os_index);
  }
  // The alignment to use is a power of two >= 512 (statx DIOALIGN or the block size).
  uint32_t a = info->dio_alignment();
  EXPECT_GE(a, 512u);
  EXPECT_EQ(a & (a - 1), 0u);
  if (info->dio_from_statx && info->dio_offset_align != 0) {
    EXPECT_EQ(a, info->dio_offset_align);
    EXPECT_LE(info->dio_offset_align, 4096u);
  }

  // A regular file on the same device reports the same device and statx values.
  auto file_info = topo->path_info(path + "/two_socket_gpu_nvme.xml");
  ASSERT_TRUE(file_info.ok());
  EXPECT_EQ(file_info->device->name, info->device->name);
  EXPECT_EQ(file_info->dio_from_statx, info->dio_from_statx);
  EXPECT_EQ(file_info->dio_offset_align, info->dio_offset_align);
}

TEST(Topology, PathOnTmpfsHasNoBlockDevice) {
  auto topo = this_machine();
  ASSERT_TRUE(topo);
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  auto info = topo->path_info("/dev/shm");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_FALSE(info->device.has_value());
  EXPECT_EQ(info->logical_block_size, 0u);
  // tmpfs has no O_DIRECT alignment to report; the fallback is 4096.
  if (!info->dio_from_statx) {
    EXPECT_EQ(info->dio_alignment(), 4096u);
  }
}

TEST(Topology, PathMissing) {
  auto topo = this_machine();
  ASSERT_TRUE(topo);
  auto info = topo->path_info("/nonexistent/strata/dir");
  EXPECT_EQ(info.status().code(), StatusCode::kNotFound);
  EXPECT_NE(info.status().message().find("/nonexistent/strata/dir"), std::string::npos);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(HostFeatures, MatchTheKernel) {
  HostFeatures f = probe_host_features();
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (std::getline(thp, line)) {
    EXPECT_NE(line.find("[" + f.thp_mode + "]"), std::string::npos) << line;
  } else {
    EXPECT_EQ(f.thp_mode, "");
  }
  struct rlimit rl {};
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &rl), 0);
  EXPECT_EQ(f.memlock_limit_bytes, rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur);
  EXPECT_EQ(f.hugetlb_page_bytes % 4096, 0u);
  EXPECT_LE(f.hugetlb_pages_free, f.hugetlb_pages_total);
  // io_uring works here unless the kernel or a seccomp filter says otherwise (errno kept).
  EXPECT_EQ(f.io_uring, f.io_uring_errno == 0);
  if (!f.io_uring) {
    EXPECT_TRUE(f.io_uring_errno == ENOSYS || f.io_uring_errno == EPERM ||
                f.io_uring_errno == ENOMEM)
        << f.io_uring_errno;
  }
}

}  // namespace
}  // namespace strata
