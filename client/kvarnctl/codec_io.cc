#include "client/kvarnctl/codec_io.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>

#include "client/kvarnctl/command.h"
#include "client/kvarnctl/rng.h"

namespace kvarn::ctl {
namespace {

constexpr float kFp16Max = 65504.0f;

std::string IndexString(const std::vector<size_t>& shape, size_t flat) {
  std::vector<size_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

// Reads a float .npy and widens it, rejecting non-float types and non-finite or
// out-of-range elements.
CodecStatus ReadFloatNpy(const std::string& path, NpyArray* array, std::vector<float>* data) {
  KVARN_RETURN_IF_ERROR(ReadNpy(path, array));
  if (array->type == NpyType::kU8) {
    return InvalidArgument(path + ": dtype uint8 is not supported: save K/V as float32 or float16");
  }
  *data = array->ToFloat();
  for (size_t i = 0; i < data->size(); ++i) {
    const float x = (*data)[i];
    if (std::isnan(x) || std::isinf(x)) {
      return InvalidArgument(path + ": element " + IndexString(array->shape, i) + " is " +
                             (std::isnan(x) ? "NaN" : "Inf") + "; inputs must be finite");
    }
    if (std::fabs(x) > kFp16Max) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(x));
      return InvalidArgument(path + ": element " + IndexString(array->shape, i) + " = " + buf +
                             " is beyond the fp16 range (|x| <= 65504) that the cache stores");
    }
  }
  return {};
}

std::string ShapeOf(const std::vector<size_t>& shape) {
  NpyArray a;
  a.shape = shape;
  return a.ShapeString();
}

}  // namespace

const char* NpyTypeName(NpyType type) {
  switch (type) {
    case NpyType::kF32:
      return "float32";
    case NpyType::kF16:
      return "float16";
    case NpyType::kF64:
      return "float64";
    case NpyType::kU8:
      return "uint8";
  }
  return "?";
}

std::string KvTensor::ShapeString() const {
  if (rank2) return ShapeOf({static_cast<size_t>(tokens), static_cast<size_t>(head_dim)});
  return ShapeOf(
      {static_cast<size_t>(heads), static_cast<size_t>(tokens), static_cast<size_t>(head_dim)});
}

CodecStatus LoadSequence(const std::string& path, KvTensor* out) {
  NpyArray array;
  std::vector<float> data;
  KVARN_RETURN_IF_ERROR(ReadFloatNpy(path, &array, &data));
  const std::vector<size_t>& s = array.shape;
  if (s.size() != 2 && s.size() != 3) {
    std::string msg = path + " has shape " + array.ShapeString() + " (rank " +
                      std::to_string(s.size()) + "); expected [T, D] or [H, T, D]";
    if (s.size() == 4) msg += " (for a PyTorch [B, H, T, D] cache, save one batch entry: k[b])";
    return InvalidArgument(msg);
  }
  const size_t heads = s.size() == 3 ? s[0] : 1;
  const size_t tokens = s[s.size() - 2];
  const size_t dim = s.back();
  if (heads < 1) return InvalidArgument(path + " has shape " + array.ShapeString() + ": no heads");
  if (tokens < 1) {
    return InvalidArgument(path + " has shape " + array.ShapeString() +
                           ": T = 0 tokens; need at least 1");
  }
  // CheckHeadDim's message, without narrowing an absurd size to int first.
  const CodecStatus dim_ok = dim > 4096 ? InvalidArgument("head_dim " + std::to_string(dim) +
                                                          " is not supported: use 64, 128, 256 "
                                                          "or 512")
                                        : CheckHeadDim(static_cast<int>(dim));
  if (!dim_ok.ok()) {
    return InvalidArgument(path + " has shape " + array.ShapeString() + ": " + dim_ok.message());
  }
  if (heads * tokens > (size_t{1} << 31) / dim) {
    return InvalidArgument(path + " has shape " + array.ShapeString() +
                           ": too large (more than 2^31 elements)");
  }
  out->heads = static_cast<int>(heads);
  out->tokens = static_cast<int>(tokens);
  out->head_dim = static_cast<int>(dim);
  out->rank2 = s.size() == 2;
  out->file_type = array.type;
  out->path = path;
  out->data = std::move(data);
  return {};
}

CodecStatus CheckSameShape(const KvTensor& keys, const KvTensor& values) {
  if (keys.heads != values.heads || keys.tokens != values.tokens ||
      keys.head_dim != values.head_dim) {
    return InvalidArgument(keys.path + " has shape " + keys.ShapeString() + " but " + values.path +
                           " has shape " + values.ShapeString() +
                           "; keys and values must have the same shape");
  }
  return {};
}

