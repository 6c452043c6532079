// kvarn._kvarn: the extension module under the kvarn package (python/kvarn/__init__.py
// re-exports it; its errors come from python/kvarn/errors.py).
#include <pybind11/pybind11.h>

#include "python/src/arrays.h"
#include "python/src/client_bindings.h"
#include "python/src/codec_bindings.h"
#include "python/src/gil.h"

PYBIND11_MODULE(_kvarn, m) {
  m.doc() = "Bindings over kvarn::Client and the KVarN codec; import the kvarn package instead.";
  m.attr("__version__") = KVARN_VERSION;
  kvarn::py::BindClient(m);
  pybind11::module_ codec =
      m.def_submodule("codec", "The KVarN codec on arrays (see kvarn.codec).");
  kvarn::py::BindCodec(codec);
  // Before the interpreter finalizes: daemon threads inside binding calls stop first (gil.h).
  kvarn::py::ArmExitDrain();
  m.def(
      "_as_kv_input",
      [](pybind11::handle a, bool allow_f16) {
        kvarn::py::FloatInput in = kvarn::py::AsFloat(a, "array", allow_f16);
        return pybind11::make_tuple(in.array, in.zero_copy);
      },
      pybind11::arg("array"), pybind11::arg("allow_f16") = true,
      "For tests: the array a K/V argument becomes, and whether it is the caller's memory "
      "(zero-copy).");
  m.def(
      "_as_token_ids",
      [](pybind11::handle a) {
        kvarn::py::TokenIds t = kvarn::py::AsTokenIds(a, "token_ids");
        return pybind11::make_tuple(t.array, t.zero_copy);
      },
      pybind11::arg("token_ids"),
      "For tests: the uint32 array token ids become, and whether it is zero-copy.");
}
