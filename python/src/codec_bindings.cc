// kvarn.codec over kernels/codec.h (Codec::Default(), as the daemon and kvarnctl use) and
// kvarnctl's codec library (record-size inference, `codec eval`), so a record or a figure
// from Python is the very one `kvarnctl codec` gives for the same input.
#include "python/src/codec_bindings.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvarnctl/codec_eval.h"
#include "client/kvarnctl/codec_io.h"
#include "client/kvarnctl/codec_tile.h"
#include "kernels/codec.h"
#include "kernels/preset.h"
#include "python/src/arrays.h"
#include "python/src/gil.h"
#include "python/src/status.h"

namespace kvarn::py {
namespace {

using pyb::ssize_t;

constexpr float kFp16Max = 65504.0f;

Preset Parsed(const std::string& name) {
  Preset p;
  Check(ParsePreset(name, &p));
  return p;
}

// A preset name given as a str; ValueError for one UTF-8 cannot carry (a lone surrogate).
std::string PresetName(pyb::handle name) {
  Py_ssize_t n = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(name.ptr(), &n);
  if (utf8 == nullptr) {
    PyErr_Clear();
    ThrowValue("preset name " + std::string(pyb::repr(name)) + " is not valid UTF-8 text");
  }
  return std::string(utf8, static_cast<size_t>(n));
}

void CheckHeadDimArg(ssize_t d, const std::string& what) {
  if (d > 4096 || !CheckHeadDim(static_cast<int>(d)).ok()) {
    ThrowValue(absl::StrCat(what, ": head_dim ", d, " is not supported: use 64, 128, 256 or 512"));
  }
}

std::string IndexString(const pyb::array& a, size_t flat) {
  std::vector<size_t> idx(static_cast<size_t>(a.ndim()));
  for (size_t i = idx.size(); i-- > 0;) {
    const size_t n = static_cast<size_t>(a.shape(static_cast<ssize_t>(i)));
    idx[i] = flat % n;
    flat /= n;
  }
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) absl::StrAppend(&s, i ? ", " : "", idx[i]);
  return s + "]";
}

// What kvarnctl checks when it loads a .npy: finite, within what fp16 stores.
void CheckFinite(const pyb::array& a, const std::string& what) {
  const auto* x = static_cast<const float*>(a.data());
  for (size_t i = 0; i < static_cast<size_t>(a.size()); ++i) {
    if (std::isnan(x[i]) || std::isinf(x[i])) {
      ThrowValue(absl::StrCat(what, ": element ", IndexString(a, i), " is ",
                              std::isnan(x[i]) ? "NaN" : "Inf", "; inputs must be finite"));
    }
    if (std::fabs(x[i]) > kFp16Max) {
      ThrowValue(absl::StrCat(what, ": element ", IndexString(a, i), " = ", x[i],
                              " is beyond the fp16 range (|x| <= 65504) that the cache stores"));
    }
  }
}

// K or V of a sequence for codec eval: [T, D] or [H, T, D].
ctl::KvTensor AsSequence(pyb::handle obj, const std::string& what) {
  const FloatInput in = AsFloat(obj, what, /*allow_f16=*/false, [&](const pyb::array& a) {
    if (a.ndim() != 2 && a.ndim() != 3) {
      ThrowValue(absl::StrCat(
          what, " has shape ", ShapeString(a), "; expected (T, D) or (H, T, D)",
          a.ndim() == 4 ? " (for a PyTorch (B, H, T, D) cache, pass one batch entry: k[b])" : ""));
    }
    const ssize_t heads = a.ndim() == 3 ? a.shape(0) : 1, tokens = a.shape(a.ndim() - 2);
    if (heads < 1 || tokens < 1)
      ThrowValue(absl::StrCat(what, " has shape ", ShapeString(a), ": no tokens"));
    if (heads > 4096 || tokens > std::numeric_limits<int>::max())
      ThrowValue(absl::StrCat(what, " has shape ", ShapeString(a), ": too many"));
    CheckHeadDimArg(a.shape(a.ndim() - 1), absl::StrCat(what, " has shape ", ShapeString(a)));
  });
  const pyb::array& a = in.array;
  CheckFinite(a, what);
  ctl::KvTensor t;
  t.heads = a.ndim() == 3 ? static_cast<int>(a.shape(0)) : 1;
  t.tokens = static_cast<int>(a.shape(a.ndim() - 2));
  t.head_dim = static_cast<int>(a.shape(a.ndim() - 1));
  t.rank2 = a.ndim() == 2;
  t.path = what;
  const auto* x = static_cast<const float*>(a.data());
  t.data.assign(x, x + a.size());
  return t;
}

// Decode queries as kvarnctl's LoadQueries takes them: (Nq, D), the same for every kv-head,
// or (Hq, Nq, D) with Hq a multiple of the kv-heads.
ctl::QuerySet AsQueries(pyb::handle obj, const ctl::KvTensor& keys) {
  const std::string expected = absl::StrCat("expected (Nq, ", keys.head_dim, ") or (H*g, Nq, ",
                                            keys.head_dim, ") with H = ", keys.heads, " kv-heads");
  const FloatInput in = AsFloat(obj, "queries", /*allow_f16=*/false, [&](const pyb::array& a) {
    if (a.ndim() != 2 && a.ndim() != 3)
      ThrowValue(absl::StrCat("queries has shape ", ShapeString(a), "; ", expected));
    if (a.shape(a.ndim() - 1) != keys.head_dim) {
      ThrowValue(absl::StrCat("queries has shape ", ShapeString(a), ": head_dim ",
                              a.shape(a.ndim() - 1), " does not match the keys' ", keys.head_dim));
    }
    const ssize_t qheads = a.ndim() == 3 ? a.shape(0) : 0, per_head = a.shape(a.ndim() - 2);
    if (per_head < 1 || (a.ndim() == 3 && (qheads < 1 || qheads % keys.heads != 0))) {
      ThrowValue(absl::StrCat("queries has shape ", ShapeString(a), "; ", expected));
    }
    if (per_head > 4096 || qheads > 4096)
      ThrowValue(absl::StrCat("queries has shape ", ShapeString(a), ": too many"));
  });
  const pyb::array& a = in.array;
  const ssize_t qheads = a.ndim() == 3 ? a.shape(0) : 0, per_head = a.shape(a.ndim() - 2);
  CheckFinite(a, "queries");
  const auto* x = static_cast<const float*>(a.data());
  ctl::QuerySet q;
  q.head_dim = keys.head_dim;
  q.per_head = static_cast<int>(per_head);
  q.from_file = true;  // "file" in the report: given by the caller, not random
  if (a.ndim() == 2) {
    q.query_heads = keys.heads;
    for (int h = 0; h < keys.heads; ++h) q.data.insert(q.data.end(), x, x + a.size());
    q.source = absl::StrCat(per_head, " per head from the caller (the same for every head)");
  } else {
    q.query_heads = static_cast<int>(qheads);
    q.data.assign(x, x + a.size());
    q.source = absl::StrCat(per_head, " per query head from the caller");
  }
  return q;
}

pyb::array Encode(const std::string& preset_name, pyb::object keys, pyb::object values,
                  Int<int> iterations_arg) {
  InPython in_python;
  const int iterations = iterations_arg;
  const Preset p = Parsed(preset_name);
  if (iterations < 0 || iterations > EncodeOptions::kMaxIterations) {
    ThrowValue(absl::StrCat("iterations ", iterations, " is not in [0, ",
                            EncodeOptions::kMaxIterations, "]"));
  }
  // Both shapes are checked before either array is converted (AsFloat): the keys', then the
  // values' against them.
  std::vector<ssize_t> shape;
  FloatInput k = AsFloat(keys, "keys", /*allow_f16=*/true, [&](const pyb::array& ka) {
    const ssize_t nd = ka.ndim();
    if (nd < 2 || ka.shape(nd - 2) != p.tile_tokens) {
      ThrowValue(absl::StrCat("keys has shape ", ShapeString(ka), "; ", p.Name(),
                              " encodes tiles of shape (..., ", p.tile_tokens,
                              ", D): G = ", p.tile_tokens, " tokens, token-major"));
    }
    CheckHeadDimArg(ka.shape(nd - 1), absl::StrCat("keys has shape ", ShapeString(ka)));
    shape.assign(ka.shape(), ka.shape() + nd);
  });
  FloatInput v = AsFloat(values, "values", /*allow_f16=*/true, [&](const pyb::array& va) {
    if (!HasShape(va, shape)) {
      ThrowValue(absl::StrCat("keys has shape ", ShapeString(shape), " but values has shape ",
                              ShapeString(va), "; keys and values must have the same shape"));
    }
  });
  MatchDtypes(&k, &v, "keys", "values");
  const pyb::array& ka = k.array;
  const ssize_t d = shape.back();
  const size_t record = p.RecordBytes(static_cast<int>(d));
  std::vector<ssize_t> out_shape(shape.begin(), shape.end() - 2);
  out_shape.push_back(static_cast<ssize_t>(record));
  pyb::array_t<uint8_t> out(out_shape);
  const size_t tiles = static_cast<size_t>(ka.size()) /
                       (static_cast<size_t>(p.tile_tokens) * static_cast<size_t>(d));
  const size_t tile_bytes = static_cast<size_t>(ka.nbytes()) / std::max<size_t>(tiles, 1);
  const auto* kp = static_cast<const uint8_t*>(k.data());
  const auto* vp = static_cast<const uint8_t*>(v.data());
  uint8_t* op = out.mutable_data();
  EncodeOptions options;
  options.iterations = iterations;
  CodecStatus st;
  size_t failed = 0;
  {
    Release nogil;
    for (size_t i = 0; i < tiles && st.ok(); ++i) {
      st = Codec::Default().EncodeTile(
          p, static_cast<int>(d),
          TileIn{kp + i * tile_bytes, vp + i * tile_bytes, k.dtype, Frame::kOriginal},
          {op + i * record, record}, options);
      failed = i;
    }
  }
  if (!st.ok() && tiles > 1)
    st = CodecStatus(st.code(), absl::StrCat("tile ", failed, ": ", st.message()));
  Check(st);
  return out;
}

pyb::tuple Decode(const std::string& preset_name, pyb::object records,
                  std::optional<Int<int>> head_dim_arg, const std::string& frame) {
  InPython in_python;
  const Preset p = Parsed(preset_name);
  if (frame != "original" && frame != "storage")
    ThrowValue("frame '" + frame + "' is not 'original' or 'storage'");
  pyb::module_ np = pyb::module_::import("numpy");
  pyb::array a;
  if (pyb::isinstance<pyb::bytes>(records) || pyb::isinstance<pyb::bytearray>(records)) {
    a = np.attr("frombuffer")(records, "uint8");
  } else if (pyb::isinstance<pyb::memoryview>(records)) {
    a = np.attr("asarray")(records);  // keeps a shaped (or strided) view's shape
  } else {
    a = AsNumpy(records, "records");
  }
  if (!a.dtype().equal(pyb::dtype::of<uint8_t>())) {
    ThrowType(absl::StrCat("records has dtype ", std::string(pyb::str(a.dtype())),
                           "; records are uint8 bytes"));
  }
  if (a.ndim() < 1) ThrowValue("records is a scalar; a record is a 1-D array of bytes");
  const size_t bytes = static_cast<size_t>(a.shape(a.ndim() - 1));
  int d = 0;
  if (head_dim_arg) {
    CheckHeadDimArg(head_dim_arg->value, "head_dim");
    d = head_dim_arg->value;
    if (bytes != p.RecordBytes(d)) {
      ThrowValue(absl::StrCat("records are ", bytes, " bytes; a ", p.Name(),
                              " record with head_dim ", d, " is ", p.RecordBytes(d), " bytes"));
    }
  } else {
    Check(ctl::InferHeadDim(p, bytes, &d));
  }
  a = np.attr("ascontiguousarray")(a);  // after the size checks: no copy of what is refused
  std::vector<ssize_t> shape(a.shape(), a.shape() + a.ndim() - 1);
  shape.push_back(p.tile_tokens);
  shape.push_back(d);
  pyb::array_t<float> keys = NewF32(shape), values = NewF32(shape);
  const size_t tiles = bytes == 0 ? 0 : static_cast<size_t>(a.size()) / bytes;
  const size_t tile = static_cast<size_t>(p.tile_tokens) * static_cast<size_t>(d);
  const auto* rp = static_cast<const uint8_t*>(a.data());
  float* kp = keys.mutable_data();
  float* vp = values.mutable_data();
  const Frame f = frame == "original" ? Frame::kOriginal : Frame::kStorage;
  CodecStatus st;
  {
    Release nogil;
    for (size_t i = 0; i < tiles && st.ok(); ++i) {
      st = Codec::Default().DecodeTile(p, d, {rp + i * bytes, bytes},
                                       TileOut{kp + i * tile, vp + i * tile, DType::kF32, f});
    }
  }
  Check(st);
  return pyb::make_tuple(keys, values);
}

pyb::object Eval(pyb::object presets, pyb::object keys, pyb::object values, pyb::object queries,
                 pyb::object sink_tokens, Int<int> iterations_arg, Int<int> random_queries_arg,
                 Int<uint64_t> seed_arg) {
  InPython in_python;
  const int iterations = iterations_arg, random_queries = random_queries_arg;
  const uint64_t seed = seed_arg;
  const bool single = pyb::isinstance<pyb::str>(presets);
  std::vector<Preset> list;
  if (single) {
    list.push_back(Parsed(PresetName(presets)));
  } else {
    for (pyb::handle h : presets) {
      if (!pyb::isinstance<pyb::str>(h)) ThrowType("presets is a preset name or a list of them");
      list.push_back(Parsed(PresetName(h)));
    }
    if (list.empty()) ThrowValue("presets is empty");
  }
  if (iterations < 0 || iterations > EncodeOptions::kMaxIterations) {
    ThrowValue(absl::StrCat("iterations ", iterations, " is not in [0, ",
                            EncodeOptions::kMaxIterations, "]"));
  }
  if (random_queries < 1 || random_queries > 4096) ThrowValue("random_queries is in [1, 4096]");
  ctl::EvalOptions options;
  options.iterations = iterations;
  Check(ctl::ParseSinkPolicy(pyb::str(sink_tokens), list, &options.sink));
  const ctl::KvTensor k = AsSequence(keys, "keys");
  const ctl::KvTensor v = AsSequence(values, "values");
  Check(ctl::CheckSameShape(k, v));
  const ctl::QuerySet q =
      queries.is_none() ? ctl::RandomQueries(k, random_queries, seed) : AsQueries(queries, k);
  std::vector<std::string> lines;
  CodecStatus st;
  {
    Release nogil;
    const std::vector<double> reference = ctl::ExactAttention(k, v, q);
    for (const Preset& p : list) {
      ctl::PresetResult r;
      st = ctl::EvaluatePreset(p, k, v, q, reference, options, nullptr, &r);
      if (!st.ok()) break;
      lines.push_back(ctl::FormatJsonLine(r, q, seed, iterations));
    }
  }
  Check(st);
  pyb::object loads = pyb::module_::import("json").attr("loads");
  pyb::list out;
  for (const std::string& line : lines) out.append(loads(line));
  if (single) return out[0];
  return out;
}

pyb::dict PresetInfo(const std::string& name, Int<int> head_dim_arg) {
  const int head_dim = head_dim_arg;
  const Preset p = Parsed(name);
  CheckHeadDimArg(head_dim, "head_dim");
  pyb::dict d;
  d["name"] = p.Name();
  d["method"] = MethodName(p.method);
  d["key_bits"] = p.key_bits;
  d["value_bits"] = p.value_bits;
  d["tile_tokens"] = p.tile_tokens;
  d["rotates"] = p.rotates();
  d["balances"] = p.balances();
  d["head_dim"] = head_dim;
  d["record_bytes"] = p.RecordBytes(head_dim);
  d["bits_per_element"] = p.BitsPerElement(head_dim);
  d["compression_ratio"] = 16.0 / p.BitsPerElement(head_dim);
  return d;
}

}  // namespace