CodecStatus LoadTile(const std::string& path, const Preset& preset, std::vector<float>* out,
                     int* head_dim) {
  NpyArray array;
  std::vector<float> data;
  KVARN_RETURN_IF_ERROR(ReadFloatNpy(path, &array, &data));
  const std::vector<size_t>& s = array.shape;
  const size_t g = static_cast<size_t>(preset.tile_tokens);
  const bool dim_ok = s.size() == 2 && s[1] <= 4096 && CheckHeadDim(static_cast<int>(s[1])).ok();
  if (s.size() != 2 || s[0] != g || !dim_ok) {
    return InvalidArgument(path + " has shape " + array.ShapeString() + "; " + preset.Name() +
                           " needs (" + std::to_string(g) +
                           ", D): one tile of one head, token-major, D in 64, 128, 256 or 512");
  }
  *head_dim = static_cast<int>(s[1]);
  *out = std::move(data);
  return {};
}

CodecStatus LoadQueries(const std::string& path, const KvTensor& keys, QuerySet* out) {
  NpyArray array;
  std::vector<float> data;
  KVARN_RETURN_IF_ERROR(ReadFloatNpy(path, &array, &data));
  const std::vector<size_t>& s = array.shape;
  const std::string expected = "expected [Nq, " + std::to_string(keys.head_dim) +
                               "] or [H*g, Nq, " + std::to_string(keys.head_dim) +
                               "] with H = " + std::to_string(keys.heads) + " kv-heads";
  if (s.size() != 2 && s.size() != 3) {
    return InvalidArgument(path + " has shape " + array.ShapeString() + "; " + expected);
  }
  if (s.back() != static_cast<size_t>(keys.head_dim)) {
    return InvalidArgument(path + " has shape " + array.ShapeString() + ": head_dim " +
                           std::to_string(s.back()) + " does not match the keys' " +
                           std::to_string(keys.head_dim));
  }
  const size_t qheads = s.size() == 3 ? s[0] : 0;
  const size_t per_head = s[s.size() - 2];
  if (per_head < 1 || (s.size() == 3 && (qheads < 1 || qheads % keys.heads != 0))) {
    return InvalidArgument(path + " has shape " + array.ShapeString() + "; " + expected);
  }
  if (per_head > 4096 || qheads > 4096) {
    return InvalidArgument(path + " has shape " + array.ShapeString() + ": too many queries");
  }
  QuerySet q;
  q.head_dim = keys.head_dim;
  q.per_head = static_cast<int>(per_head);
  q.from_file = true;
  if (s.size() == 2) {
    // The same queries for every kv-head.
    q.query_heads = keys.heads;
    q.data.reserve(data.size() * keys.heads);
    for (int h = 0; h < keys.heads; ++h) q.data.insert(q.data.end(), data.begin(), data.end());
    q.source = std::to_string(per_head) + " per head from " + path + " (the same for every head)";
  } else {
    q.query_heads = static_cast<int>(qheads);
    q.data = std::move(data);
    q.source = std::to_string(per_head) + " per query head from " + path;
    if (qheads != static_cast<size_t>(keys.heads)) {
      q.source += " (" + std::to_string(qheads) + " query heads, " +
                  std::to_string(qheads / keys.heads) + " per kv-head)";
    }
  }
  *out = std::move(q);
  return {};
}

QuerySet RandomQueries(const KvTensor& keys, int count, uint64_t seed) {
  QuerySet q;
  q.query_heads = keys.heads;
  q.per_head = count;
  q.head_dim = keys.head_dim;
  q.data.resize(static_cast<size_t>(keys.heads) * count * keys.head_dim);
  Rng rng(seed ^ 0x51ED270B7A3C91E5ull);
  for (float& x : q.data) x = static_cast<float>(rng.Normal());
  q.source = std::to_string(count) + " per head, random: every channel N(0, 1), seed " +
             std::to_string(seed) + " (pass --queries Q.npy for real ones)";
  return q;
}

CodecStatus ReadFileBytes(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return InvalidArgument(path + ": cannot open");
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (f.bad()) return InvalidArgument(path + ": read failed");
  return {};
}

CodecStatus WriteFileBytes(const std::string& path, const uint8_t* data, size_t size) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return WriteFailure(path + ": cannot create");
  if (std::fwrite(data, 1, size, f.get()) != size) return WriteFailure(path + ": write failed");
  if (std::fclose(f.release()) != 0) return WriteFailure(path + ": write failed");
  return {};
}

CodecStatus WriteF32(const std::string& path, const std::vector<size_t>& shape, const float* data) {
  const CodecStatus s = WriteNpyF32(path, shape, data);
  return s.ok() ? s : WriteFailure(s.message());
}

}  // namespace kvarn::ctl
