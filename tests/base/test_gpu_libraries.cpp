// The run-time loader of the CUDA runtime and NCCL (strata/base/gpu_libraries.hpp), in this
// process as ctest starts it (no STRATA_CUDART_LIBRARY / STRATA_NCCL_LIBRARY set). Which
// outcome is right depends on the host, so each test checks the outcome's shape exactly:
// built without CUDA -> never loaded, Unimplemented; loaded -> a path, a version, no error;
// not loaded -> an error naming each file tried with dlerror(), Unavailable. The environment
// variables and the CPU-only host are tested in separate processes (gpu_libraries.* ctest
// tests, tests/base/gpu_libraries/check.cmake).
#include "strata/base/gpu_libraries.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <thread>
#include <vector>

using namespace strata;

namespace {

void expect_consistent(const GpuLibraryInfo& lib, const std::string& name,
                       const std::string& env_var, const std::string& soname_prefix) {
  EXPECT_EQ(lib.name, name);
  EXPECT_EQ(lib.env_var, env_var);
  if (!lib.built) {
    EXPECT_FALSE(lib.loaded);
    EXPECT_TRUE(lib.attempts.empty());
    EXPECT_EQ(lib.error, name +
                             " not loaded: strata was built without CUDA (STRATA_WITH_CUDA=OFF "
                             "or no CUDA toolkit at configure time)");
    return;
  }
  ASSERT_FALSE(lib.attempts.empty());
  if (lib.loaded) {
    EXPECT_EQ(lib.error, "");
    EXPECT_TRUE(std::filesystem::exists(lib.path)) << lib.path;
    EXPECT_NE(lib.path.find(soname_prefix), std::string::npos) << lib.path;
    EXPECT_TRUE(std::regex_match(lib.version, std::regex("[0-9]+\\.[0-9]+(\\.[0-9]+)?")))
        << lib.version;
    // The last attempt is the one that loaded; the first is the soname (nothing set).
    EXPECT_TRUE(lib.attempts.back().ends_with(": loaded " + lib.path)) << lib.attempts.back();
    EXPECT_EQ(lib.attempts.front().rfind(soname_prefix, 0), 0u) << lib.attempts.front();
  } else {
    EXPECT_EQ(lib.path, "");
    EXPECT_EQ(lib.version, "");
    std::string joined;
    for (const auto& a : lib.attempts) joined += (joined.empty() ? "" : "; ") + a;
    EXPECT_EQ(lib.error, name + " not loaded: " + joined);
    // Each attempt: "<file> (<source>): <dlerror() or the missing symbol>".
    for (const auto& a : lib.attempts) {
      EXPECT_TRUE(std::regex_search(a, std::regex("^[^ ]+ \\([^)]+\\): .+"))) << a;
    }
  }
}

}  // namespace

TEST(GpuLibraries, CudaRuntimeOutcomeIsConsistent) {
  expect_consistent(cuda_runtime_library(), "CUDA runtime", "STRATA_CUDART_LIBRARY",
                    "libcudart.so.");
}

TEST(GpuLibraries, NcclOutcomeIsConsistent) {
  expect_consistent(nccl_library(), "NCCL", "STRATA_NCCL_LIBRARY", "libnccl.so.");
}

TEST(GpuLibraries, RequireReportsTheOutcome) {
  for (const GpuLibraryInfo* lib : {&cuda_runtime_library(), &nccl_library()}) {
    Status st = lib == &nccl_library() ? require_nccl("the test") : require_cuda_runtime("the test");
    if (lib->loaded) {
      EXPECT_TRUE(st.ok()) << st.to_string();
    } else {
      EXPECT_EQ(st.code(), lib->built ? StatusCode::kUnavailable : StatusCode::kUnimplemented);
      EXPECT_EQ(st.message(), "the test: " + lib->error);
    }
  }
}

TEST(GpuLibraries, LoadedOnceUnderConcurrentFirstUse) {
  // Every thread sees the same object (one load per process), whoever asked first.
  std::vector<const GpuLibraryInfo*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&seen, i] {
      seen[i] = i % 2 == 0 ? &cuda_runtime_library() : &nccl_library();
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], i % 2 == 0 ? &cuda_runtime_library() : &nccl_library());
  }
}
