// The update kernels' worker pool (make_kernel_pool): a base ThreadPool bound through the
// store's Topology, by kernel NUMA node numbers; and the offloaded optimizer's placement of
// its kernel threads and pinned memory on one node, on a topology whose kernel (OS) and
// hwloc logical node numbers differ (data/swapped_numa_nodes.xml).
#include <gtest/gtest.h>
#include <hwloc.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "offload_test_util.hpp"
#include "strata/optimizer/kernel_pool.hpp"
#include "strata/store/topology.hpp"

#ifndef STRATA_SWAPPED_NUMA_XML
#define STRATA_SWAPPED_NUMA_XML ""
#endif

namespace strata::optimizer {
namespace {

TEST(KernelPool, SplitsWorkIntoContiguousRangesAndIsReusable) {
  KernelPoolPlacement where;
  auto pool = make_kernel_pool({3, -1}, &where).value();
  EXPECT_EQ(pool->num_threads(), 3);
  EXPECT_EQ(where.numa_node, -1);
  EXPECT_TRUE(where.cpus.empty());
  EXPECT_FALSE(where.bound);
  for (int round = 0; round < 100; ++round) {
    std::vector<std::atomic<int>> hits(10);
    pool->parallel_for(10, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  std::atomic<int> calls{0};
  pool->parallel_for(2, [&](size_t b, size_t e) {
    EXPECT_EQ(e - b, 1u);
    calls++;
  });
  EXPECT_EQ(calls.load(), 2);  // a worker with an empty range is not called
  pool->parallel_for(0, [&](size_t, size_t) { calls++; });
  EXPECT_EQ(calls.load(), 2);
}

TEST(KernelPool, BindsToANumaNodeAndRejectsMissingOnes) {
  auto topo = Topology::system().value();
  const NumaNodeInfo& first = topo->numa_nodes().front();
  KernelPoolPlacement where;
  auto pool = make_kernel_pool({0, first.os_index}, &where);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_GE((*pool)->num_threads(), 1);
  EXPECT_EQ(where.numa_node, first.os_index);
  EXPECT_EQ(where.cpus, first.cpus);
  if (!first.cpus.empty() && first.cores > 0) {
    EXPECT_EQ((*pool)->num_threads(), first.cores);
  }
  if (where.bound) {
    // Every worker runs on the node's CPUs.
    std::vector<std::vector<int>> seen((*pool)->num_threads());
    (*pool)->parallel_for(seen.size(), [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) seen[i] = topo->thread_cpus().value_or(std::vector<int>{});
    });
    for (const auto& cpus : seen) EXPECT_EQ(cpus, first.cpus);
  }
  auto bad = make_kernel_pool({1, 4096});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("NUMA node 4096"), std::string::npos);
  EXPECT_EQ(make_kernel_pool({-1, -1}).status().code(), StatusCode::kInvalidArgument);
}

// The premise of the tests below: in the XML, hwloc's logical node 0 is kernel node 1.
TEST(KernelPool, SwappedXmlNumbersNodesDifferentlyFromHwlocsLogicalOrder) {
  hwloc_topology_t t;
  ASSERT_EQ(hwloc_topology_init(&t), 0);
  ASSERT_EQ(hwloc_topology_set_xml(t, STRATA_SWAPPED_NUMA_XML), 0);
  ASSERT_EQ(hwloc_topology_load(t), 0);
  ASSERT_EQ(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE), 2);
  EXPECT_EQ(hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, 0)->os_index, 1u);
  EXPECT_EQ(hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, 1)->os_index, 0u);
  hwloc_topology_destroy(t);
}

TEST(KernelPool, TargetsTheCpusOfTheKernelNodeNumberOnAForeignTopology) {
  auto xml = Topology::load_xml(STRATA_SWAPPED_NUMA_XML).value();
  ASSERT_FALSE(xml->is_this_system());
  for (int node : {0, 1}) {
    KernelPoolPlacement where;
    auto pool = make_kernel_pool({0, node}, *xml, &where);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    EXPECT_EQ(where.numa_node, node);
    // Kernel node 1 holds PUs 0-1 (hwloc's logical node 0), kernel node 0 PUs 2-3.
    EXPECT_EQ(where.cpus, node == 1 ? std::vector<int>({0, 1}) : std::vector<int>({2, 3}));
    EXPECT_EQ((*pool)->num_threads(), 2);  // the node's cores
    EXPECT_FALSE(where.bound);             // another machine's topology: nothing is bound
  }
  // Nodes are not checked against a foreign topology (as the store does).
  KernelPoolPlacement where;
  ASSERT_TRUE(make_kernel_pool({1, 7}, *xml, &where).ok());
  EXPECT_TRUE(where.cpus.empty());
}

// The offloaded optimizer's kernel threads and pinned slots target one node. With
// HWLOC_XMLFILE naming the swapped XML (ctest optimizer.numa_swapped_xml) the store's
// Topology::system() is that XML; elsewhere it is this machine, node = its first node.
TEST(OffloadNumaPlacement, KernelThreadsAndPinnedMemoryTargetTheSameNode) {
  using namespace offload_test;
  auto topo = Topology::system().value();
  const char* xml = std::getenv("HWLOC_XMLFILE");
  const bool swapped = xml != nullptr && std::string(xml) == STRATA_SWAPPED_NUMA_XML;
  if (xml != nullptr && *xml != '\0' && !swapped) GTEST_SKIP() << "HWLOC_XMLFILE names another topology";
  std::vector<int> nodes;
  if (swapped) {
    nodes = {1, 0};
  } else {
    nodes = {topo->numa_nodes().front().os_index};
  }
  for (int node : nodes) {
    TempDir dir;
    std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
    OffloadOptions oo;
    oo.numa_node = node;
    oo.num_buffers = 2;
    auto opt = must(OffloadedOptimizer::create(store, must(builtin_rule_factory("sgd")), {}, oo));
    const OffloadPlacement& p = opt->placement();
    EXPECT_EQ(p.numa_node, node);
    EXPECT_EQ(p.memory_node, node);
    ASSERT_NE(topo->numa_node(node), nullptr);
    EXPECT_EQ(p.thread_cpus, topo->numa_node(node)->cpus);  // the same node, kernel numbering
    if (swapped) {
      EXPECT_EQ(p.thread_cpus, node == 1 ? std::vector<int>({0, 1}) : std::vector<int>({2, 3}));
      EXPECT_FALSE(p.threads_bound);
      EXPECT_FALSE(p.memory_bound);
    }
    // The optimizer works either way.
    const std::vector<float> g(1000, 0.5f);
    const ParamHandle h = must(opt->add_param("w", 1000, nullptr, 0, Placement::kNvme));
    OFFLOAD_ASSERT_OK(opt->set_grad(h, g.data(), DType::kFloat32));
    OFFLOAD_ASSERT_OK(opt->step());
    std::vector<float> w(1000);
    OFFLOAD_ASSERT_OK(opt->read_param(h, w.data()));
    EXPECT_FLOAT_EQ(w[999], -0.5f * 1e-3f);
  }
}

}  // namespace
}  // namespace strata::optimizer
