#include "client/kvarnctl/codec_synth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "client/kvarnctl/codec_io.h"
#include "client/kvarnctl/command.h"
#include "client/kvarnctl/rng.h"
#include "kernels/preset.h"

namespace kvarn::ctl {
namespace {

constexpr double kRopeBase = 10000.0;
constexpr double kTwoPi = 6.283185307179586;

double LogNormal(Rng& rng, double sigma) { return std::exp(sigma * rng.Normal()); }

double Norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

// Rotates the pairs (i, i + D/2) of x by position * theta_i.
template <typename T>
void ApplyRope(T* x, int d, double position) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const double a = position * std::pow(kRopeBase, -2.0 * i / d);
    const double c = std::cos(a), s = std::sin(a);
    const double u = x[i], v = x[i + half];
    x[i] = static_cast<T>(u * c - v * s);
    x[i + half] = static_cast<T>(u * s + v * c);
  }
}

// A [rows][rank] factor with a decaying spectrum: column j scaled by (j + 1)^-decay, row
// c by row_scale[c]; entries Gaussian.
std::vector<double> LowRank(Rng& rng, int rows, int rank, double decay,
                            const std::vector<double>& row_scale) {
  std::vector<double> f(static_cast<size_t>(rows) * rank);
  for (int c = 0; c < rows; ++c) {
    for (int j = 0; j < rank; ++j) {
      f[static_cast<size_t>(c) * rank + j] =
          row_scale[c] * std::pow(j + 1.0, -decay) * rng.Normal();
    }
  }
  return f;
}

void MakeHead(const SynthOptions& o, int head, SynthData* out) {
  const SynthModel& m = o.model;
  const int d = o.head_dim, t_count = o.tokens, half = d / 2;
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  Rng rng(o.seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull * (head + 1));

  // Key offset: small everywhere, large on a few pairs in the slower half of the
  // frequencies (but not the slowest eighth, which holds the sink direction).
  std::vector<double> mu(d), mu_out(d, 0.0);
  for (double& x : mu) x = 0.3 * rng.Normal();
  std::vector<bool> outlier(d, false);
  const int lo_pair = half / 2, hi_pair = half - half / 4;
  for (int p = 0; p < m.outlier_pairs && p < hi_pair - lo_pair; ++p) {
    int i;
    do {
      i = lo_pair + static_cast<int>(rng.Next() % static_cast<uint64_t>(hi_pair - lo_pair));
    } while (outlier[i]);
    const double mag = m.outlier_min + (m.outlier_max - m.outlier_min) * rng.Uniform();
    const double phase = kTwoPi * rng.Uniform();
    mu[i] = mu_out[i] = mag * std::cos(phase);
    mu[i + half] = mu_out[i + half] = mag * std::sin(phase);
    outlier[i] = outlier[i + half] = true;
  }
  // Key content, with uneven channel scales, larger on the outlier channels.
  std::vector<double> key_scale(d);
  for (int c = 0; c < d; ++c)
    key_scale[c] = LogNormal(rng, 0.4) * (outlier[c] ? m.outlier_spread : 1.0);
  const std::vector<double> a = LowRank(rng, d, m.key_rank, m.spectrum_decay, key_scale);
  // Sink direction: the slowest eighth of the pairs, unit norm.
  std::vector<double> sink_dir(d, 0.0);
  for (int i = hi_pair; i < half; ++i) {
    sink_dir[i] = rng.Normal();
    sink_dir[i + half] = rng.Normal();
  }
  const double sink_norm = Norm(sink_dir);
  for (double& x : sink_dir) x /= sink_norm;
  // Values.
  const std::vector<double> unit_rows(d, 1.0);
  std::vector<double> vc(d), vb(d);
  for (int c = 0; c < d; ++c) {
    vc[c] = m.value_tail * LogNormal(rng, m.value_channel_sigma);
    vb[c] = 0.1 * rng.Normal();
  }
  const std::vector<double> b = LowRank(rng, d, m.value_rank, m.spectrum_decay, unit_rows);

  // A typical key's norm, E|k_pre|^2 = |mu|^2 + E[n^2] (|A|_F^2 + D noise^2), sets the
  // sink's size.
  double content_power = 0;
  for (double x : a) content_power += x * x;
  const double typical_key =
      std::sqrt(Norm(mu) * Norm(mu) + std::exp(2 * m.token_norm_sigma * m.token_norm_sigma) *
                                          (content_power + d * m.key_noise * m.key_noise));
  const double sink_magnitude = m.sink_key * typical_key;

  std::vector<double> z(std::max(m.key_rank, m.value_rank)), k_pre(d);
  for (int t = 0; t < t_count; ++t) {
    float* k = &out->keys[(static_cast<size_t>(head) * t_count + t) * d];
    float* v = &out->values[(static_cast<size_t>(head) * t_count + t) * d];
    const bool sink = t == 0;
    for (int j = 0; j < m.key_rank; ++j) z[j] = rng.Normal();
    const double n = sink ? 0.0 : LogNormal(rng, m.token_norm_sigma);
    const double toward_sink = sink ? sink_magnitude : 0.0;
    for (int c = 0; c < d; ++c) {
      double x = m.key_noise * rng.Normal();
      for (int j = 0; j < m.key_rank; ++j) x += a[static_cast<size_t>(c) * m.key_rank + j] * z[j];
      k_pre[c] = mu[c] + n * x + toward_sink * sink_dir[c];
    }
    for (int c = 0; c < d; ++c) k[c] = static_cast<float>(k_pre[c]);
    ApplyRope(k, d, t);
    for (int j = 0; j < m.value_rank; ++j) z[j] = rng.Normal();
    const double scale = sink ? m.sink_value : LogNormal(rng, m.value_token_sigma);
    for (int c = 0; c < d; ++c) {
      double x = vb[c] + vc[c] * rng.StudentT(m.value_dof);
      for (int j = 0; j < m.value_rank; ++j)
        x += b[static_cast<size_t>(c) * m.value_rank + j] * z[j];
      v[c] = static_cast<float>(scale * x);
    }
  }

  // Decode queries at position T. Each part's size is set by the spread of scores it
  // causes, in nats: position = the offset part's score at relative distance 0; content =
  // the std over tokens of the content part's score; sink = the sink's extra score.
  const double mu_out_norm = Norm(mu_out);
  std::vector<double> q(d), content(d);
  for (int j = 0; j < o.queries; ++j) {
    std::vector<double> w(m.key_rank);
    for (double& x : w) x = rng.Normal();
    // Direction in the key content subspace, and the score std it gives: |A^T c| for unit c.
    for (int c = 0; c < d; ++c) {
      content[c] = 0;
      for (int r = 0; r < m.key_rank; ++r)
        content[c] += a[static_cast<size_t>(c) * m.key_rank + r] * w[r];
    }
    const double content_norm = Norm(content);
    double spread = 0;
    for (int r = 0; r < m.key_rank; ++r) {
      double col = 0;
      for (int c = 0; c < d; ++c)
        col += content[c] / content_norm * a[static_cast<size_t>(c) * m.key_rank + r];
      spread += col * col;
    }
    spread = std::sqrt(spread);
    for (int c = 0; c < d; ++c) {
      q[c] = (mu_out_norm > 0 ? m.query_position * sqrt_d * mu_out[c] / (mu_out_norm * mu_out_norm)
                              : 0.0) +
             m.query_content * sqrt_d * content[c] / (content_norm * spread);
    }
    ApplyRope(q.data(), d, t_count);
    float* qo = &out->q[(static_cast<size_t>(head) * o.queries + j) * d];
    for (int c = 0; c < d; ++c) {
      qo[c] = static_cast<float>(q[c] + m.query_sink * sqrt_d * sink_dir[c] / sink_magnitude);
    }
  }
}

}  // namespace

