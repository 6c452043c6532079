// A protobuf message as a Python dict: every field by its proto name (unset scalars as their
// defaults, so a dict always has the same keys), nested messages as dicts, repeated fields as
// lists, enums by their value name ("BACKEND_HOST"), bytes as bytes. 64-bit integers stay
// Python ints (not strings, as protobuf's JSON mapping would make them).
#ifndef KVARN_PYTHON_SRC_PROTO_DICT_H_
#define KVARN_PYTHON_SRC_PROTO_DICT_H_

#include <google/protobuf/message.h>
#include <pybind11/pybind11.h>

namespace kvarn::py {

// REQUIRES: the calling thread holds the GIL.
pybind11::dict MessageToDict(const google::protobuf::Message& m);

}  // namespace kvarn::py

#endif  // KVARN_PYTHON_SRC_PROTO_DICT_H_
