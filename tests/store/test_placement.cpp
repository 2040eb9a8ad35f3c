// NUMA placement of a store (placement.hpp) on 2- and 4-socket machines with GPUs and NVMe
// drives on different sockets (XML topologies in tests/store/data, written by
// make_two_socket_xml.py), on a synthetic machine without I/O devices, and in a store
// opened on this machine (engines and pools placed as planned).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "strata/store/placement.hpp"
#include "strata/store/store.hpp"
#include "strata/store/topology.hpp"
#include "test_store_util.hpp"

namespace strata {
namespace {

std::shared_ptr<const Topology> xml(const std::string& name) {
  auto t = Topology::load_xml(std::string(STRATA_STORE_TEST_DATA) + "/" + name);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : nullptr;
}

StorePlacement plan(const Topology& t, const std::vector<std::string>& devs, int gpu,
                    int numa = kNumaAuto) {
  auto p = plan_store_placement(t, devs, gpu, numa);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? *p : StorePlacement{};
}

using V = std::vector<int>;

// 2 sockets: nvme0n1 + cuda1 on node 0, cuda0 + nvme1n1 on node 1, vdb local to both.
TEST(Placement, TwoSocketsGpusAndDrivesOnDifferentSockets) {
  auto t = xml("two_socket_gpu_nvme.xml");
  ASSERT_TRUE(t);
  // Each directory is served from its drive's node; the host tier sits by the GPU.
  auto p = plan(*t, {"nvme0n1", "nvme1n1"}, 0);
  EXPECT_EQ(p.dir_nodes, (V{0, 1}));
  EXPECT_EQ(p.gpu_node, 1);
  EXPECT_EQ(p.host_node, 1);
  EXPECT_EQ(p.groups(), (V{0, 1}));
  p = plan(*t, {"nvme0n1", "nvme1n1"}, 1);
  EXPECT_EQ(p.gpu_node, 0);
  EXPECT_EQ(p.host_node, 0);
  // No GPU: the host tier goes where the directories are (a tie: the lower node).
  p = plan(*t, {"nvme1n1"}, -1);
  EXPECT_EQ(p.dir_nodes, V{1});
  EXPECT_EQ(p.gpu_node, -1);
  EXPECT_EQ(p.host_node, 1);
  p = plan(*t, {"nvme1n1", "nvme0n1"}, -1);
  EXPECT_EQ(p.host_node, 0);
  // vdb is local to both nodes (nearest unknown), a tmpfs directory has no device: no
  // binding for them; they share one group.
  p = plan(*t, {"vdb", "", "nvme1n1"}, -1);
  EXPECT_EQ(p.dir_nodes, (V{-1, -1, 1}));
  EXPECT_EQ(p.groups(), (V{-1, 1}));
  EXPECT_EQ(p.host_node, 1);
  p = plan(*t, {"vdb"}, -1);
  EXPECT_EQ(p.host_node, -1);
  EXPECT_EQ(p.describe({"/a"}),
            "nvme dir /a (vdb): staging memory and I/O threads on no binding\n"
            "host tier: pinned memory on no binding");
}

// 4 sockets: nvme0n1 on node 0; cuda0 + nvme1n1 on node 1; cuda1 on node 2; nvme2n1,
// nvme3n1 and cuda2 on node 3.
TEST(Placement, FourSocketsGpusAndDrivesOnDifferentSockets) {
  auto t = xml("four_socket_gpu_nvme.xml");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->numa_nodes().size(), 4u);
  const std::vector<std::string> all = {"nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"};
  auto p = plan(*t, all, 1);  // cuda1: a socket without drives
  EXPECT_EQ(p.dir_nodes, (V{0, 1, 3, 3}));
  EXPECT_EQ(p.groups(), (V{0, 1, 3}));  // two drives on node 3 share an engine and a pool
  EXPECT_EQ(p.gpu_node, 2);
  EXPECT_EQ(p.host_node, 2);
  EXPECT_EQ(p.describe({"/d0", "/d1", "/d2", "/d3"}),
            "nvme dir /d0 (nvme0n1): staging memory and I/O threads on node 0\n"
            "nvme dir /d1 (nvme1n1): staging memory and I/O threads on node 1\n"
            "nvme dir /d2 (nvme2n1): staging memory and I/O threads on node 3\n"
            "nvme dir /d3 (nvme3n1): staging memory and I/O threads on node 3\n"
            "host tier: pinned memory on node 2 (GPU on node 2)");
  p = plan(*t, all, 2);
  EXPECT_EQ(p.gpu_node, 3);
  EXPECT_EQ(p.host_node, 3);
  p = plan(*t, all, 0);
  EXPECT_EQ(p.host_node, 1);
  // No GPU: node 3 holds most directories.
  p = plan(*t, all, -1);
  EXPECT_EQ(p.host_node, 3);
  // A GPU the topology lacks: its node is unknown; the host tier follows the directories.
  p = plan(*t, {"nvme0n1"}, 7);
  EXPECT_EQ(p.gpu_node, -1);
  EXPECT_EQ(p.host_node, 0);
  // An unknown device name: no binding for that directory.
  p = plan(*t, {"sdz", "nvme2n1"}, -1);
  EXPECT_EQ(p.dir_nodes, (V{-1, 3}));
}

TEST(Placement, ForcedNodeNoneAndBadValues) {
  auto t = xml("four_socket_gpu_nvme.xml");
  ASSERT_TRUE(t);
  auto p = plan(*t, {"nvme0n1", "nvme2n1"}, 1, 2);
  EXPECT_EQ(p.dir_nodes, (V{2, 2}));
  EXPECT_EQ(p.host_node, 2);
  EXPECT_EQ(p.gpu_node, 2);
  p = plan(*t, {"nvme0n1", "nvme2n1"}, 1, kNumaNone);
  EXPECT_EQ(p.dir_nodes, (V{-1, -1}));
  EXPECT_EQ(p.host_node, -1);
  EXPECT_EQ(p.gpu_node, -1);
  auto bad = plan_store_placement(*t, {"nvme0n1"}, -1, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().to_string(),
            "InvalidArgument: StoreOptions.numa_node=4: the machine has no NUMA node 4 "
            "(4 nodes)");
  bad = plan_store_placement(*t, {"nvme0n1"}, -1, -3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().to_string(),
            "InvalidArgument: StoreOptions.numa_node=-3: expected a node number, -1 "
            "(automatic) or -2 (none)");
}

TEST(Placement, SyntheticMachineHasNoDevices) {
  // Synthetic topologies have no I/O devices: every directory is unbound on 2 nodes; on a
  // single node everything is on that node.
  auto two = Topology::load_synthetic("pack:2 numa:1 core:2 pu:1");
  ASSERT_TRUE(two.ok());
  auto p = plan(**two, {"nvme0n1", ""}, -1);
  EXPECT_EQ(p.dir_nodes, (V{-1, -1}));
  EXPECT_EQ(p.host_node, -1);
  auto one = Topology::load_synthetic("pack:1 numa:1 core:2 pu:1");
  ASSERT_TRUE(one.ok());
  p = plan(**one, {"nvme0n1", ""}, 0);
  EXPECT_EQ(p.dir_nodes, (V{0, 0}));
  EXPECT_EQ(p.gpu_node, 0);
  EXPECT_EQ(p.host_node, 0);
}

TEST(Placement, StoreOnThisMachineFollowsItsPlan) {
  // The store's placement is the plan for its directories on this machine, and a forced
  // node it lacks fails the open with the planner's error.
  auto topo = Topology::system();
  ASSERT_TRUE(topo.ok()) << topo.status().to_string();
  store_test::TempDir d;
  auto o = store_test::small_options(d.path());
  o.nvme_dirs = {d.sub("a"), d.sub("b")};
  auto s = store_test::open_or_die(o);
  ASSERT_TRUE(s);
  auto want = plan_store_placement_for_paths(**topo, s->options().nvme_dirs,
                                             s->has_device() ? o.device_id : -1, kNumaAuto);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  EXPECT_EQ(s->placement().dir_nodes, want->dir_nodes);
  EXPECT_EQ(s->placement().dir_devices, want->dir_devices);
  EXPECT_EQ(s->placement().host_node, want->host_node);
  // I/O still works through the placed engines and pools.
  auto v = store_test::pattern(3u << 20, 71);
  ASSERT_OK(s->put("x", v.data(), TensorDesc::bytes(v.size())));
  store_test::expect_reads_back(*s, "x", v);
  ASSERT_OK(s->close());

  const int missing = static_cast<int>((*topo)->numa_nodes().back().os_index) + 1;
  store_test::TempDir d2;
  auto bad = store_test::small_options(d2.path());
  bad.numa_node = missing;
  auto r = Store::open(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("StoreOptions.numa_node=" + std::to_string(missing)),
            std::string::npos)
      << r.status().to_string();
  EXPECT_TRUE(std::filesystem::is_empty(d2.path()));  // refused before anything was created
  // kNumaNone binds nothing.
  store_test::TempDir d3;
  auto none = store_test::small_options(d3.path());
  none.numa_node = kNumaNone;
  auto n = store_test::open_or_die(none);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->placement().dir_nodes, V{-1});
  EXPECT_EQ(n->placement().host_node, -1);
}

}  // namespace
}  // namespace strata