CodecStatus CheckSynthOptions(const SynthOptions& o) {
  if (o.tokens < 1 || o.tokens > (1 << 20)) {
    return InvalidArgument("--tokens " + std::to_string(o.tokens) + " is outside 1..1048576");
  }
  if (o.heads < 1 || o.heads > 256) {
    return InvalidArgument("--heads " + std::to_string(o.heads) + " is outside 1..256");
  }
  const CodecStatus dim = CheckHeadDim(o.head_dim);
  if (!dim.ok()) return InvalidArgument("--head-dim: " + dim.message());
  if (static_cast<double>(o.tokens) * o.heads * o.head_dim > double{1 << 28}) {
    return InvalidArgument("--tokens x --heads x --head-dim is above 2^28 elements");
  }
  if (o.queries < 1 || o.queries > 64) return InvalidArgument("queries must be in 1..64");
  return {};
}

SynthData MakeSynthetic(const SynthOptions& o) {
  SynthData data;
  data.heads = o.heads;
  data.tokens = o.tokens;
  data.head_dim = o.head_dim;
  data.queries = o.queries;
  const size_t n = static_cast<size_t>(o.heads) * o.tokens * o.head_dim;
  data.keys.resize(n);
  data.values.resize(n);
  data.q.resize(static_cast<size_t>(o.heads) * o.queries * o.head_dim);
  for (int h = 0; h < o.heads; ++h) MakeHead(o, h, &data);
  return data;
}

CodecStatus WriteSynthetic(const std::string& dir, const SynthData& data,
                           std::vector<std::string>* files) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return WriteFailure(dir + ": cannot create directory: " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) return WriteFailure(dir + ": not a directory");
  const size_t h = data.heads, t = data.tokens, d = data.head_dim;
  const std::string base = dir.back() == '/' ? dir : dir + "/";
  files->clear();
  for (const auto& [name, shape, ptr] :
       {std::tuple{"k.npy", std::vector<size_t>{h, t, d}, data.keys.data()},
        std::tuple{"v.npy", std::vector<size_t>{h, t, d}, data.values.data()},
        std::tuple{"q.npy", std::vector<size_t>{h, static_cast<size_t>(data.queries), d},
                   data.q.data()}}) {
    const std::string path = base + name;
    KVARN_RETURN_IF_ERROR(WriteF32(path, shape, ptr));
    files->push_back(path);
  }
  return {};
}

AttentionShape DescribeAttention(const SynthData& data) {
  const int d = data.head_dim;
  AttentionShape shape;
  std::vector<double> s(data.tokens);
  for (int h = 0; h < data.heads; ++h) {
    for (int j = 0; j < data.queries; ++j) {
      const float* q = &data.q[(static_cast<size_t>(h) * data.queries + j) * d];
      double mx = -INFINITY;
      for (int t = 0; t < data.tokens; ++t) {
        const float* k = &data.keys[(static_cast<size_t>(h) * data.tokens + t) * d];
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[c];
        s[t] = dot / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      double entropy = 0;
      for (double x : s) {
        const double p = x / sum;
        if (p > 0) entropy -= p * std::log(p);
      }
      shape.sink_mass += s[0] / sum;
      shape.effective_tokens += std::exp(entropy);
    }
  }
  const double n = static_cast<double>(data.heads) * data.queries;
  shape.sink_mass /= n;
  shape.effective_tokens /= n;
  return shape;
}

}  // namespace kvarn::ctl
