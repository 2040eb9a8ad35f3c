// The configuration file (config.hpp): every key parsed and applied, the round trip, the
// errors (unknown keys, bad values, unreadable or malformed files) and the precedence
// defaults < file < STRATA_* environment < explicit arguments.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "common/temp_dir.hpp"
#include "strata/store/config.hpp"
#include "strata/store/store.hpp"

namespace strata {
namespace {

using testing::TempDir;

std::string write_file(const TempDir& d, const std::string& name, const std::string& text) {
  const std::string p = d.sub(name);
  std::ofstream(p) << text;
  return p;
}

/// Unsets the variables a test sets, also when it fails.
struct EnvGuard {
  std::vector<const char*> names;
  ~EnvGuard() {
    for (const char* n : names) ::unsetenv(n);
  }
};

const char* kFull = R"({
  "strata_config": 1,
  "io": {"engine": "threads", "block_size": "256KiB", "queue_depth": 8, "workers": 3,
         "direct": false, "submit_batch": 4, "numa_node": -1,
         "allow_buffered_fallback": false, "allow_threads_fallback": false,
         "register_files": false, "register_buffers": false, "sqpoll": true, "iopoll": true},
  "store": {"nvme_dirs": ["/a", "/b"], "chunk_bytes": "8MiB", "host_budget_bytes": 123,
            "nvme_budget_bytes": "1GiB", "device_budget_bytes": 0, "device_id": 1,
            "staging_bytes": 65536, "verify_checksums": false, "durability": "flush",
            "worker_threads": 7, "numa_node": -2, "stats_interval_seconds": 0.5},
  "optimizer": {"sub_group_numel": 1048576, "num_buffers": 3, "pinned_budget_bytes": "64MiB",
                "host_budget_bytes": 0, "num_threads": 5, "numa_node": 0,
                "default_placement": "host", "verify_on_open": true, "arithmetic": "torch",
                "state_dtype": "bf16", "overlap_backward": true, "overlap_bucket_numel": 1000},
  "measured": {"nvme_read_bytes_per_s": 1.5e9, "nvme_write_bytes_per_s": 9e8,
               "store_read_bytes_per_s": 1.125e9, "store_write_bytes_per_s": 6.25e8,
               "memory_copy_bytes_per_s": 1e10, "adam_params_per_s": 2e8,
               "allgather_bytes_per_s": 3e9, "pcie_bytes_per_s": 2.4e10,
               "paths": ["/a", "/b"]}
})";

