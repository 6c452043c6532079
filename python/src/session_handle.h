// What the Session bindings share (client_bindings.cc, session_reads.cc): the Python-side
// handle of a kvarn::Session, the GIL-free call helper and argument checks.
//
// REQUIRES (all but the destructor's GIL-free part): the calling thread holds the GIL.
#ifndef KVARN_PYTHON_SRC_SESSION_HANDLE_H_
#define KVARN_PYTHON_SRC_SESSION_HANDLE_H_

#include <pybind11/pybind11.h>

#include <memory>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "python/src/arrays.h"
#include "python/src/gil.h"
#include "python/src/status.h"

namespace kvarn::py {

inline bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// The C++ Session of a kvarn.Session, shared: each call holds it for its duration (close()
// from another thread then leaves the closing to the call instead of unmapping the pool under
// it). The deleter keeps the Client alive (the C++ Session holds a raw Client*) and closes
// (CloseSession, the keep-alive join) without the GIL, whichever holder is last: the Python
// object, close(), or a call returning on another thread. While the interpreter shuts down
// nothing else runs Python, and the GIL stays.
inline std::shared_ptr<Session> ShareSession(std::unique_ptr<Session> s,
                                             std::shared_ptr<Client> client) {
  return std::shared_ptr<Session>(s.release(), [client = std::move(client)](Session* p) {
    if (Py_IsInitialized() && !Finalizing() && PyGILState_Check()) {
      Release nogil;
      delete p;
    } else {
      delete p;
    }
  });
}

// kvarn.Session's object.
class PySession {
 public:
  explicit PySession(std::shared_ptr<Session> s) : session_(std::move(s)) {}
  PySession(const PySession&) = delete;
  PySession& operator=(const PySession&) = delete;

  // The session for one call. kvarn.NotFoundError once closed: the daemon answers an ended
  // session so too.
  std::shared_ptr<Session> Get() const {
    if (session_ == nullptr) ThrowStatus(absl::NotFoundError("this session is closed"));
    return session_;
  }
  bool closed() const { return session_ == nullptr; }
  // The last holder closes the C++ Session: this call, or a call in flight on another thread
  // when it returns.
  void Close() { session_.reset(); }

 private:
  std::shared_ptr<Session> session_;
};

// Runs f() without the GIL and raises its error.
template <typename F>
auto Blocking(F f) {
  using R = decltype(f());
  R r = [&] {
    Release nogil;
    return f();
  }();
  if constexpr (std::is_same_v<R, absl::Status>) {
    Check(r);
  } else {
    return Value(std::move(r));
  }
}

inline uint64_t TileTokens(const Session& s) {
  return static_cast<uint64_t>(s.block_layout().tile_tokens);
}

// ValueError for a layer or kv-head outside the layout, before anything is called.
inline void CheckLayer(const Session& s, int layer) {
  if (layer < 0 || layer >= s.block_layout().num_layers) {
    ThrowValue(absl::StrCat("layer ", layer, " is out of range: the layout has ",
                            s.block_layout().num_layers, " layers"));
  }
}

inline void CheckHead(const Session& s, int head) {
  if (head < 0 || head >= s.block_layout().num_kv_heads) {
    ThrowValue(absl::StrCat("head ", head, " is out of range: the layout has ",
                            s.block_layout().num_kv_heads, " kv-heads"));
  }
}

}  // namespace kvarn::py

#endif  // KVARN_PYTHON_SRC_SESSION_HANDLE_H_
