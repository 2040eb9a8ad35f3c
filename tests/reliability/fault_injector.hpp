// A fault injector for the reliability tests (store/src/io_fault.hpp): rules that fail or
// shorten every n-th call at a site, up to a limit, and counts of what was injected.
#pragma once

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "io_fault.hpp"

namespace strata::reliability {

using io::fault::Site;

inline const char* site_name(Site s) {
  switch (s) {
    case Site::kSetup: return "io_uring_setup";
    case Site::kOpenDirect: return "open(O_DIRECT)";
    case Site::kSubmit: return "io_uring_enter";
    case Site::kRead: return "read";
    case Site::kWrite: return "write";
    case Site::kSync: return "fdatasync";
  }
  return "?";
}

/// One rule: at `site`, calls every, 2*every, ... (1-based) get `err` (a positive errno),
/// or with err == 0 a short transfer (half of what the kernel did, at least 1 byte), at
/// most `limit` times.
struct FaultRule {
  Site site;
  int err = 0;
  uint64_t every = 1;
  uint64_t limit = 1;
};

class FaultInjector final : public io::fault::Injector {
 public:
  explicit FaultInjector(std::vector<FaultRule> rules) : rules_(std::move(rules)), calls_(rules_.size()), hits_(rules_.size()) {
    io::fault::install(this);
  }
  ~FaultInjector() override { io::fault::install(nullptr); }
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  int64_t filter(Site site, const std::string& path, int64_t res) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++seen_[static_cast<int>(site)];
    for (size_t i = 0; i < rules_.size(); ++i) {
      const FaultRule& r = rules_[i];
      if (r.site != site || hits_[i] >= r.limit) continue;
      if (++calls_[i] % r.every != 0) continue;
      if (r.err == 0) {
        if (res <= 1) continue;  // nothing to shorten (a 1-byte or failed transfer)
        ++hits_[i];
        last_path_ = path;
        return res / 2;
      }
      ++hits_[i];
      last_path_ = path;
      return -static_cast<int64_t>(r.err);
    }
    return res;
  }

  /// Faults injected by rule i.
  uint64_t injected(size_t i) const {
    std::lock_guard<std::mutex> lk(mu_);
    return hits_[i];
  }
  uint64_t injected() const {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t n = 0;
    for (auto h : hits_) n += h;
    return n;
  }
  /// Calls seen at `site` (faulted or not).
  uint64_t seen(Site site) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = seen_.find(static_cast<int>(site));
    return it == seen_.end() ? 0 : it->second;
  }
  std::string last_path() const {
    std::lock_guard<std::mutex> lk(mu_);
    return last_path_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<FaultRule> rules_;
  std::vector<uint64_t> calls_, hits_;
  std::map<int, uint64_t> seen_;
  std::string last_path_;
};

}  // namespace strata::reliability
