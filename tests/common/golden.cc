#include "tests/common/golden.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "kernels/kvarn_math.h"
#include "kernels/npy.h"
#include "tests/common/json.h"

namespace kvarn::testing {
namespace {

NpyArray Load(const std::string& dir, const std::string& file) {
  NpyArray a;
  CodecStatus s = ReadNpy(dir + "/" + file, &a);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return a;
}

std::vector<float> LoadF32(const std::string& dir, const std::string& file) {
  return Load(dir, file).ToFloat();
}

std::vector<uint16_t> LoadHalfBits(const std::string& dir, const std::string& file) {
  NpyArray a = Load(dir, file);
  if (a.type != NpyType::kF16) throw std::runtime_error(file + " is not float16");
  std::vector<uint16_t> out(a.size());
  std::memcpy(out.data(), a.data.data(), out.size() * 2);
  return out;
}

uint16_t HalfAt(const std::vector<uint8_t>& record, size_t offset, int i) {
  uint16_t h;
  std::memcpy(&h, record.data() + offset + 2 * static_cast<size_t>(i), 2);
  return h;
}

}  // namespace

std::string GoldenDir() {
  if (const char* env = std::getenv("KVARN_GOLDEN_DIR")) return env;
#ifdef KVARN_GOLDEN_DIR_DEFAULT
  return KVARN_GOLDEN_DIR_DEFAULT;
#else
  return "tests/golden";
#endif
}

std::vector<GoldenCase> LoadGoldenCases(const std::string& dir) {
  std::ifstream f(dir + "/manifest.json");
  if (!f) throw std::runtime_error("cannot open " + dir + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const Json m = Json::Parse(text);
  std::vector<GoldenCase> cases;
  for (const Json& jc : m["cases"].AsArray()) {
    GoldenCase c;
    c.name = jc["name"].AsString();
    c.degenerate = jc["degenerate"].AsBool();
    c.tokens = static_cast<int>(m["tile_tokens"].AsNumber());
    c.head_dim = static_cast<int>(m["head_dim"].AsNumber());
    c.iterations = static_cast<int>(m["sinkhorn_iterations"].AsNumber());
    c.k = LoadF32(dir, jc["k"].AsString());
    c.v = LoadF32(dir, jc["v"].AsString());
    c.q = LoadF32(dir, jc["q"].AsString());
    c.k_rot = LoadF32(dir, jc["k_rot"].AsString());
    c.v_rot = LoadF32(dir, jc["v_rot"].AsString());
    c.num_queries = static_cast<int>(c.q.size() / static_cast<size_t>(c.head_dim));
    for (const Json& jp : jc["presets"].AsArray()) {
      GoldenPreset p;
      p.prefix = jp["prefix"].AsString();
      p.key_bits = static_cast<int>(jp["key_bits"].AsNumber());
      p.value_bits = static_cast<int>(jp["value_bits"].AsNumber());
      p.preset_name = "kvarn_k" + std::to_string(p.key_bits) + "v" + std::to_string(p.value_bits) +
                      "_g" + std::to_string(c.tokens);
      p.record_bytes = static_cast<size_t>(jp["record_bytes"].AsNumber());
      p.attn_rel_l2_error = jp["attn_rel_l2_error"].AsNumber();
      p.k_rel_l2_error = jp["k_rel_l2_error"].AsNumber();
      p.v_rel_l2_error = jp["v_rel_l2_error"].AsNumber();
      c.presets.push_back(p);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<double> ExactAttention(const float* q, int num_queries, const float* k,
                                   const float* v, int tokens, int head_dim) {
  std::vector<double> out(static_cast<size_t>(num_queries) * head_dim, 0.0);
  std::vector<double> s(tokens);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  for (int h = 0; h < num_queries; ++h) {
    double m = -INFINITY;
    for (int t = 0; t < tokens; ++t) {
      double dot = 0;
      for (int d = 0; d < head_dim; ++d) {
        dot += static_cast<double>(q[h * head_dim + d]) * k[static_cast<size_t>(t) * head_dim + d];
      }
      s[t] = dot * scale;
      m = std::fmax(m, s[t]);
    }
    double sum = 0;
    for (int t = 0; t < tokens; ++t) sum += (s[t] = std::exp(s[t] - m));
    for (int t = 0; t < tokens; ++t) {
      for (int d = 0; d < head_dim; ++d) {
        out[static_cast<size_t>(h) * head_dim + d] += s[t] / sum * v[static_cast<size_t>(t) * head_dim + d];
      }
    }
  }
  return out;
}

double RelL2(const float* approx, const double* exact, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = approx[i] - exact[i];
    num += e * e;
    den += exact[i] * exact[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

double RelL2(const float* approx, const float* exact, size_t n) {
  std::vector<double> e(exact, exact + n);
  return RelL2(approx, e.data(), n);
}

int HalfUlpDistance(uint16_t a, uint16_t b) {
  // Map sign-magnitude to a monotonic integer line.
  const auto ordered = [](uint16_t h) {
    return (h & 0x8000) ? -static_cast<int>(h & 0x7FFF) : static_cast<int>(h);
  };
  return std::abs(ordered(a) - ordered(b));
}

Conformance CheckConformance(const std::string& dir, const GoldenCase& c, const GoldenPreset& p,
                             const CodecOutput& out) {
  Conformance r;
  const int g = c.tokens, d = c.head_dim;
  const size_t n = static_cast<size_t>(g) * d;
  const auto fail = [&](const std::string& what) { r.failures.push_back(p.prefix + ": " + what); };
  if (out.record.size() != p.record_bytes) {
    fail("record is " + std::to_string(out.record.size()) + " bytes, reference " +
         std::to_string(p.record_bytes));
    return r;
  }
  const RecordLayout l = ComputeRecordLayout(d, g, p.key_bits, p.value_bits);

  // Codes: the reference stores them unpacked, K channel-major [D][G], V token-major [G][D].
  const NpyArray kc = Load(dir, p.prefix + ".k_codes.npy");
  const NpyArray vc = Load(dir, p.prefix + ".v_codes.npy");
  size_t k_equal = 0, v_equal = 0;
  for (int ch = 0; ch < d; ++ch) {
    for (int t = 0; t < g; ++t) {
      const uint8_t ours = UnpackCode(out.record.data() + l.k_codes + static_cast<size_t>(ch) * (g * p.key_bits / 8), t, p.key_bits);
      k_equal += ours == kc.data[static_cast<size_t>(ch) * g + t];
    }
  }
  for (int t = 0; t < g; ++t) {
    for (int ch = 0; ch < d; ++ch) {
      const uint8_t ours = UnpackCode(out.record.data() + l.v_codes + static_cast<size_t>(t) * (d * p.value_bits / 8), ch, p.value_bits);
      v_equal += ours == vc.data[static_cast<size_t>(t) * d + ch];
    }
  }
  r.k_code_match = static_cast<double>(k_equal) / n;
  r.v_code_match = static_cast<double>(v_equal) / n;

  const struct {
    const char* file;
    size_t offset;
    int count;
  } scales[] = {{".k_a.npy", l.k_a, d}, {".k_b.npy", l.k_b, d}, {".k_r.npy", l.k_r, g},
                {".v_c.npy", l.v_c, d}, {".v_a.npy", l.v_a, g}, {".v_b.npy", l.v_b, g}};
  std::string worst;
  for (const auto& s : scales) {
    const std::vector<uint16_t> ref = LoadHalfBits(dir, p.prefix + s.file);
    for (int i = 0; i < s.count; ++i) {
      const int ulps = HalfUlpDistance(HalfAt(out.record, s.offset, i), ref[i]);
      if (ulps > r.max_scale_ulps) {
        r.max_scale_ulps = ulps;
        worst = std::string(s.file) + "[" + std::to_string(i) + "]";
      }
    }
  }
  if (!c.degenerate) {
    if (r.k_code_match < 0.999) fail("key codes match on " + std::to_string(100 * r.k_code_match) + "% < 99.9%");
    if (r.v_code_match < 0.999) fail("value codes match on " + std::to_string(100 * r.v_code_match) + "% < 99.9%");
    if (r.max_scale_ulps > 2) fail("fp16 scale " + worst + " is " + std::to_string(r.max_scale_ulps) + " ulps off");
  }

  r.k_err = RelL2(out.k_hat.data(), c.k.data(), n);
  r.v_err = RelL2(out.v_hat.data(), c.v.data(), n);
  const std::vector<double> exact = ExactAttention(c.q.data(), c.num_queries, c.k.data(), c.v.data(), g, d);
  r.attn_err = RelL2(out.attention.data(), exact.data(), exact.size());
  const auto bound = [](double ref) { return ref * 1.02 + 1e-6; };
  if (r.k_err > bound(p.k_rel_l2_error)) fail("K error " + std::to_string(r.k_err) + " > bound " + std::to_string(bound(p.k_rel_l2_error)));
  if (r.v_err > bound(p.v_rel_l2_error)) fail("V error " + std::to_string(r.v_err) + " > bound " + std::to_string(bound(p.v_rel_l2_error)));
  if (r.attn_err > bound(p.attn_rel_l2_error)) fail("attention error " + std::to_string(r.attn_err) + " > bound " + std::to_string(bound(p.attn_rel_l2_error)));
  return r;
}

}  // namespace kvarn::testing
