// Arrays in and out of the bindings: numpy arrays and torch CPU tensors in, numpy arrays
// (or torch tensors, when the input was one) out.
//
// Zero-copy rule: an input that is already C-contiguous, in native byte order and of a dtype
// the C++ call takes (float32; float16 where the call takes fp16 bits; uint32 token ids) is
// passed to C++ by pointer, no copy. Anything else that converts losslessly enough (another
// float dtype, a strided view, a list, a bfloat16 tensor) is converted first (one copy); what
// cannot (integer K/V, float token ids, a tensor on a GPU) is a TypeError.
//
// REQUIRES (every function here): the calling thread holds the GIL. The pointers stay valid
// while the returned object is alive; the caller keeps it across the GIL-free C++ call.
#ifndef KVARN_PYTHON_SRC_ARRAYS_H_
#define KVARN_PYTHON_SRC_ARRAYS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/codec.h"
#include "python/src/gil.h"

namespace kvarn::py {

namespace pyb = pybind11;

// obj as a numpy array: a numpy array as it is; a torch tensor through .detach().numpy()
// (zero-copy; bfloat16 is widened to float32 first, numpy has no bfloat16); anything else
// through numpy.asarray. *from_torch (optional) says whether obj was a torch tensor.
// TypeError for a tensor that is not on the CPU.
pyb::array AsNumpy(pyb::handle obj, const std::string& what, bool* from_torch = nullptr);

struct FloatInput {
  pyb::array array;  // C-contiguous, native order, float32 or float16
  DType dtype = DType::kF32;
  bool zero_copy = false;  // array is the caller's memory
  bool from_torch = false;
  const void* data() const { return array.data(); }
};

// Throws (ValueError) when an array's shape is not what a call takes.
using ShapeCheck = std::function<void(const pyb::array&)>;

// Float K/V or queries. allow_f16: float16 stays float16 (calls that take fp16 bits);
// otherwise every float dtype becomes float32. TypeError for non-float dtypes. `check`, when
// given, sees the array before any conversion: a wrong shape is refused before a copy is made
// (a broadcast view of a terabyte is refused, not copied).
FloatInput AsFloat(pyb::handle obj, const std::string& what, bool allow_f16,
                   const ShapeCheck& check = nullptr);

// Converts both to float32 unless their dtypes already agree (the C++ calls take one dtype
// for keys and values).
void MatchDtypes(FloatInput* keys, FloatInput* values, const std::string& what_keys,
                 const std::string& what_values);

// "(3, 2, 2, 64)".
std::string ShapeString(const pyb::array& a);
std::string ShapeString(const std::vector<pyb::ssize_t>& shape);
bool HasShape(const pyb::array& a, const std::vector<pyb::ssize_t>& shape);
bool CContiguous(const pyb::array& a);
// Whether the bytes the two arrays span (from their lowest to their highest element) overlap.
bool MemoryOverlaps(const pyb::array& a, const pyb::array& b);

struct TokenIds {
  pyb::array array;  // C-contiguous uint32, 1-D
  bool zero_copy = false;
  std::span<const uint32_t> ids() const {
    return {static_cast<const uint32_t*>(array.data()), static_cast<size_t>(array.size())};
  }
};
// Token ids: a sequence of ints, a 1-D integer numpy array or torch tensor, each id in
// [0, 2^32). ValueError out of range or not 1-D, TypeError for non-integers.
TokenIds AsTokenIds(pyb::handle obj, const std::string& what);

// An int parameter's argument: an int or an object with __index__ (a numpy integer), never
// one converted through __int__ (a numpy float, a Fraction), which would truncate 2.5 to 2.
// Anything else is pybind11's TypeError.
inline pyb::arg IntArg(const char* name) { return pyb::arg(name).noconvert(); }

// Whether h is a bool or a numpy bool (numpy 1.x still lets a bool scalar be an index, with a
// DeprecationWarning). numpy's bool type is known by its name (numpy.bool_, numpy.bool in
// numpy 2), which cannot be subclassed: no import of numpy on every integer argument.
inline bool IsBool(pyb::handle h) {
  if (PyBool_Check(h.ptr())) return true;
  const std::string_view type = Py_TYPE(h.ptr())->tp_name;
  return type == "numpy.bool_" || type == "numpy.bool";
}

// The C++ type of an IntArg parameter: what IntArg takes, but never a bool. True is not
// sequence 1, layer 1 or one iteration; a bool is a TypeError as any other non-integer is.
template <typename T>
struct Int {
  T value = 0;
  operator T() const { return value; }  // NOLINT(google-explicit-constructor)
};
using SequenceId = Int<uint64_t>;
using BlockId = Int<uint32_t>;

// An optional Int's value as a plain optional.
template <typename T>
std::optional<T> Plain(const std::optional<Int<T>>& o) {
  if (!o) return std::nullopt;
  return o->value;
}

// A new C-contiguous float32 array.
pyb::array_t<float> NewF32(const std::vector<pyb::ssize_t>& shape);

// a as a torch tensor (torch.from_numpy, sharing memory) when torch is set, else a.
pyb::object AsOutput(pyb::array a, bool torch);

}  // namespace kvarn::py

namespace pybind11::detail {

template <typename T>
struct type_caster<kvarn::py::Int<T>> {
  PYBIND11_TYPE_CASTER(kvarn::py::Int<T>, const_name("int"));
  bool load(handle src, bool /*convert*/) {
    kvarn::py::InPython in_python;  // src's __index__ (gil.h)
    if (kvarn::py::IsBool(src)) return false;
    make_caster<T> v;
    if (!v.load(src, /*convert=*/false)) return false;
    value.value = cast_op<T>(v);
    return true;
  }
};

}  // namespace pybind11::detail

#endif  // KVARN_PYTHON_SRC_ARRAYS_H_
