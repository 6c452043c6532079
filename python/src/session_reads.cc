// Reads in place: the sequence's blocks are immutable while it references them, so no lock
// is needed, and every read runs with the GIL released.
#include "python/src/session_reads.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "python/src/arrays.h"

namespace kvarn::py {

using pyb::ssize_t;

namespace {

// Sink, quantized tiles and tail of one (layer, head), dequantized in place into rows
// [T][layers][H][D] of keys/values at layer index `li`.
absl::Status DequantizeInPlace(const Session& s, uint64_t seq, const SequenceTable& t, int layer,
                               int li, int layers, float* keys, float* values) {
  const BlockLayout& l = s.block_layout();
  const size_t g = static_cast<size_t>(l.tile_tokens), d = static_cast<size_t>(l.head_dim);
  const size_t heads = static_cast<size_t>(l.num_kv_heads);
  std::vector<float> tk(g * d), tv(g * d);
  auto tail = s.TailSlot(seq);
  if (!tail.ok()) return tail.status();
  const auto put = [&](size_t first, size_t count, size_t h) {
    for (size_t i = 0; i < count; ++i) {
      const size_t row =
          (((first + i) * static_cast<size_t>(layers) + static_cast<size_t>(li)) * heads + h) * d;
      std::memcpy(keys + row, tk.data() + i * d, d * sizeof(float));
      std::memcpy(values + row, tv.data() + i * d, d * sizeof(float));
    }
  };
  const auto fp16 = [&](const uint8_t* block, int h, int tokens) {
    const Fp16Run run{reinterpret_cast<const uint16_t*>(block + l.Fp16KeysOffset(layer, h)),
                      reinterpret_cast<const uint16_t*>(block + l.Fp16ValuesOffset(layer, h)),
                      tokens, l.fp16_token_elems()};
    const CodecStatus c = Codec::Default().DecodeFp16Tile(
        s.preset(), l.head_dim, run, TileOut{tk.data(), tv.data(), DType::kF32, Frame::kOriginal});
    return c.ok() ? absl::OkStatus()
                  : absl::Status(static_cast<absl::StatusCode>(c.code()), c.message());
  };
  for (size_t h = 0; h < heads; ++h) {
    const int hi = static_cast<int>(h);
    size_t pos = 0;
    if (t.has_sink) {
      if (absl::Status st = fp16(s.SinkBlock(t.sink_block), hi, l.tile_tokens); !st.ok()) return st;
      put(pos, g, h);
      pos += g;
    }
    for (uint32_t b : t.quant_blocks) {
      if (absl::Status st = s.DequantizeBlock(b, layer, hi, tk.data(), tv.data()); !st.ok())
        return st;
      put(pos, g, h);
      pos += g;
    }
    if (t.tail_tokens > 0) {
      if (absl::Status st = fp16(tail->first, hi, static_cast<int>(t.tail_tokens)); !st.ok())
        return st;
      put(pos, t.tail_tokens, h);
    }
  }
  return absl::OkStatus();
}

}  // namespace

pyb::tuple Dequantize(PySession& ps, SequenceId seq, std::optional<Int<int>> layer_arg) {
  const std::optional<int> layer = Plain(layer_arg);
  std::shared_ptr<Session> s = ps.Get();
  const SequenceTable t = Value(s->Table(seq));
  const BlockLayout& l = s->block_layout();
  if (layer) CheckLayer(*s, *layer);
  const uint64_t expected =
      (t.has_sink ? TileTokens(*s) : 0) + t.quant_blocks.size() * TileTokens(*s) + t.tail_tokens;
  if (expected != t.tokens) {
    ThrowStatus(absl::InternalError(absl::StrCat("sequence ", seq.value, "'s table holds ",
                                                 expected, " tokens, not ", t.tokens)));
  }
  const ssize_t tokens = static_cast<ssize_t>(t.tokens);
  const int layers = layer ? 1 : l.num_layers;
  std::vector<ssize_t> shape = {tokens, l.num_kv_heads, l.head_dim};
  if (!layer) shape.insert(shape.begin() + 1, l.num_layers);
  pyb::array_t<float> keys = NewF32(shape), values = NewF32(shape);
  float* k = keys.mutable_data();
  float* v = values.mutable_data();
  absl::Status st;
  {
    Release nogil;
    const bool in_place = s->mapped() && !s->on_device();
    for (int li = 0; li < layers && st.ok(); ++li) {
      const int la = layer ? *layer : li;
      if (in_place) {
        st = DequantizeInPlace(*s, seq, t, la, li, layers, k, v);
        continue;
      }
      // No host mapping (a remote session, or a pool in GPU memory): the Read RPC.
      std::vector<float> rk, rv;
      if (tokens > 0)
        st = s->Read(seq, static_cast<uint32_t>(la), 0, static_cast<uint32_t>(tokens), &rk, &rv);
      const size_t row = static_cast<size_t>(l.num_kv_heads) * static_cast<size_t>(l.head_dim);
      for (ssize_t i = 0; st.ok() && i < tokens; ++i) {
        const size_t at =
            (static_cast<size_t>(i) * static_cast<size_t>(layers) + static_cast<size_t>(li)) * row;
        std::memcpy(k + at, rk.data() + static_cast<size_t>(i) * row, row * sizeof(float));
        std::memcpy(v + at, rv.data() + static_cast<size_t>(i) * row, row * sizeof(float));
      }
    }
  }
  Check(st);
  return pyb::make_tuple(keys, values);
}

pyb::tuple DequantizeBlock(PySession& ps, BlockId block, std::optional<Int<int>> layer_arg,
                           std::optional<Int<int>> head_arg) {
  const std::optional<int> layer = Plain(layer_arg), head = Plain(head_arg);
  std::shared_ptr<Session> s = ps.Get();
  const BlockLayout& l = s->block_layout();
  if (layer) CheckLayer(*s, *layer);
  if (head) CheckHead(*s, *head);
  std::vector<ssize_t> shape = {l.tile_tokens, l.head_dim};
  if (!head) shape.insert(shape.begin(), l.num_kv_heads);
  if (!layer) shape.insert(shape.begin(), l.num_layers);
  pyb::array_t<float> keys = NewF32(shape), values = NewF32(shape);
  float* k = keys.mutable_data();
  float* v = values.mutable_data();
  absl::Status st;
  {
    Release nogil;
    const size_t tile = l.tile_elems();
    size_t at = 0;
    for (int la = layer.value_or(0); la < (layer ? *layer + 1 : l.num_layers) && st.ok(); ++la) {
      for (int h = head.value_or(0); h < (head ? *head + 1 : l.num_kv_heads) && st.ok();
           ++h, at += tile) {
        st = s->DequantizeBlock(block, la, h, k + at, v + at);
      }
    }
  }
  Check(st);
  return pyb::make_tuple(keys, values);
}

pyb::object Attend(PySession& ps, SequenceId seq, Int<int> layer, pyb::object queries,
                   pyb::object out, bool return_lse) {
  std::shared_ptr<Session> s = ps.Get();
  const BlockLayout& l = s->block_layout();
  CheckLayer(*s, layer);
  // The shape is checked before the queries are converted (no copy of what is refused).
  FloatInput q = AsFloat(queries, "queries", /*allow_f16=*/false, [&](const pyb::array& a) {
    const ssize_t heads = a.ndim() == 2 ? a.shape(0) : 0;
    if (a.ndim() != 2 || a.shape(1) != l.head_dim || heads < l.num_kv_heads ||
        heads % l.num_kv_heads != 0) {
      ThrowValue(absl::StrCat(
          "queries has shape ", ShapeString(a), "; attend needs (num_query_heads, ", l.head_dim,
          ") with num_query_heads a multiple of the ", l.num_kv_heads, " kv-heads"));
    }
    if (heads > std::numeric_limits<int>::max()) {
      ThrowValue(absl::StrCat("queries has shape ", ShapeString(a), "; attend takes at most ",
                              std::numeric_limits<int>::max(), " query heads"));
    }
  });
  const ssize_t hq = q.array.shape(0);
  pyb::array result;
  if (out.is_none()) {
    result = NewF32({hq, l.head_dim});
  } else {
    if (!pyb::isinstance<pyb::array>(out))
      ThrowType("out must be a numpy array (float32, C-contiguous)");
    result = out.cast<pyb::array>();
    if (!result.dtype().equal(pyb::dtype::of<float>()) || !CContiguous(result) ||
        !result.writeable()) {
      ThrowValue(absl::StrCat("out has dtype ", std::string(pyb::str(result.dtype())),
                              CContiguous(result) ? "" : ", not C-contiguous",
                              result.writeable() ? "" : ", read-only",
                              "; attend writes a writable C-contiguous float32 array"));
    }
    if (!HasShape(result, {hq, l.head_dim})) {
      ThrowValue(absl::StrCat("out has shape ", ShapeString(result), "; attend writes ",
                              ShapeString({hq, l.head_dim})));
    }
  }
  // Queries in the very memory attend writes (out a view of them) are read from a copy:
  // the kernels write each head's output while other heads' queries are still to be read.
  if (MemoryOverlaps(q.array, result)) q.array = q.array.attr("copy")();
  const auto* qp = static_cast<const float*>(q.data());
  auto* op = static_cast<float*>(result.mutable_data());
  pyb::array lse;
  float* lp = nullptr;
  if (return_lse) {
    lse = NewF32({hq});
    lp = static_cast<float*>(lse.mutable_data());
  }
  absl::Status st;
  {
    Release nogil;
    st = s->Attend(seq, layer, qp, static_cast<int>(hq), op, lp);
  }
  Check(st);
  pyb::object o = out.is_none() ? AsOutput(result, q.from_torch) : out;
  if (!return_lse) return o;
  return pyb::make_tuple(o, AsOutput(lse, q.from_torch));
}

}  // namespace kvarn::py