TEST(Config, EveryKeyIsParsedAndApplied) {
  TempDir d;
  const std::string f = write_file(d, "c.json", kFull);
  auto c = Config::load(f);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->file, f);
  StoreOptions o;
  c->apply(o);
  EXPECT_EQ(o.engine_options.kind, EngineKind::kThreads);
  EXPECT_EQ(o.engine_options.block_size, 256u << 10);
  EXPECT_EQ(o.engine_options.queue_depth, 8u);
  EXPECT_EQ(o.engine_options.workers, 3u);
  EXPECT_FALSE(o.engine_options.direct);
  EXPECT_EQ(o.engine_options.submit_batch, 4u);
  EXPECT_EQ(o.engine_options.numa_node, -1);
  EXPECT_FALSE(o.engine_options.allow_buffered_fallback);
  EXPECT_FALSE(o.engine_options.allow_threads_fallback);
  EXPECT_FALSE(o.engine_options.register_files);
  EXPECT_FALSE(o.engine_options.register_buffers);
  EXPECT_TRUE(o.engine_options.sqpoll);
  EXPECT_TRUE(o.engine_options.iopoll);
  EXPECT_EQ(o.nvme_dirs, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(o.chunk_bytes, 8u << 20);
  EXPECT_EQ(o.host_budget_bytes, 123u);
  EXPECT_EQ(o.nvme_budget_bytes, 1u << 30);
  EXPECT_EQ(o.device_budget_bytes, 0u);
  EXPECT_EQ(o.device_id, 1);
  EXPECT_EQ(o.staging_bytes, 65536u);
  EXPECT_FALSE(o.verify_checksums);
  EXPECT_EQ(o.durability, Durability::kOnFlush);
  EXPECT_EQ(o.worker_threads, 7u);
  EXPECT_EQ(o.numa_node, -2);
  EXPECT_EQ(o.stats_interval, std::chrono::milliseconds(500));
  EXPECT_EQ(o.config_file, f);
  const OptimizerConfig& p = c->optimizer;
  EXPECT_EQ(p.sub_group_numel, 1048576u);
  EXPECT_EQ(p.num_buffers, 3);
  EXPECT_EQ(p.pinned_budget_bytes, 64u << 20);
  EXPECT_EQ(p.host_budget_bytes, 0u);
  EXPECT_EQ(p.num_threads, 5);
  EXPECT_EQ(p.numa_node, 0);
  EXPECT_EQ(p.default_placement, "host");
  EXPECT_EQ(p.verify_on_open, true);
  EXPECT_EQ(p.arithmetic, "torch");
  EXPECT_EQ(p.state_dtype, "bf16");
  EXPECT_EQ(p.overlap_backward, true);
  EXPECT_EQ(p.overlap_bucket_numel, 1000u);
  const MeasuredConfig& m = c->measured;
  EXPECT_EQ(m.nvme_read_bytes_per_s, 1.5e9);
  EXPECT_EQ(m.nvme_write_bytes_per_s, 9e8);
  EXPECT_EQ(m.store_read_bytes_per_s, 1.125e9);
  EXPECT_EQ(m.store_write_bytes_per_s, 6.25e8);
  EXPECT_EQ(m.memory_copy_bytes_per_s, 1e10);
  EXPECT_EQ(m.adam_params_per_s, 2e8);
  EXPECT_EQ(m.allgather_bytes_per_s, 3e9);
  EXPECT_EQ(m.pcie_bytes_per_s, 2.4e10);
  EXPECT_EQ(m.paths, (std::vector<std::string>{"/a", "/b"}));

  // Round trip: written back and parsed again, the same configuration.
  const std::string f2 = d.sub("c2.json");
  ASSERT_TRUE(c->save(f2).ok());
  auto again = Config::load(f2);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  again->file = c->file;
  EXPECT_EQ(*again, *c);
  EXPECT_EQ(again->to_json(), c->to_json());
  EXPECT_EQ(again->measured.store_read_bytes_per_s, 1.125e9);
  EXPECT_EQ(again->measured.store_write_bytes_per_s, 6.25e8);
  EXPECT_EQ(c->to_json().rfind("{\n  \"strata_config\": 1,\n  \"io\": {\n", 0), 0u) << c->to_json();
}

TEST(Config, AnEmptyFileObjectChangesNothing) {
  auto c = Config::parse("{}", "x.json");
  ASSERT_TRUE(c.ok());
  StoreOptions o;
  c->apply(o);
  const StoreOptions d;
  EXPECT_EQ(o.engine_options.block_size, d.engine_options.block_size);
  EXPECT_EQ(o.chunk_bytes, d.chunk_bytes);
  EXPECT_EQ(o.worker_threads, d.worker_threads);
  EXPECT_EQ(c->to_json(), "{\n  \"strata_config\": 1\n}\n");
}

std::string error_of(const std::string& text) {
  auto c = Config::parse(text, "/etc/s.json");
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  return c.status().message();
}

TEST(Config, UnknownKeysAreErrorsNamingThePathAndTheFile) {
  EXPECT_EQ(error_of(R"({"io": {"queue_dpeth": 8}})"),
            "config file '/etc/s.json': unknown key 'io.queue_dpeth' (did you mean "
            "'io.queue_depth'?); known keys of 'io': engine, block_size, queue_depth, workers, "
            "direct, submit_batch, numa_node, allow_buffered_fallback, allow_threads_fallback, "
            "register_files, register_buffers, sqpoll, iopoll");
  EXPECT_NE(error_of(R"({"store": {"stats_interval": 1}})")
                .find("unknown key 'store.stats_interval' (did you mean "
                      "'store.stats_interval_seconds'?)"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"stor": {}})"),
            "config file '/etc/s.json': unknown key 'stor' (did you mean 'store'?); known "
            "keys: strata_config, io, store, optimizer, measured");
  EXPECT_NE(error_of(R"({"measured": {"nvme_read_gbps": 1}})")
                .find("unknown key 'measured.nvme_read_gbps'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"optimizer": {"lr": 0.1}})").find("unknown key 'optimizer.lr';"),
            std::string::npos);
}

