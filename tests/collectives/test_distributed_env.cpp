// torchrun's environment contract: read_distributed_env() and create_communicator_from_env().
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/collectives/communicator.hpp"

using namespace strata;

namespace {
struct EnvGuard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  EnvGuard() {
    for (const char* k : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}) {
      const char* v = getenv(k);
      saved.emplace_back(k, v ? std::optional<std::string>(v) : std::nullopt);
    }
  }
  ~EnvGuard() {
    for (auto& [k, v] : saved) {
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }
};
void set_contract(const char* addr, const char* port, const char* rank, const char* world,
                  const char* local) {
  auto put = [](const char* k, const char* v) { v ? setenv(k, v, 1) : unsetenv(k); };
  put("MASTER_ADDR", addr);
  put("MASTER_PORT", port);
  put("RANK", rank);
  put("WORLD_SIZE", world);
  put("LOCAL_RANK", local);
}
void expect_env_error(const char* var) {
  auto e = read_distributed_env();
  ASSERT_FALSE(e.ok()) << "expected an error naming " << var;
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find(var), std::string::npos) << e.status().message();
}
}  // namespace

TEST(DistributedEnv, ParsesTorchrunContract) {
  EnvGuard g;
  set_contract("10.0.0.1", "29500", "2", "4", "1");
  auto e = read_distributed_env();
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 1);
  set_contract("h", "29500", "3", "4", nullptr);
  EXPECT_EQ(read_distributed_env()->local_rank, 3);
}

TEST(DistributedEnv, MissingOrMalformedVariablesAreNamed) {
  EnvGuard g;
  set_contract(nullptr, "29500", "0", "1", "0");
  expect_env_error("MASTER_ADDR");
  set_contract("h", nullptr, "0", "1", "0");
  expect_env_error("MASTER_PORT");
  set_contract("h", "70000", "0", "1", "0");
  expect_env_error("MASTER_PORT");
  set_contract("h", "29500x", "0", "1", "0");
  expect_env_error("MASTER_PORT");
  set_contract("h", "29500", nullptr, "1", "0");
  expect_env_error("RANK");
  set_contract("h", "29500", "-1", "1", "0");
  expect_env_error("RANK");
  set_contract("h", "29500", "2", "2", "0");
  expect_env_error("RANK");
  set_contract("h", "29500", "0", nullptr, "0");
  expect_env_error("WORLD_SIZE");
  set_contract("h", "29500", "0", "0", "0");
  expect_env_error("WORLD_SIZE");
  set_contract("h", "29500", "0", "2", "two");
  expect_env_error("LOCAL_RANK");
  auto c = create_communicator_from_env();
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
}
