// Errors of the codec. The kernels depend on nothing beyond the C++ standard library and
// the CUDA runtime, so they carry their own small status type; its codes are a subset of
// absl::StatusCode with the same numbers, so the daemon converts it one-to-one.
#ifndef KVARN_KERNELS_STATUS_H_
#define KVARN_KERNELS_STATUS_H_

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace kvarn {

enum class CodecCode : int {
  kOk = 0,
  kInvalidArgument = 3,      // bad shape, NaN/Inf, unknown preset, wrong record size
  kFailedPrecondition = 9,   // e.g. no device where one is required
  kInternal = 13,            // a CUDA runtime error
  kUnavailable = 14,         // device busy or lost
};

class [[nodiscard]] CodecStatus {
 public:
  CodecStatus() = default;
  CodecStatus(CodecCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static CodecStatus Ok() { return CodecStatus(); }
  bool ok() const { return code_ == CodecCode::kOk; }
  CodecCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  CodecCode code_ = CodecCode::kOk;
  std::string message_;
};

inline CodecStatus InvalidArgument(std::string message) {
  return CodecStatus(CodecCode::kInvalidArgument, std::move(message));
}

// A value or the reason there is none (the kernels' StatusOr: they carry no Abseil).
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}  // NOLINT: implicit like StatusOr
  // REQUIRES: !status.ok().
  Expected(CodecStatus status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT
  bool ok() const { return value_.has_value(); }
  const CodecStatus& status() const { return status_; }
  // REQUIRES: ok().
  T& value() & {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const {
    assert(ok());
    return &*value_;
  }

 private:
  CodecStatus status_;
  std::optional<T> value_;
};

}  // namespace kvarn

#define KVARN_RETURN_IF_ERROR(expr)            \
  do {                                         \
    ::kvarn::CodecStatus kvarn_status_ = (expr); \
    if (!kvarn_status_.ok()) return kvarn_status_; \
  } while (0)

#endif  // KVARN_KERNELS_STATUS_H_
