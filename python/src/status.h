// Errors crossing into Python. A non-OK absl::Status (the client's, or the codec's through
// FromCodec) becomes an instance of the kvarn.errors class for its code (kvarn.NotFoundError
// for NOT_FOUND, ...), each a kvarn.Error with .code ("NOT_FOUND"), .code_value (5) and
// .message. Bad input found by the bindings before anything is sent is a plain ValueError or
// TypeError (ThrowValue, ThrowType; OverflowError for an int beyond a C++ type, ThrowOverflow),
// never a kvarn.Error.
//
// REQUIRES (every function here): the calling thread holds the GIL.
#ifndef KVARN_PYTHON_SRC_STATUS_H_
#define KVARN_PYTHON_SRC_STATUS_H_

#include <pybind11/pybind11.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/status.h"

namespace kvarn::py {

// Raises the kvarn.Error subclass for s.code(). REQUIRES: !s.ok().
[[noreturn]] void ThrowStatus(const absl::Status& s);

inline void Check(const absl::Status& s) {
  if (!s.ok()) ThrowStatus(s);
}
void Check(const CodecStatus& s);

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) ThrowStatus(v.status());
  return *std::move(v);
}

// The kvarn.Error instance for a status, not raised (CommitBatch's per-item results).
pybind11::object ErrorObject(const absl::Status& s);

[[noreturn]] void ThrowValue(const std::string& message);
[[noreturn]] void ThrowType(const std::string& message);
[[noreturn]] void ThrowOverflow(const std::string& message);

}  // namespace kvarn::py

#endif  // KVARN_PYTHON_SRC_STATUS_H_
