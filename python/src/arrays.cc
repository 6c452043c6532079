#include "python/src/arrays.h"

#include <limits>

#include "python/src/gil.h"
#include "python/src/status.h"

namespace kvarn::py {
namespace {

pyb::module_ Numpy() { return pyb::module_::import("numpy"); }

// The torch module when the program imported it (kvarn never imports torch itself).
pyb::object TorchIfLoaded() {
  pyb::dict modules = pyb::module_::import("sys").attr("modules");
  if (!modules.contains("torch")) return pyb::none();
  return modules["torch"];
}

std::string DtypeName(const pyb::array& a) { return pyb::str(a.dtype()).cast<std::string>(); }

// AsNumpy, also saying whether the result is a new array rather than the caller's memory.
pyb::array ToNumpy(pyb::handle obj, const std::string& what, bool* from_torch, bool* converted) {
  *from_torch = false;
  *converted = false;
  if (pyb::isinstance<pyb::array>(obj)) return pyb::reinterpret_borrow<pyb::array>(obj);
  pyb::object torch = TorchIfLoaded();
  if (!torch.is_none() && pyb::isinstance(obj, torch.attr("Tensor"))) {
    pyb::object t = pyb::reinterpret_borrow<pyb::object>(obj);
    const std::string device = pyb::str(t.attr("device").attr("type"));
    if (device != "cpu") {
      ThrowType(what + " is a torch tensor on " + std::string(pyb::str(t.attr("device"))) +
                "; kvarn takes CPU tensors (call .cpu())");
    }
    *from_torch = true;
    t = t.attr("detach")();
    if (t.attr("dtype").equal(torch.attr("bfloat16"))) {
      t = t.attr("float")();  // numpy has no bfloat16
      *converted = true;
    }
    // Lazily conjugated or negated views cannot be exported as they are.
    if (pyb::hasattr(t, "resolve_conj")) t = t.attr("resolve_conj")().attr("resolve_neg")();
    return t.attr("numpy")();
  }
  *converted = true;
  return Numpy().attr("asarray")(obj);
}

}  // namespace

pyb::array AsNumpy(pyb::handle obj, const std::string& what, bool* from_torch) {
  InPython in_python;
  bool torch = false, converted = false;
  pyb::array a = ToNumpy(obj, what, &torch, &converted);
  if (from_torch != nullptr) *from_torch = torch;
  return a;
}

bool CContiguous(const pyb::array& a) {
  return (a.flags() & pyb::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) != 0;
}

namespace {

// The addresses of a's lowest and highest byte ([lo, hi)); lo == hi for an empty array.
std::pair<uintptr_t, uintptr_t> Span(const pyb::array& a) {
  const auto base = reinterpret_cast<uintptr_t>(a.data());
  if (a.size() == 0) return {base, base};
  intptr_t lo = 0, hi = 0;
  for (pyb::ssize_t i = 0; i < a.ndim(); ++i) {
    const intptr_t reach = static_cast<intptr_t>(a.strides(i)) * (a.shape(i) - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  return {base + lo, base + hi + a.itemsize()};
}

}  // namespace

bool MemoryOverlaps(const pyb::array& a, const pyb::array& b) {
  const auto [alo, ahi] = Span(a);
  const auto [blo, bhi] = Span(b);
  return alo < bhi && blo < ahi;
}

std::string ShapeString(const std::vector<pyb::ssize_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string ShapeString(const pyb::array& a) {
  return ShapeString(std::vector<pyb::ssize_t>(a.shape(), a.shape() + a.ndim()));
}

bool HasShape(const pyb::array& a, const std::vector<pyb::ssize_t>& shape) {
  if (a.ndim() != static_cast<pyb::ssize_t>(shape.size())) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (a.shape(static_cast<pyb::ssize_t>(i)) != shape[i]) return false;
  }
  return true;
}

FloatInput AsFloat(pyb::handle obj, const std::string& what, bool allow_f16,
                   const ShapeCheck& check) {
  InPython in_python;
  FloatInput in;
  bool converted = false;
  in.array = ToNumpy(obj, what, &in.from_torch, &converted);
  const pyb::dtype dt = in.array.dtype();
  if (dt.kind() != 'f') {
    ThrowType(what + " has dtype " + DtypeName(in.array) + "; expected a float array (float32" +
              (allow_f16 ? " or float16)" : ")"));
  }
  if (check) check(in.array);
  const bool native = dt.attr("isnative").cast<bool>();
  const bool plain = native && CContiguous(in.array);
  if (plain && dt.itemsize() == 4) {
    in.dtype = DType::kF32;
    in.zero_copy = !converted;
    return in;
  }
  if (plain && dt.itemsize() == 2 && allow_f16) {
    in.dtype = DType::kF16;
    in.zero_copy = !converted;
    return in;
  }
  // float16 stays float16 where fp16 is taken (exact); everything else becomes float32.
  const bool half = dt.itemsize() == 2 && allow_f16;
  in.array = Numpy().attr("ascontiguousarray")(in.array, half ? "float16" : "float32");
  in.dtype = half ? DType::kF16 : DType::kF32;
  in.zero_copy = false;
  return in;
}

void MatchDtypes(FloatInput* keys, FloatInput* values, const std::string& what_keys,
                 const std::string& what_values) {
  if (keys->dtype == values->dtype) return;
  if (keys->dtype == DType::kF16) *keys = AsFloat(keys->array, what_keys, /*allow_f16=*/false);
  if (values->dtype == DType::kF16)
    *values = AsFloat(values->array, what_values, /*allow_f16=*/false);
}

TokenIds AsTokenIds(pyb::handle obj, const std::string& what) {
  InPython in_python;
  TokenIds t;
  bool torch = false, converted = false;
  pyb::array a = ToNumpy(obj, what, &torch, &converted);
  if (a.ndim() != 1) {
    ThrowValue(what + " has shape " + ShapeString(a) + "; token ids are a 1-D sequence");
  }
  if (a.size() > std::numeric_limits<int32_t>::max()) {  // before any scan or copy of them
    ThrowValue(what + " holds " + std::to_string(a.size()) +
               " token ids; at most 2^31 - 1 in one call");
  }
  const char kind = a.dtype().kind();
  if (a.size() == 0) {  // numpy.asarray([]) is float64
    t.array = pyb::array_t<uint32_t>(0);
    return t;
  }
  if (kind != 'i' && kind != 'u') {
    ThrowType(what + " has dtype " + DtypeName(a) + "; token ids are integers in [0, 2^32)");
  }
  constexpr uint64_t kMax = std::numeric_limits<uint32_t>::max();
  if (kind == 'u') {
    const auto mx = a.attr("max")().cast<unsigned long long>();
    if (mx > kMax)
      ThrowValue(what + " holds " + std::to_string(mx) + "; token ids are in [0, 2^32)");
  } else {
    const auto mn = a.attr("min")().cast<long long>();
    const auto mx = a.attr("max")().cast<long long>();
    if (mn < 0) ThrowValue(what + " holds " + std::to_string(mn) + "; token ids are in [0, 2^32)");
    if (static_cast<unsigned long long>(mx) > kMax) {
      ThrowValue(what + " holds " + std::to_string(mx) + "; token ids are in [0, 2^32)");
    }
  }
  const pyb::dtype dt = a.dtype();
  if (kind == 'u' && dt.itemsize() == 4 && dt.attr("isnative").cast<bool>() && CContiguous(a)) {
    t.array = a;
    t.zero_copy = !converted;
    return t;
  }
  t.array = Numpy().attr("ascontiguousarray")(a, "uint32");
  return t;
}

pyb::array_t<float> NewF32(const std::vector<pyb::ssize_t>& shape) {
  return pyb::array_t<float, pyb::array::c_style>(shape);
}

pyb::object AsOutput(pyb::array a, bool torch) {
  if (!torch) return a;
  return pyb::module_::import("torch").attr("from_numpy")(a);
}

}  // namespace kvarn::py
