/* Compares SLEEF's AVX-512 exp/log (what torch's CPU kernels call on a CPU whose capability is
 * AVX512) with its AVX2 ones (what they call at capability AVX2) on every float the codec
 * feeds them: exp on [-0.3, 10], log on [1e-3, 1e3]. docs/codec_arithmetic.md asks whether
 * the authors' exp could be the AVX-512 one; this answers it on a machine with AVX-512F.
 *
 * Not part of the build: it needs an AVX-512 CPU and Debian's libsleef3 (a dependency of
 * python3-torch; no header is needed, the four prototypes are below).
 *
 *   gcc -O2 -mavx512f -mfma tests/golden/sleef_isa_compare.c -o /tmp/sleef_isa_compare \
 *       /usr/lib/x86_64-linux-gnu/libsleef.so.3 -lm && /tmp/sleef_isa_compare
 *
 * Prints, per function, the inputs tried, how many differ between the two ISAs, and how many
 * of the AVX-512 results differ from the double result rounded to float (the codec's ExpF /
 * LogF). Exit status 1 if the ISAs differ anywhere. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

__m512 Sleef_expf16_u10avx512f(__m512);
__m512 Sleef_logf16_u10avx512f(__m512);
__m256 Sleef_expf8_u10avx2(__m256);
__m256 Sleef_logf8_u10avx2(__m256);

static uint32_t Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Every float in [lo, hi], 16 at a time. Returns the number of ISA differences. */
static uint64_t Compare(const char* name, float lo, float hi, int is_exp) {
  float in[16] __attribute__((aligned(64)));
  float wide[16] __attribute__((aligned(64)));
  float narrow[16] __attribute__((aligned(64)));
  uint64_t n = 0, isa_diff = 0, rounded_diff = 0;
  int shown = 0;
  float x = lo;
  while (x <= hi) {
    int k = 0;
    for (; k < 16 && x <= hi; ++k, x = nextafterf(x, INFINITY)) in[k] = x;
    const int valid = k;
    for (; k < 16; ++k) in[k] = in[0];
    const __m512 v = _mm512_load_ps(in);
    const __m256 v0 = _mm256_load_ps(in), v1 = _mm256_load_ps(in + 8);
    if (is_exp) {
      _mm512_store_ps(wide, Sleef_expf16_u10avx512f(v));
      _mm256_store_ps(narrow, Sleef_expf8_u10avx2(v0));
      _mm256_store_ps(narrow + 8, Sleef_expf8_u10avx2(v1));
    } else {
      _mm512_store_ps(wide, Sleef_logf16_u10avx512f(v));
      _mm256_store_ps(narrow, Sleef_logf8_u10avx2(v0));
      _mm256_store_ps(narrow + 8, Sleef_logf8_u10avx2(v1));
    }
    for (k = 0; k < valid; ++k) {
      ++n;
      const float rounded =
          is_exp ? (float)exp((double)in[k]) : (float)log((double)in[k]);
      if (Bits(wide[k]) != Bits(narrow[k])) {
        ++isa_diff;
        if (shown++ < 5) {
          printf("  %s(%a): avx512f %a, avx2 %a\n", name, in[k], wide[k], narrow[k]);
        }
      }
      if (Bits(wide[k]) != Bits(rounded)) ++rounded_diff;
    }
  }
  printf("%s on [%g, %g]: %llu floats; AVX-512F vs AVX2 differ on %llu; AVX-512F vs the "
         "rounded double on %llu\n",
         name, lo, hi, (unsigned long long)n, (unsigned long long)isa_diff,
         (unsigned long long)rounded_diff);
  return isa_diff;
}

int main(void) {
  if (!__builtin_cpu_supports("avx512f")) {
    fprintf(stderr, "sleef_isa_compare: this CPU has no AVX-512F\n");
    return 2;
  }
  const uint64_t d = Compare("exp", -0.3f, 10.0f, 1) + Compare("log", 1e-3f, 1e3f, 0);
  return d != 0;
}
