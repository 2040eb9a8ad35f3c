// strata::base — Future<T>/Promise<T>: the one async primitive of the library.
//
// A Future is a shared handle to a Result<T> that some thread (an I/O worker, a
// collective, the optimizer pipeline) fills in once. Copies share the same state.
// Callbacks registered with on_ready() run on the completing thread (or immediately on the
// caller's thread when already ready); they must not block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "strata/base/status.hpp"

namespace strata {

namespace detail {
template <class T>
struct FutureState {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<T>> result;
  std::vector<std::function<void(const Result<T>&)>> callbacks;

  void complete(Result<T> r) {
    std::vector<std::function<void(const Result<T>&)>> cbs;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (result.has_value()) return;  // first completion wins
      result.emplace(std::move(r));
      cbs.swap(callbacks);
    }
    cv.notify_all();
    for (auto& cb : cbs) cb(*result);
  }
};
}  // namespace detail

template <class T>
class Promise;

/// Handle to a result that becomes available later.
/// Thread-safety: all members may be called concurrently from any thread.
template <class T>
class Future {
 public:
  /// An invalid future: valid() is false, ready() is true, wait() returns at once and
  /// result() is FailedPrecondition.
  Future() = default;

  bool valid() const noexcept { return state_ != nullptr; }

  /// True when the result is available (never blocks).
  bool ready() const {
    if (!state_) return true;
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->result.has_value();
  }

  /// Blocks until the result is available.
  void wait() const {
    if (!state_) return;
    std::unique_lock<std::mutex> lk(state_->mu);
    state_->cv.wait(lk, [&] { return state_->result.has_value(); });
  }

  /// Blocks for at most `timeout`; returns true when the result is available.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    if (!state_) return true;
    std::unique_lock<std::mutex> lk(state_->mu);
    return state_->cv.wait_for(lk, timeout, [&] { return state_->result.has_value(); });
  }

  /// Waits, then returns the result (a reference valid as long as any copy of this future).
  const Result<T>& result() const {
    if (!state_) return invalid_result();
    wait();
    return *state_->result;
  }

  /// Waits at most `timeout`; DeadlineExceeded when the result is not ready by then.
  template <class Rep, class Period>
  Result<T> result_for(std::chrono::duration<Rep, Period> timeout) const {
    if (!wait_for(timeout)) return deadline_exceeded("future not ready within the timeout");
    return result();
  }

  /// Registers `cb` to run once with the result: immediately on this thread when ready,
  /// otherwise on the completing thread. `cb` must not block.
  void on_ready(std::function<void(const Result<T>&)> cb) const {
    if (!state_) {
      cb(invalid_result());
      return;
    }
    {
      std::lock_guard<std::mutex> lk(state_->mu);
      if (!state_->result.has_value()) {
        state_->callbacks.push_back(std::move(cb));
        return;
      }
    }
    cb(*state_->result);
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<detail::FutureState<T>> s) : state_(std::move(s)) {}
  static const Result<T>& invalid_result() {
    static const Result<T> r(failed_precondition("wait on an invalid (default) future"));
    return r;
  }
  std::shared_ptr<detail::FutureState<T>> state_;
};

/// The producing side. Move-only. Dropping an unfulfilled promise completes its future
/// with Cancelled, so a waiter never hangs on a lost promise.
template <class T>
class Promise {
 public:
  Promise() : state_(std::make_shared<detail::FutureState<T>>()) {}
  Promise(Promise&&) noexcept = default;
  Promise& operator=(Promise&& o) noexcept {
    if (this != &o) {
      abandon();
      state_ = std::move(o.state_);
    }
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { abandon(); }

  Future<T> future() const { return Future<T>(state_); }

  /// Completes the future (first call wins; later calls are ignored).
  void set(Result<T> r) {
    if (state_) state_->complete(std::move(r));
  }
  void set_error(Status s) { set(Result<T>(std::move(s))); }
  template <class U = T, class = std::enable_if_t<!std::is_void_v<U>>>
  void set_value(U v) {
    set(Result<T>(std::move(v)));
  }
  template <class U = T, class = std::enable_if_t<std::is_void_v<U>>>
  void set_value() {
    set(Result<void>());
  }

 private:
  void abandon() {
    if (state_ && state_.use_count() >= 1) {
      bool done;
      {
        std::lock_guard<std::mutex> lk(state_->mu);
        done = state_->result.has_value();
      }
      if (!done) state_->complete(Result<T>(cancelled("promise dropped before completion")));
    }
  }
  std::shared_ptr<detail::FutureState<T>> state_;
};

/// A future that is already complete.
template <class T>
Future<T> make_ready_future(Result<T> r) {
  Promise<T> p;
  p.set(std::move(r));
  return p.future();
}
inline Future<void> make_ready_future() { return make_ready_future(Result<void>()); }

/// Completes when every input is complete: OK if all succeeded, otherwise the first error
/// in input order. An empty input is ready at once.
template <class T>
Future<void> when_all(const std::vector<Future<T>>& futures) {
  if (futures.empty()) return make_ready_future();
  struct Join {
    std::mutex mu;
    size_t remaining;
    std::vector<Status> errors;
    Promise<void> promise;
  };
  auto j = std::make_shared<Join>();
  j->remaining = futures.size();
  j->errors.resize(futures.size());
  Future<void> out = j->promise.future();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].on_ready([j, i](const Result<T>& r) {
      bool last;
      {
        std::lock_guard<std::mutex> lk(j->mu);
        if (!r.ok()) j->errors[i] = r.status();
        last = --j->remaining == 0;
      }
      if (last) {
        for (auto& e : j->errors) {
          if (!e.ok()) {
            j->promise.set_error(e);
            return;
          }
        }
        j->promise.set_value();
      }
    });
  }
  return out;
}

}  // namespace strata
