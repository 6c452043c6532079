// `kvarnctl codec synth`: SYNTHETIC K/V with the statistical features that make KV-cache
// quantization hard on real models, for trying the codec without a model at hand. It is
// not a model's cache, and figures measured on it are not a model's accuracy.
//
// Per head (each head has its own random stream, so heads differ), with SynthModel's
// parameters:
//   keys    pre-RoPE k_t = mu + n_t * (A z_t + e_t), then RoPE at position t: channel pairs
//           (i, i + D/2) rotate by t * 10000^(-2i/D) (the rotate_half layout of Hugging Face
//           models). mu, the same for every token, is small except on a few outlier pairs of
//           slow frequency, so those channels carry a large offset; A z_t is a low-rank
//           content signal with a decaying spectrum and uneven channel scales, larger on the
//           outlier channels; e_t small noise; n_t a log-normal per-token norm factor.
//   sink    token 0's key is mu plus a large component along a per-head sink direction on
//           the slowest pairs, several times a typical key's norm; its value is small.
//   values  v_t = m_t * (b + B y_t + c * s_t): a low-rank part B y_t with a decaying
//           spectrum, Student-t elements s_t with per-channel scales c, a small offset b, a
//           log-normal per-token scale m_t.
//   queries decode queries at position T: RoPE at T of a part along the key offset (which
//           favours recent tokens, as RoPE does) and a part in the keys' content subspace,
//           plus a part along the sink direction; attention is neither uniform nor one-hot.
// Deterministic for a seed (client/kvarnctl/rng.h).
#ifndef KVARN_CLIENT_KVARNCTL_CODEC_SYNTH_H_
#define KVARN_CLIENT_KVARNCTL_CODEC_SYNTH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/status.h"

namespace kvarn::ctl {

// The distribution's parameters; the defaults are what `codec synth` writes.
struct SynthModel {
  int key_rank = 32;                             // rank of the key content signal A z_t
  int value_rank = 32;                           // rank of B y_t
  double spectrum_decay = 0.7;                   // singular value j of A and B ~ (j + 1)^-decay
  int outlier_pairs = 3;                         // RoPE pairs of each head with a large offset
  double outlier_min = 6.0, outlier_max = 12.0;  // their magnitude
  double outlier_spread = 2.5;                   // their content varies this much more
  double key_noise = 0.2;
  double token_norm_sigma = 0.2;     // log-normal sigma of n_t
  double sink_key = 3.0;             // sink component / typical key norm
  double sink_value = 0.1;           // the sink's value scale
  int value_dof = 3;                 // Student-t degrees of freedom
  double value_tail = 0.5;           // weight of the Student-t part against B y_t
  double value_channel_sigma = 0.5;  // log-normal sigma of c
  double value_token_sigma = 0.2;    // log-normal sigma of m_t
  // Query parts, by the scores they cause, in nats: the offset part's score at distance 0
  // (RoPE makes it fall off with distance), the std over tokens of the content part's
  // score, and the sink's extra score.
  double query_position = 2.0;
  double query_content = 1.5;
  double query_sink = 8.0;
};

struct SynthOptions {
  int tokens = 2048;
  int heads = 4;
  int head_dim = 128;
  int queries = 4;  // per head
  uint64_t seed = 1;
  SynthModel model;
};

struct SynthData {
  int heads = 0, tokens = 0, head_dim = 0, queries = 0;
  std::vector<float> keys;    // [H][T][D]
  std::vector<float> values;  // [H][T][D]
  std::vector<float> q;       // [H][queries][D]
};

// REQUIRES: options validated by CheckSynthOptions.
SynthData MakeSynthetic(const SynthOptions& options);

CodecStatus CheckSynthOptions(const SynthOptions& options);

// Creates `dir` (and parents) if needed and writes k.npy, v.npy ([H, T, D]) and q.npy
// ([H, queries, D]), float32. `files` receives the paths written.
CodecStatus WriteSynthetic(const std::string& dir, const SynthData& data,
                           std::vector<std::string>* files);

// How the synthetic queries attend (exact softmax, for the summary line and tests): mean
// attention mass on token 0, and mean effective number of attended tokens exp(entropy).
struct AttentionShape {
  double sink_mass = 0;
  double effective_tokens = 0;
};
AttentionShape DescribeAttention(const SynthData& data);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_CODEC_SYNTH_H_
