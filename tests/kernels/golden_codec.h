// Runs one CPU codec over one golden-format case and preset: encode with the case's
// iterations, decode to the original frame, attend with the case's queries. Shared by the
// golden and the offset-vector conformance tests.
#ifndef KVARN_TESTS_KERNELS_GOLDEN_CODEC_H_
#define KVARN_TESTS_KERNELS_GOLDEN_CODEC_H_

#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/codec.h"
#include "tests/common/golden.h"

namespace kvarn::testing {

inline CodecOutput RunCodec(const Codec& codec, const GoldenCase& c, const Preset& preset) {
  CodecOutput out;
  const int d = c.head_dim;
  out.record.resize(preset.RecordBytes(d));
  EncodeOptions opt;
  opt.iterations = c.iterations;
  const CodecStatus enc = codec.EncodeTile(preset, d, {c.k.data(), c.v.data()}, out.record, opt);
  EXPECT_TRUE(enc.ok()) << enc.ToString();
  out.k_hat.resize(c.k.size());
  out.v_hat.resize(c.v.size());
  const CodecStatus dec =
      codec.DecodeTile(preset, d, out.record, {out.k_hat.data(), out.v_hat.data()});
  EXPECT_TRUE(dec.ok()) << dec.ToString();
  out.attention.resize(c.q.size());
  const uint8_t* tiles[] = {out.record.data()};
  SequenceView seq;
  seq.tiles = tiles;
  const CodecStatus att =
      codec.AttendDecode(preset, d, c.q.data(), c.num_queries, seq, out.attention.data());
  EXPECT_TRUE(att.ok()) << att.ToString();
  return out;
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_KERNELS_GOLDEN_CODEC_H_