TEST(Config, BadValuesNameKeyValueAndFile) {
  EXPECT_EQ(error_of(R"({"io": {"queue_depth": 0}})"),
            "config file '/etc/s.json': io.queue_depth: expected an integer in 1..4096, got 0");
  EXPECT_EQ(error_of(R"({"io": {"workers": "2"}})"),
            "config file '/etc/s.json': io.workers: expected an integer in 1..64, got \"2\"");
  EXPECT_EQ(error_of(R"({"io": {"engine": "spdk"}})"),
            "config file '/etc/s.json': io.engine: expected one of \"uring\", \"threads\", got "
            "\"spdk\"");
  EXPECT_EQ(error_of(R"({"io": {"direct": 1}})"),
            "config file '/etc/s.json': io.direct: expected true or false, got 1");
  EXPECT_EQ(error_of(R"({"io": {"block_size": "1XB"}})"),
            "config file '/etc/s.json': io.block_size: invalid byte size '1XB': unknown suffix "
            "(use B, KiB, MiB, GiB, TiB or K, M, G, T)");
  EXPECT_EQ(error_of(R"({"io": {"block_size": -4096}})"),
            "config file '/etc/s.json': io.block_size: expected a byte size (an integer or a "
            "string such as \"1MiB\") in 1..1073741824, got -4096");
  EXPECT_EQ(error_of(R"({"store": {"chunk_bytes": 5000}})"),
            "config file '/etc/s.json': store.chunk_bytes: expected a multiple of 4096 bytes, "
            "got 5000");
  EXPECT_EQ(error_of(R"({"store": {"nvme_dirs": ["/a", ""]}})"),
            "config file '/etc/s.json': store.nvme_dirs[1]: expected a non-empty string, got \"\"");
  EXPECT_EQ(error_of(R"({"store": {"durability": "sync"}})"),
            "config file '/etc/s.json': store.durability: expected one of \"put\", \"flush\", "
            "got \"sync\"");
  EXPECT_EQ(error_of(R"({"optimizer": {"num_buffers": 17}})"),
            "config file '/etc/s.json': optimizer.num_buffers: expected an integer in 0..16, "
            "got 17");
  EXPECT_EQ(error_of(R"({"optimizer": {"state_dtype": "fp16"}})"),
            "config file '/etc/s.json': optimizer.state_dtype: expected one of \"fp32\", "
            "\"bf16\", got \"fp16\"");
  EXPECT_EQ(error_of(R"({"optimizer": {"state_dtype": 2}})"),
            "config file '/etc/s.json': optimizer.state_dtype: expected one of \"fp32\", "
            "\"bf16\", got 2");
  EXPECT_EQ(error_of(R"({"measured": {"adam_params_per_s": -1}})"),
            "config file '/etc/s.json': measured.adam_params_per_s: expected a finite number "
            ">= 0, got -1");
  EXPECT_EQ(error_of(R"({"strata_config": 2})"),
            "config file '/etc/s.json': strata_config: expected an integer in 1..1, got 2");
  EXPECT_EQ(error_of(R"({"io": 3})"), "config file '/etc/s.json': io: expected an object, got 3");
  EXPECT_EQ(error_of("[1]"),
            "config file '/etc/s.json': the top level: expected an object, got [1]");
}

