/* simd_exp.h -- the vectorized exp (and the AVX2 horizontal reductions) shared by the CPU
 * attention kernels (position_softmax.c, position_attention.c). The exp: a Cody-Waite reduction
 * and the degree-5 Cephes expf polynomial, within 1e-7 relative of exp over [-87, 0]; arguments
 * below -87 give exactly 0 (their true value is below 2e-38, under a float32 sum's resolution).
 * Defined for x <= 0 only (softmax arguments).
 *
 * Include it after <immintrin.h> on x86-64; it defines PS_AVX512 / PS_AVX2 (the function
 * attributes of each path), exp512() / exp256() and hmax256() / hsum256() there, and only the
 * constants elsewhere. The build keys its cache on this header too (cbuild.source_digest hashes
 * quoted includes).
 */
#ifndef NEXUS_SIMD_EXP_H
#define NEXUS_SIMD_EXP_H

#define PS_LOG2E 1.44269504088896341f
#define PS_LN2_HI 0.693359375f
#define PS_LN2_LO -2.12194440e-4f
#define PS_P0 1.9875691500e-4f
#define PS_P1 1.3981999507e-3f
#define PS_P2 8.3334519073e-3f
#define PS_P3 4.1665795894e-2f
#define PS_P4 1.6666665459e-1f
#define PS_P5 5.0000001201e-1f
#define PS_LOW -87.0f

#if defined(__x86_64__) || defined(_M_X64)
#define PS_AVX512 __attribute__((target("avx512f")))
#define PS_AVX2 __attribute__((target("avx2,fma")))

PS_AVX512 static inline __m512 exp512(__m512 x) { /* x <= 0 */
  __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(PS_LOW), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(PS_LOW));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(PS_LOG2E)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PS_LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PS_LN2_LO), r);
  __m512 p = _mm512_set1_ps(PS_P0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PS_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PS_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PS_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PS_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PS_P5));
  __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

PS_AVX2 static inline __m256 exp256(__m256 x) { /* x <= 0 */
  __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(PS_LOW), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(PS_LOW));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(PS_LOG2E)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PS_LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PS_LN2_LO), r);
  __m256 p = _mm256_set1_ps(PS_P0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PS_P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PS_P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PS_P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PS_P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PS_P5));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

/* horizontal maximum / sum of the 8 lanes */
PS_AVX2 static inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

PS_AVX2 static inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif /* x86-64 */

#endif /* NEXUS_SIMD_EXP_H */
