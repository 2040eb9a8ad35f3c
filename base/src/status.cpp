#include "strata/base/status.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace strata {

std::string_view status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string s(status_code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m), errno_);
}

Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status already_exists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
Status resource_exhausted(std::string m, int e) {
  return {StatusCode::kResourceExhausted, std::move(m), e};
}
Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
Status data_loss(std::string m, int e) { return {StatusCode::kDataLoss, std::move(m), e}; }
Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status deadline_exceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status permission_denied(std::string m, int e) {
  return {StatusCode::kPermissionDenied, std::move(m), e};
}

Status errno_status(int e, std::string msg) {
  char buf[128];
  std::snprintf(buf, sizeof buf, " (errno %d: %s)", e, std::strerror(e));
  msg += buf;
  switch (e) {
    case ENOENT: return {StatusCode::kNotFound, std::move(msg), e};
    case ENOSPC:
    case EDQUOT:
    case ENOMEM: return {StatusCode::kResourceExhausted, std::move(msg), e};
    case EACCES:
    case EPERM:
    case EROFS: return {StatusCode::kPermissionDenied, std::move(msg), e};
    case EINVAL: return {StatusCode::kInvalidArgument, std::move(msg), e};
    case EEXIST: return {StatusCode::kAlreadyExists, std::move(msg), e};
    case ETIMEDOUT: return {StatusCode::kDeadlineExceeded, std::move(msg), e};
    case ECANCELED: return {StatusCode::kCancelled, std::move(msg), e};
    default: return {StatusCode::kIoError, std::move(msg), e};
  }
}

void Result<void>::value() const {
  if (!ok()) check_failed(__FILE__, __LINE__, "Result<void>::value()", s_.to_string());
}

void check_failed(const char* file, int line, const char* expr, std::string_view msg) {
  std::fprintf(stderr, "strata: check failed at %s:%d: %s %.*s\n", file, line, expr,
               static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace strata
