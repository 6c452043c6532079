// kvarn.codec: the KVarN codec on arrays, no daemon (codec_bindings.cc).
#ifndef KVARN_PYTHON_SRC_CODEC_BINDINGS_H_
#define KVARN_PYTHON_SRC_CODEC_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace kvarn::py {

void BindCodec(pybind11::module_& m);

}  // namespace kvarn::py

#endif  // KVARN_PYTHON_SRC_CODEC_BINDINGS_H_