void BindCodec(pyb::module_& m) {
  m.def("presets", &AllPresetNames, "Every valid preset name.");
  m.def("preset_info", &PresetInfo, pyb::arg("preset"), IntArg("head_dim") = 128,
        "A preset's parameters for a head_dim (dict): name, method, key_bits, value_bits, "
        "tile_tokens, rotates, "
        "balances, head_dim, record_bytes (one tile of one head), bits_per_element (scales "
        "included), "
        "compression_ratio (vs fp16).");
  m.def(
      "implementation",
      [] {
        const Codec& c = Codec::Default();
        return pyb::make_tuple(std::string(c.name()), std::string(c.target()));
      },
      "The codec in use: (name, instruction set), e.g. ('simd', 'AVX2').");
  m.def("encode", &Encode, pyb::arg("preset"), pyb::arg("keys"), pyb::arg("values"), pyb::kw_only(),
        IntArg("iterations") = kDefaultIterations,
        R"doc(Quantizes tiles into records (``Codec::EncodeTile``, what ``kvarnctl codec encode``
does). ``keys`` and ``values``: float arrays of shape (..., G, D), G the preset's tile tokens,
D in 64, 128, 256, 512, original frame (as the attention layer made them). Returns uint8
records of shape (..., record_bytes); ``encode(p, k, v).tobytes()`` for one tile is the
record file kvarnctl writes. ``iterations``: balancing iterations (0..64).
kvarn.InvalidArgumentError for NaN/Inf or values fp16 scales cannot represent.)doc");
  m.def("decode", &Decode, pyb::arg("preset"), pyb::arg("records"), pyb::kw_only(),
        IntArg("head_dim") = pyb::none(), pyb::arg("frame") = "original",
        R"doc(Dequantizes records (``Codec::DecodeTile``, what ``kvarnctl codec decode`` does):
``records`` is bytes or a uint8 array (..., record_bytes). Returns ``(keys, values)`` float32
(..., G, D), in the original frame (``frame="storage"``: the preset's rotated storage frame).
``head_dim`` defaults to the one the record size implies.)doc");
  m.def(
      "eval", &Eval, pyb::arg("presets"), pyb::arg("keys"), pyb::arg("values"), pyb::kw_only(),
      pyb::arg("queries") = pyb::none(), pyb::arg("sink_tokens") = "G",
      IntArg("iterations") = kDefaultIterations, IntArg("random_queries") = 16, IntArg("seed") = 1,
      R"doc(How well presets keep this K/V (``kvarnctl codec eval``, the same code): keys and values
of one layer, (T, D) or (H, T, D), run through the daemon's sequence policy (an fp16 sink of
the first G tokens unless ``sink_tokens=0``, quantized G-token tiles, an fp16 tail).
``queries``: (Nq, D) or (Hq, Nq, D); default ``random_queries`` N(0, 1) queries per head
from ``seed``. Returns, per preset, the dict ``kvarnctl codec eval --json`` prints: among
others ``k_rel_l2``, ``v_rel_l2`` (relative L2 error, whole sequence), ``k_rel_l2_quantized``,
``v_rel_l2_quantized`` (tiles only), ``attn_rel_l2``, ``attn_cosine_mean``,
``bits_per_element``, ``compression_ratio``, ``encode_gbps``. One dict for one preset name,
a list for a list of names.)doc");
}

}  // namespace kvarn::py
