#include "python/src/gil.h"

#include <cxxabi.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace kvarn::py {
namespace {

// How long the exit waits for threads running Python inside binding calls: they hold no
// lock of ours and do no I/O of their own, so they finish in far less.
constexpr auto kExitDrain = std::chrono::seconds(5);

std::atomic<bool> exiting{false};
thread_local bool exit_thread = false;  // this thread ran DrainAtExit: it carries on
// Threads inside an InPython and not inside a Release in it: those that may run Python under
// C++ frames. Incremented before `exiting` is read, and `exiting` set before it is read
// (sequentially consistent), so DrainAtExit sees every thread that did not see it exiting.
std::atomic<int> in_python{0};
std::mutex mu;
std::condition_variable left;  // notified when in_python drops while exiting
thread_local int depth = 0;    // InPython nesting on this thread

// Whether this thread must stop before running Python again: another thread is exiting.
bool MustPark() { return exiting.load() && !exit_thread; }

[[noreturn]] void Park() {
  for (;;) pause();
}

void Leave() {
  if (in_python.fetch_sub(1) == 1 && exiting.load()) {
    std::lock_guard<std::mutex> lock(mu);
    left.notify_all();
  }
}

}  // namespace

Release::Release() : state_(PyEval_SaveThread()) {
  if (depth > 0) Leave();
}

Release::~Release() {
  if (depth > 0) in_python.fetch_add(1);  // back in the InPython it left
  if (MustPark()) {
    if (depth > 0) Leave();
    Park();
  }
  try {
    PyEval_RestoreThread(state_);
  } catch (abi::__forced_unwind&) {
    // Finalizing already (the exit began after the check): rethrowing would terminate (a
    // destructor is noexcept), returning would abort ("exception not rethrown").
    Park();
  }
}

InPython::InPython() {
  if (depth++ > 0) return;
  in_python.fetch_add(1);
  if (MustPark()) {
    Leave();
    PyEval_SaveThread();
    Park();
  }
}

InPython::~InPython() {
  if (--depth == 0) Leave();
}

void ArmExitDrain() {
  exiting.store(false);
  exit_thread = false;
  pybind11::module_::import("atexit").attr("register")(pybind11::cpp_function(&DrainAtExit));
}

void DrainAtExit() {
  exit_thread = true;
  exiting.store(true);
  PyThreadState* state = PyEval_SaveThread();
  {
    std::unique_lock<std::mutex> lock(mu);
    left.wait_for(lock, kExitDrain, [] { return in_python.load() == 0; });
  }
  PyEval_RestoreThread(state);
}

}  // namespace kvarn::py
