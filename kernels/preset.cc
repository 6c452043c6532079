#include "kernels/preset.h"

#include <cassert>

namespace kvarn {

const char* MethodName(Method m) {
  switch (m) {
    case Method::kKvarn: return "kvarn";
    case Method::kKivi: return "kivi";
    case Method::kHadamard: return "hadamard";
    case Method::kFp16: return "fp16";
  }
  return "?";
}

namespace {

constexpr int kFp16TileTokens = 128;

bool ParseBits(std::string_view s, int* bits) {
  if (s == "2") *bits = 2;
  else if (s == "4") *bits = 4;
  else return false;
  return true;
}

}  // namespace

CodecStatus CheckHeadDim(int head_dim) {
  if (head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512) return {};
  return InvalidArgument("head_dim " + std::to_string(head_dim) +
                         " is not supported: use 64, 128, 256 or 512");
}

std::string Preset::Name() const {
  if (method == Method::kFp16) return "fp16";
  const char* prefix = MethodName(method);
  return std::string(prefix) + "_k" + std::to_string(key_bits) + "v" + std::to_string(value_bits) +
         "_g" + std::to_string(tile_tokens);
}

size_t Preset::RecordBytes(int head_dim) const {
  assert(CheckHeadDim(head_dim).ok());
  if (method == Method::kFp16) {
    return 2 * 2 * static_cast<size_t>(tile_tokens) * static_cast<size_t>(head_dim);
  }
  return Layout(head_dim).total;
}

RecordLayout Preset::Layout(int head_dim) const {
  return ComputeRecordLayout(head_dim, tile_tokens, key_bits, value_bits);
}

double Preset::BitsPerElement(int head_dim) const {
  return 8.0 * static_cast<double>(RecordBytes(head_dim)) /
         (2.0 * tile_tokens * static_cast<double>(head_dim));
}

CodecStatus ParsePreset(std::string_view name, Preset* out) {
  const auto bad = [&] {
    return InvalidArgument("unknown preset '" + std::string(name) +
                           "': expected fp16 or {kvarn|kivi|hadamard}_k{2|4}v{2|4}_g{64|128}");
  };
  if (name == "fp16") {
    *out = Preset{Method::kFp16, 16, 16, kFp16TileTokens};
    return {};
  }
  Preset p;
  std::string_view rest;
  for (auto [prefix, method] : {std::pair{std::string_view("kvarn_k"), Method::kKvarn},
                                std::pair{std::string_view("kivi_k"), Method::kKivi},
                                std::pair{std::string_view("hadamard_k"), Method::kHadamard}}) {
    if (name.starts_with(prefix)) {
      p.method = method;
      rest = name.substr(prefix.size());
      break;
    }
  }
  // rest = "<kb>v<vb>_g<G>"
  if (rest.size() < 6 || rest[1] != 'v' || rest[3] != '_' || rest[4] != 'g') return bad();
  if (!ParseBits(rest.substr(0, 1), &p.key_bits) || !ParseBits(rest.substr(2, 1), &p.value_bits)) {
    return bad();
  }
  const std::string_view g = rest.substr(5);
  if (g == "64") p.tile_tokens = 64;
  else if (g == "128") p.tile_tokens = 128;
  else return bad();
  *out = p;
  return {};
}

std::vector<std::string> AllPresetNames() {
  std::vector<std::string> names;
  for (const char* method : {"kvarn", "kivi", "hadamard"}) {
    for (int kb : {2, 4}) {
      for (int vb : {2, 4}) {
        for (int g : {64, 128}) {
          names.push_back(std::string(method) + "_k" + std::to_string(kb) + "v" +
                          std::to_string(vb) + "_g" + std::to_string(g));
        }
      }
    }
  }
  names.push_back("fp16");
  return names;
}

std::string CodecStatus::ToString() const {
  if (ok()) return "OK";
  const char* code = "UNKNOWN";
  switch (code_) {
    case CodecCode::kOk: code = "OK"; break;
    case CodecCode::kInvalidArgument: code = "INVALID_ARGUMENT"; break;
    case CodecCode::kFailedPrecondition: code = "FAILED_PRECONDITION"; break;
    case CodecCode::kInternal: code = "INTERNAL"; break;
    case CodecCode::kUnavailable: code = "UNAVAILABLE"; break;
  }
  return std::string(code) + ": " + message_;
}

BlockLayout MakeBlockLayout(const Preset& preset, int layers, int kv_heads, int head_dim) {
  BlockLayout l;
  l.num_layers = layers;
  l.num_kv_heads = kv_heads;
  l.head_dim = head_dim;
  l.tile_tokens = preset.tile_tokens;
  l.record_bytes = preset.RecordBytes(head_dim);
  return l;
}

}  // namespace kvarn
