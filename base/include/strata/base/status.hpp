// strata::base — the one error convention of the library: Status and Result<T>.
//
// Every fallible strata function returns a Status (no value) or a Result<T> (a value or a
// Status). No strata function throws across its public API, except where a binding maps a
// Status to its language's exception (Python) or status code (C API). See docs/errors.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strata {

/// Error categories. Stable values: the C API exposes them 1:1 as `strata_status_t`.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,    ///< bad argument from the caller (size, dtype, shape, option)
  kNotFound = 2,           ///< key, path or object absent
  kAlreadyExists = 3,      ///< key present and overwrite not requested
  kOutOfRange = 4,         ///< offset/length past the end of an object or file
  kResourceExhausted = 5,  ///< a budget (bytes, buffers) or a device (ENOSPC) is full
  kFailedPrecondition = 6, ///< object in the wrong state (pinned, locked store, closed)
  kDataLoss = 7,           ///< checksum mismatch, short read past EOF, truncated file
  kUnavailable = 8,        ///< peer dead, timeout of a collective, transient failure
  kIoError = 9,            ///< an OS call failed; errno() says which
  kDeadlineExceeded = 10,  ///< a wait with a timeout expired
  kCancelled = 11,         ///< the operation was cancelled (e.g. engine shut down)
  kUnimplemented = 12,     ///< feature not built in (e.g. CUDA absent)
  kInternal = 13,          ///< a bug in strata
  kPermissionDenied = 14,  ///< EACCES / EPERM / read-only file or store
};

/// Human-readable name of a code, e.g. "NotFound".
std::string_view status_code_name(StatusCode code) noexcept;

/// An error (or success) with a code, a message and an optional errno.
/// Thread-safety: a Status is a value; copies are independent.
class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  ///< OK
  Status(StatusCode code, std::string message, int sys_errno = 0)
      : code_(code), message_(std::move(message)), errno_(sys_errno) {}

  static Status OK() noexcept { return Status(); }

  bool ok() const noexcept { return code_ == StatusCode::kOk; }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  /// The errno of the failed OS call (0 when none).
  int sys_errno() const noexcept { return errno_; }

  /// "NotFound: key 'w1' is not in the store" (+ " (errno 2: No such file or directory)").
  std::string to_string() const;

  /// Returns a copy whose message is prefixed by `context + ": "`. OK stays OK.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_ && a.errno_ == b.errno_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int errno_ = 0;
};

// Constructors for each code. The message should name the thing at fault (key, path,
// offset, option).
Status invalid_argument(std::string msg);
Status not_found(std::string msg);
Status already_exists(std::string msg);
Status out_of_range(std::string msg);
Status resource_exhausted(std::string msg, int sys_errno = 0);
Status failed_precondition(std::string msg);
Status data_loss(std::string msg, int sys_errno = 0);
Status unavailable(std::string msg);
Status deadline_exceeded(std::string msg);
Status cancelled(std::string msg);
Status unimplemented(std::string msg);
Status internal_error(std::string msg);
Status permission_denied(std::string msg, int sys_errno = 0);

/// Maps an errno from a failed OS call to a Status: ENOENT -> NotFound, ENOSPC/EDQUOT ->
/// ResourceExhausted, EACCES/EPERM/EROFS -> PermissionDenied, EINVAL -> InvalidArgument,
/// ENOMEM -> ResourceExhausted, anything else -> IoError. The errno is kept and appended to
/// the message as "(errno N: strerror)".
Status errno_status(int sys_errno, std::string msg);

/// A value of type T or an error Status. Result<void> carries only a Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) {
      v_ = Status(StatusCode::kInternal, "Result constructed from an OK status without value");
    }
  }

  bool ok() const noexcept { return std::holds_alternative<T>(v_); }
  /// The error, or OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  /// The value. Precondition: ok() (aborts otherwise with the status message).
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T value_or(T fallback) const { return ok() ? std::get<T>(v_) : std::move(fallback); }

 private:
  void check() const;
  std::variant<T, Status> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Status status) : s_(std::move(status)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const noexcept { return s_.ok(); }
  Status status() const { return s_; }
  void value() const;

 private:
  Status s_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr, std::string_view msg);

template <class T>
void Result<T>::check() const {
  if (!ok()) check_failed(__FILE__, __LINE__, "Result::value()", std::get<Status>(v_).to_string());
}

inline const Status& to_status(const Status& s) { return s; }
template <class T>
Status to_status(const Result<T>& r) { return r.status(); }

}  // namespace strata

/// Internal invariant: aborts with file, line and the expression when `cond` is false.
#define STRATA_CHECK(cond)                                               \
  do {                                                                   \
    if (!(cond)) ::strata::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define STRATA_CHECK_MSG(cond, msg)                                         \
  do {                                                                      \
    if (!(cond)) ::strata::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

/// Returns the Status from the enclosing function when `expr` (Status or Result) failed.
#define STRATA_RETURN_IF_ERROR(expr)                                   \
  do {                                                                 \
    auto&& strata_status_tmp_ = (expr);                                \
    if (!strata_status_tmp_.ok()) return ::strata::to_status(strata_status_tmp_); \
  } while (0)

/// `STRATA_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result or returns its error.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(strata_result_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
