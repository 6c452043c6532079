#include "kernels/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "kernels/fp16.h"

namespace kvarn {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

CodecStatus Bad(const std::string& name, const std::string& why) {
  return InvalidArgument(name + ": " + why);
}

// Finds `'key':` in the header dict and returns the text after it, trimmed of spaces.
bool FindValue(const std::string& header, const std::string& key, std::string* value) {
  for (const char quote : {'\'', '"'}) {
    const std::string k = std::string(1, quote) + key + std::string(1, quote);
    size_t pos = header.find(k);
    if (pos == std::string::npos) continue;
    pos = header.find(':', pos + k.size());
    if (pos == std::string::npos) return false;
    ++pos;
    while (pos < header.size() && header[pos] == ' ') ++pos;
    *value = header.substr(pos);
    return true;
  }
  return false;
}

std::string TypeDescr(NpyType t) {
  switch (t) {
    case NpyType::kF32: return "<f4";
    case NpyType::kF16: return "<f2";
    case NpyType::kF64: return "<f8";
    case NpyType::kU8: return "|u1";
  }
  return "?";
}

}  // namespace

size_t NpyArray::size() const {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  return n;
}

size_t NpyArray::ElementBytes() const {
  switch (type) {
    case NpyType::kF32: return 4;
    case NpyType::kF16: return 2;
    case NpyType::kF64: return 8;
    case NpyType::kU8: return 1;
  }
  return 0;
}

std::vector<float> NpyArray::ToFloat() const {
  const size_t n = size();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (type) {
      case NpyType::kF32: std::memcpy(&out[i], &data[4 * i], 4); break;
      case NpyType::kF16: {
        uint16_t h;
        std::memcpy(&h, &data[2 * i], 2);
        out[i] = HalfToFloat(h);
        break;
      }
      case NpyType::kF64: {
        double x;
        std::memcpy(&x, &data[8 * i], 8);
        out[i] = static_cast<float>(x);
        break;
      }
      case NpyType::kU8: out[i] = data[i]; break;
    }
  }
  return out;
}

std::string NpyArray::ShapeString() const {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

CodecStatus ParseNpy(const uint8_t* bytes, size_t size, const std::string& name, NpyArray* out) {
  if (size < kMagicLen + 4 || std::memcmp(bytes, kMagic, kMagicLen) != 0) {
    return Bad(name, "not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = bytes[6];
  size_t header_len, pos;
  if (major == 1) {
    header_len = bytes[8] | (bytes[9] << 8);
    pos = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return Bad(name, "truncated header");
    header_len = bytes[8] | (bytes[9] << 8) | (bytes[10] << 16) | (static_cast<size_t>(bytes[11]) << 24);
    pos = 12;
  } else {
    return Bad(name, "unsupported .npy format version " + std::to_string(major));
  }
  if (pos + header_len > size) return Bad(name, "truncated header");
  const std::string header(reinterpret_cast<const char*>(bytes + pos), header_len);
  pos += header_len;

  std::string descr, order, shape;
  if (!FindValue(header, "descr", &descr) || !FindValue(header, "fortran_order", &order) ||
      !FindValue(header, "shape", &shape)) {
    return Bad(name, "header lacks descr, fortran_order or shape");
  }
  NpyArray a;
  const std::string d = descr.substr(1, descr.find_first_of("'\"", 1) - 1);
  if (d == "<f4") a.type = NpyType::kF32;
  else if (d == "<f2") a.type = NpyType::kF16;
  else if (d == "<f8") a.type = NpyType::kF64;
  else if (d == "|u1" || d == "<u1" || d == "u1") a.type = NpyType::kU8;
  else if (d.size() > 0 && d[0] == '>') return Bad(name, "big-endian data (" + d + ") is not supported");
  else return Bad(name, "dtype " + d + " is not supported: use float32 or float16");
  if (order.rfind("True", 0) == 0) {
    return Bad(name, "Fortran-order arrays are not supported: save with numpy.ascontiguousarray");
  }
  if (shape.empty() || shape[0] != '(') return Bad(name, "malformed shape");
  size_t i = 1;
  while (i < shape.size() && shape[i] != ')') {
    while (i < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i < shape.size() && shape[i] == ')') break;
    size_t v = 0;
    bool digits = false;
    while (i < shape.size() && shape[i] >= '0' && shape[i] <= '9') {
      v = v * 10 + static_cast<size_t>(shape[i] - '0');
      if (v > (size_t{1} << 40)) return Bad(name, "shape too large");
      digits = true;
      ++i;
    }
    if (!digits) return Bad(name, "malformed shape");
    a.shape.push_back(v);
  }
  if (i >= shape.size()) return Bad(name, "malformed shape");
  const size_t want = a.size() * a.ElementBytes();
  if (size - pos < want) {
    return Bad(name, "truncated: shape " + a.ShapeString() + " needs " + std::to_string(want) +
                         " data bytes, file has " + std::to_string(size - pos));
  }
  a.data.assign(bytes + pos, bytes + pos + want);
  *out = std::move(a);
  return {};
}

CodecStatus ReadNpy(const std::string& path, NpyArray* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return InvalidArgument(path + ": cannot open");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return ParseNpy(bytes.data(), bytes.size(), path, out);
}

CodecStatus WriteNpy(const std::string& path, const NpyArray& a) {
  std::string header = "{'descr': '" + TypeDescr(a.type) +
                       "', 'fortran_order': False, 'shape': " + a.ShapeString() + ", }";
  const size_t unpadded = kMagicLen + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return InvalidArgument(path + ": cannot create");
  const uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                           static_cast<uint8_t>(header.size() & 0xFF),
                           static_cast<uint8_t>(header.size() >> 8)};
  if (std::fwrite(pre, 1, 10, f.get()) != 10 ||
      std::fwrite(header.data(), 1, header.size(), f.get()) != header.size() ||
      (!a.data.empty() && std::fwrite(a.data.data(), 1, a.data.size(), f.get()) != a.data.size())) {
    return InvalidArgument(path + ": write failed");
  }
  return {};
}

CodecStatus WriteNpyF32(const std::string& path, const std::vector<size_t>& shape,
                        const float* data) {
  NpyArray a;
  a.type = NpyType::kF32;
  a.shape = shape;
  a.data.resize(a.size() * 4);
  if (!a.data.empty()) std::memcpy(a.data.data(), data, a.data.size());
  return WriteNpy(path, a);
}

}  // namespace kvarn