TEST(Config, MalformedAndUnreadableFilesNameThePath) {
  const std::string m = error_of("{\n  \"io\": {\"queue_depth\": 8,}\n}");
  EXPECT_EQ(m.rfind("config file '/etc/s.json': parse error at line 2, column 27: ", 0), 0u) << m;
  // a number no double holds: nlohmann's out_of_range, an error naming the file, not an abort
  const std::string big = error_of(R"({"strata_config": 1, "io": {"queue_depth": 1e400}})");
  EXPECT_EQ(big.rfind("config file '/etc/s.json': number overflow parsing '1e400'", 0), 0u) << big;
  TempDir d;
  auto missing = Config::load(d.sub("none.json"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("config file '" + d.sub("none.json") + "'"),
            std::string::npos)
      << missing.status().to_string();
  auto dir = Config::load(d.path());
  EXPECT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find(d.path()), std::string::npos);
}

TEST(Config, PrecedenceDefaultsFileEnvironmentExplicit) {
  TempDir d;
  EnvGuard env{{"STRATA_CONFIG", "STRATA_QUEUE_DEPTH", "STRATA_CHUNK_SIZE"}};
  const std::string f = write_file(
      d, "a.json",
      R"({"io": {"block_size": 262144, "queue_depth": 8}, "store": {"chunk_bytes": "8MiB"}})");
  const std::string g = write_file(d, "b.json", R"({"io": {"block_size": "2MiB"}})");
  {  // no file, no variables: the defaults
    auto o = StoreOptions::from_env();
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->engine_options.block_size, 1u << 20);
    EXPECT_EQ(o->engine_options.queue_depth, 32u);
    EXPECT_EQ(o->config_file, "");
  }
  ::setenv("STRATA_CONFIG", f.c_str(), 1);
  {  // the file over the defaults
    auto o = StoreOptions::from_env();
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->engine_options.block_size, 256u << 10);
    EXPECT_EQ(o->engine_options.queue_depth, 8u);
    EXPECT_EQ(o->chunk_bytes, 8u << 20);
    EXPECT_EQ(o->config_file, f);
    auto e = IoEngineOptions::from_env();
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->block_size, 256u << 10);
  }
  ::setenv("STRATA_QUEUE_DEPTH", "16", 1);
  ::setenv("STRATA_CHUNK_SIZE", "4MiB", 1);
  {  // the environment over the file
    auto o = StoreOptions::from_env();
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->engine_options.block_size, 256u << 10);
    EXPECT_EQ(o->engine_options.queue_depth, 16u);
    EXPECT_EQ(o->chunk_bytes, 4u << 20);
    EXPECT_EQ(IoEngineOptions::from_env()->queue_depth, 16u);
  }
  {  // an explicit file over STRATA_CONFIG (the variables still over both)
    auto o = StoreOptions::from_config(g);
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->engine_options.block_size, 2u << 20);
    EXPECT_EQ(o->engine_options.queue_depth, 16u);
    EXPECT_EQ(o->config_file, g);
    EXPECT_EQ(IoEngineOptions::from_config(g)->block_size, 2u << 20);
  }
  // explicit arguments: set on the options after from_env(), as every binding does
  // (tested through Store.open, the C API and the CLI).
  ::setenv("STRATA_CONFIG", d.sub("missing.json").c_str(), 1);
  auto bad = StoreOptions::from_env();
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("missing.json"), std::string::npos);
  EXPECT_EQ(IoEngineOptions::from_env().status().code(), StatusCode::kNotFound);
}

TEST(Config, AStoreOpenedFromTheFileUsesItsChunkSize) {
  TempDir d;
  EnvGuard env{{"STRATA_CONFIG"}};
  const std::string f = write_file(
      d, "s.json", R"({"store": {"chunk_bytes": "128KiB", "host_budget_bytes": "8MiB",
                      "staging_bytes": "4MiB", "worker_threads": 2}})");
  auto o = StoreOptions::from_config(f);
  ASSERT_TRUE(o.ok());
  o->path = d.sub("store");
  auto s = Store::open(*o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ((*s)->chunk_bytes(), 128u << 10);
  EXPECT_EQ((*s)->options().worker_threads, 2u);
  EXPECT_EQ((*s)->usage().host_budget_bytes, 8u << 20);
  EXPECT_TRUE((*s)->close().ok());
}

}  // namespace
}  // namespace strata
