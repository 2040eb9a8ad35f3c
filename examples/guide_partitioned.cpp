// The C++ guide's partitioned-read example (docs/guide-cpp.md): every rank keeps only its
// slice of a tensor in its own store (its own NVMe directory); fetch_partitioned() has each
// rank read its slice and all-gathers the whole tensor. Run under a launcher:
//   strata launch -n 2 guide_partitioned_cpp DIR      (rank r's store: DIR/rank<r>)
// Exit status 0 on every rank when every check holds.
#include <cstdio>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/store/partitioned.hpp"
#include "strata/store/store.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: strata launch -n N %s DIR\n", argv[0]);
    return 2;
  }
  // [partitioned]
  auto comm = strata::create_communicator_from_env();  // RANK, WORLD_SIZE, MASTER_ADDR/PORT
  if (!comm.ok()) {
    std::fprintf(stderr, "communicator: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  const int rank = (*comm)->rank();
  strata::StoreOptions so;
  so.path = std::string(argv[1]) + "/rank" + std::to_string(rank);  // one drive per rank
  so.host_budget_bytes = 16ull << 20;
  so.staging_bytes = 16ull << 20;
  so.chunk_bytes = 1ull << 20;
  auto store = strata::Store::open(so);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().to_string().c_str());
    return 1;
  }
  const strata::TensorDesc desc{strata::DType::kFloat32, {1'000'003}};
  std::vector<float> full(desc.numel());
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i % 1000);
  strata::PartitionOptions po;
  po.put.overwrite = true;
  // Collective: each rank stores only the slice it owns (ceil(numel / N) elements).
  strata::Status st = strata::put_partitioned(**store, **comm, "emb", full.data(), desc, po);
  std::vector<float> out(desc.numel(), -1.0f);
  // Collective: each rank reads its slice from its own drive, then all-gather, pipelined.
  if (st.ok()) st = strata::fetch_partitioned(**store, **comm, "emb", out.data(), desc, po);
  if (!st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
    return 1;
  }
  auto info = strata::stat_partitioned(**store, "emb");
  // [partitioned]
  if (!info.ok() || out != full) {
    std::fprintf(stderr, "rank %d: fetched tensor differs\n", rank);
    return 1;
  }
  std::printf("rank %d of %d: owns elements [%llu, %llu), fetched all %llu: OK\n", rank,
              (*comm)->size(), static_cast<unsigned long long>(info->owned_begin),
              static_cast<unsigned long long>(info->owned_begin + info->owned_numel),
              static_cast<unsigned long long>(desc.numel()));
  return (*store)->close().ok() ? 0 : 1;
}
