// The GIL around binding calls, and daemon threads inside them when the interpreter exits.
//
// Once the interpreter is finalizing, a thread other than the finalizing one that takes the
// GIL (PyEval_RestoreThread, or its own eval loop between two bytecodes) is ended with
// pthread_exit. Its forced unwind runs the destructors of the C++ frames it leaves (Py_DECREF
// without the GIL) and terminates the process at the first noexcept frame: a daemon thread
// inside a binding call when the program ended crashed it. So:
// * Release, around blocking C++ calls, parks its thread for good instead of taking the GIL back
//   once the program is exiting (Python 3.14 parks such threads itself);
// * InPython marks the parts of binding calls that run Python code under C++ frames (numpy or
//   torch conversions, a caller's __index__, __array__ or iterator, building a kvarn.Error).
//   An atexit handler (DrainAtExit), which runs before the interpreter starts finalizing,
//   waits until no thread is in one and parks the threads that enter one afterwards.
// A parked thread never runs Python again nor drops the references its frames hold; the
// process exits around it.
//
// REQUIRES: both are constructed on a thread that holds the GIL.
#ifndef KVARN_PYTHON_SRC_GIL_H_
#define KVARN_PYTHON_SRC_GIL_H_

#include <Python.h>

namespace kvarn::py {

class Release {
 public:
  Release();
  ~Release();
  Release(const Release&) = delete;
  Release& operator=(const Release&) = delete;

 private:
  PyThreadState* state_;
};

class InPython {
 public:
  InPython();
  ~InPython();
  InPython(const InPython&) = delete;
  InPython& operator=(const InPython&) = delete;
};

// Called when the module is imported: registers DrainAtExit with atexit, and clears what a
// previous interpreter's exit left (an embedding program may finalize and initialize again;
// this library's state outlives the interpreter).
void ArmExitDrain();

// The atexit handler. Waits (without the GIL) until no thread is inside an InPython, at most a
// few seconds (a caller's __index__ that blocks forever must not hang the exit).
void DrainAtExit();

}  // namespace kvarn::py

#endif  // KVARN_PYTHON_SRC_GIL_H_
