// kvarn.Client, kvarn.Session and their result types (client_bindings.cc).
#ifndef KVARN_PYTHON_SRC_CLIENT_BINDINGS_H_
#define KVARN_PYTHON_SRC_CLIENT_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace kvarn::py {

void BindClient(pybind11::module_& m);

}  // namespace kvarn::py

#endif  // KVARN_PYTHON_SRC_CLIENT_BINDINGS_H_
