// strata::base — Future<T>/Promise<T>: the one async primitive of the library.
//
// A Future is a shared handle to a Result<T> that some thread (an I/O worker, a
// collective, the optimizer pipeline) fills in once. Copies share the same state.
// Callbacks registered with on_ready() run on the completing thread (or immediately on the
// caller's thread when already ready); they must not block. then() and map() build on
// on_ready() to chain a computation onto a future (TensorStore's MapFuture / Link).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
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
template <class T>
class Future;

namespace detail {
/// The value type of the future a continuation returning R produces: Result<U> -> U,
/// Future<U> -> U, Status and void -> void, any other R -> R.
template <class R>
struct ContinuationValue {
  using type = R;
};
template <class U>
struct ContinuationValue<Result<U>> {
  using type = U;
};
template <class U>
struct ContinuationValue<Future<U>> {
  using type = U;
};
template <>
struct ContinuationValue<Status> {
  using type = void;
};
template <>
struct ContinuationValue<void> {
  using type = void;
};
}  // namespace detail

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

  /// Chains `f` onto this future: returns a future completed with what `f` makes of this
  /// future's result. `f` is called once with `const Result<T>&` (errors included) on the
  /// completing thread, or at once on this thread when the result is already available; it
  /// must not block. `f` may return:
  ///   - Result<U> or a plain U        -> Future<U> with that value or error;
  ///   - Status or void                -> Future<void> (void means OK);
  ///   - Future<U>                     -> Future<U> completed when that future completes.
  /// An invalid (default) future calls `f` with FailedPrecondition. `f` must be copyable.
  template <class F>
  auto then(F f) const;

  /// Like then(), but `f` takes the value (`const T&`, nothing for T = void) and is called
  /// only on success; an error passes through to the returned future unchanged.
  template <class F>
  auto map(F f) const;

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

namespace detail {
/// Calls fn(args...) and completes *p with its outcome (see Future::then()).
template <class U, class F, class... A>
void complete_with(const std::shared_ptr<Promise<U>>& p, F& fn, A&&... args) {
  using R = std::remove_cvref_t<std::invoke_result_t<F&, A...>>;
  if constexpr (std::is_void_v<R>) {
    fn(std::forward<A>(args)...);
    p->set_value();
  } else if constexpr (std::is_same_v<R, Future<U>>) {
    fn(std::forward<A>(args)...).on_ready([p](const Result<U>& r) { p->set(r); });
  } else {
    // Result<U>, Status (U = void) or a plain U: each converts to Result<U>.
    p->set(Result<U>(fn(std::forward<A>(args)...)));
  }
}
}  // namespace detail

template <class T>
template <class F>
auto Future<T>::then(F f) const {
  using R = std::remove_cvref_t<std::invoke_result_t<F&, const Result<T>&>>;
  using U = typename detail::ContinuationValue<R>::type;
  auto p = std::make_shared<Promise<U>>();
  Future<U> out = p->future();
  on_ready([p, f = std::move(f)](const Result<T>& r) mutable { detail::complete_with(p, f, r); });
  return out;
}

template <class T>
template <class F>
auto Future<T>::map(F f) const {
  if constexpr (std::is_void_v<T>) {
    using R = std::remove_cvref_t<std::invoke_result_t<F&>>;
    using U = typename detail::ContinuationValue<R>::type;
    auto p = std::make_shared<Promise<U>>();
    Future<U> out = p->future();
    on_ready([p, f = std::move(f)](const Result<void>& r) mutable {
      if (r.ok()) {
        detail::complete_with(p, f);
      } else {
        p->set_error(r.status());
      }
    });
    return out;
  } else {
    using R = std::remove_cvref_t<std::invoke_result_t<F&, const T&>>;
    using U = typename detail::ContinuationValue<R>::type;
    auto p = std::make_shared<Promise<U>>();
    Future<U> out = p->future();
    on_ready([p, f = std::move(f)](const Result<T>& r) mutable {
      if (r.ok()) {
        detail::complete_with(p, f, r.value());
      } else {
        p->set_error(r.status());
      }
    });
    return out;
  }
}

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
