#include "python/src/status.h"

#include "common/codec_status.h"
#include "python/src/gil.h"

namespace kvarn::py {

namespace pyb = pybind11;

pyb::object ErrorObject(const absl::Status& s) {
  InPython in_python;  // kvarn.errors' Python code
  pyb::object from_status = pyb::module_::import("kvarn.errors").attr("_from_status");
  return from_status(static_cast<int>(s.code()), std::string(s.message()));
}

void ThrowStatus(const absl::Status& s) {
  pyb::object e = ErrorObject(s);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
  throw pyb::error_already_set();
}

void Check(const CodecStatus& s) {
  if (!s.ok()) ThrowStatus(FromCodec(s));
}

void ThrowValue(const std::string& message) { throw pyb::value_error(message); }

void ThrowType(const std::string& message) { throw pyb::type_error(message); }

void ThrowOverflow(const std::string& message) {
  PyErr_SetString(PyExc_OverflowError, message.c_str());
  throw pyb::error_already_set();
}

}  // namespace kvarn::py
