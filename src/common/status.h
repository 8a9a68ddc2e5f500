// Status and Result<T>: the error type of every fallible kvpush call.
//
// A Status is a code plus a human-readable message (LevelDB style). Errors keep their cause:
// backends and layers pick the most specific code and put the detail (peer name, offset, field)
// into the message. Result<T> holds either a value or a non-OK Status.
//
// Thread-safety: value types; safe to copy between threads, not to mutate concurrently.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvpush {

/// Error codes. The set follows absl/gRPC canonical codes, plus transfer-specific ones.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     ///< caller passed something malformed (bad JSON, bad descriptor, ...)
  kNotFound,            ///< named thing does not exist (model file, region, request id)
  kAlreadyExists,       ///< duplicate registration or id
  kOutOfRange,          ///< offset/length/index outside its bounds
  kResourceExhausted,   ///< no free KV blocks, queue full, memory
  kFailedPrecondition,  ///< object in the wrong state for this call
  kUnimplemented,       ///< feature or format not supported (named in the message)
  kUnavailable,         ///< peer or service not reachable right now
  kDeadlineExceeded,    ///< a deadline or stall deadline passed
  kCancelled,           ///< cancelled by the caller
  kAborted,             ///< aborted by a concurrent event (client went away, peer restarted)
  kPeerGone,            ///< transfer peer died or restarted (new incarnation)
  kDataLoss,            ///< corrupted or truncated data (file, metadata blob)
  kInternal,            ///< invariant broken inside kvpush: a bug
  kIoError,             ///< OS-level I/O failure (open, read, socket)
};

/// Returns the stable lowercase name of a code, e.g. "invalid_argument".
std::string_view StatusCodeName(StatusCode code);

/// A success or an error with a code and a message.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  /// "invalid_argument: <message>" or "ok".
  std::string ToString() const;

  /// Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Shorthand constructors: InvalidArgument("bad field 'x'") etc.
inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status AlreadyExists(std::string m) {
  return {StatusCode::kAlreadyExists, std::move(m)};
}
inline Status OutOfRange(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unimplemented(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status Unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Cancelled(std::string m) {
  return {StatusCode::kCancelled, std::move(m)};
}
inline Status Aborted(std::string m) {
  return {StatusCode::kAborted, std::move(m)};
}
inline Status PeerGone(std::string m) {
  return {StatusCode::kPeerGone, std::move(m)};
}
inline Status DataLoss(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
inline Status Internal(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}
inline Status IoError(std::string m) {
  return {StatusCode::kIoError, std::move(m)};
}

/// Either a T or a non-OK Status. Constructing from an OK Status is a bug (becomes kInternal).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Internal("Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  /// The error; Status::Ok() when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

  T& value() & {
    assert(ok());
    return std::get<T>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<T>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<T>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvpush

#define KVP_CONCAT_INNER_(a, b) a##b
#define KVP_CONCAT_(a, b) KVP_CONCAT_INNER_(a, b)

/// Evaluates a Status expression and returns it from the enclosing function if not OK.
#define KVP_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::kvpush::Status kvp_status_ = (expr);     \
    if (!kvp_status_.ok()) return kvp_status_; \
  } while (false)

// NOLINTBEGIN(bugprone-macro-parentheses): `lhs` is a declaration and cannot be parenthesised.
/// `KVP_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result or returns its error.
#define KVP_ASSIGN_OR_RETURN(lhs, expr) \
  KVP_ASSIGN_OR_RETURN_IMPL_(KVP_CONCAT_(kvp_r_, __LINE__), lhs, expr)
#define KVP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
