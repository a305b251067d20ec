/* skinny_gemm.h -- C = alpha * A * B^T + beta * C for a few rows of A, reading B once.
 *
 * Why: a forward over a handful of tokens (2 to SKINNY_MAX_ROWS: the drafted tokens a decoder
 * verifies in one pass, a short appended message) multiplies a few activation rows by every
 * weight matrix. OpenBLAS's sgemm packs the whole weight matrix first, so such a product costs
 * about twice one read of the weights (a probe on SmolLM2: a forward of 2 to 8 tokens took
 * 1.9-2.4x a one-token step, whose products sgemv computes). Here each weight row is read from
 * memory once and multiplied by every activation row while it is in cache.
 *
 * Contract (row-major; header-only, included by blas_shim.c):
 *   skinny_sgemm_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) computes, for i < m, j < n,
 *     c[i*ldc + j] = alpha * sum_p a[i*lda + p] * b[j*ldb + p] + beta * c[i*ldc + j]
 *   where beta == 0 writes c without reading it (uninitialized memory never reaches the result).
 *   It returns 1 when it computed the product, 0 when it declines (no AVX2 + FMA on this CPU, or
 *   a shape outside SKINNY_MAX_ROWS / SKINNY_MIN_COLS) and the caller must run sgemm.
 *   Sums run in 8 lanes (AVX2) or, for whole blocks of four rows of A on AVX-512F CPUs, 16,
 *   then across them: the result equals sgemm's up to float32 summation order, as sgemv's does.
 *
 * What it does not know: BLAS enums or column-major calls (the shim maps those), threads (it runs
 * on the caller's thread, like the decode step's sgemv).
 */
#ifndef NEXUS_SKINNY_GEMM_H
#define NEXUS_SKINNY_GEMM_H

#include <stdint.h>

#define SKINNY_MAX_ROWS 4 /* rows of A: at 8 OpenBLAS was as fast (bench/skinny_gemm.py) */
#define SKINNY_MIN_COLS 64 /* rows of B: smaller products are not worth a special path */

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define SKINNY_AVX2 __attribute__((target("avx2,fma")))
#define SKINNY_AVX512 __attribute__((target("avx512f")))
/* keep a loaded vector in its register: folding the load into every FMA that uses it (what the
 * compiler prefers) doubles the loads of the inner loops, which are load-bound */
#define SKINNY_IN_REGISTER(v) __asm__("" : "+x"(v))

SKINNY_AVX2 static inline float skinny_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x1));
  return _mm_cvtss_f32(s);
}

static inline void skinny_store(float *c, float alpha, float dot, float beta) {
  *c = beta == 0.0f ? alpha * dot : alpha * dot + beta * *c;
}

/* two rows of A against four rows of B: eight dot products, each weight vector loaded once */
SKINNY_AVX2 static void skinny_2x4(int k, float alpha, const float *a0, const float *a1,
                                   const float *b, int64_t ldb, float beta, float *c0,
                                   float *c1) {
  const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
  __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s03 = s00;
  __m256 s10 = s00, s11 = s00, s12 = s00, s13 = s00;
  int p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 x0 = _mm256_loadu_ps(a0 + p), x1 = _mm256_loadu_ps(a1 + p);
    __m256 w = _mm256_loadu_ps(b0 + p); SKINNY_IN_REGISTER(w);
    s00 = _mm256_fmadd_ps(x0, w, s00);
    s10 = _mm256_fmadd_ps(x1, w, s10);
    w = _mm256_loadu_ps(b1 + p); SKINNY_IN_REGISTER(w);
    s01 = _mm256_fmadd_ps(x0, w, s01);
    s11 = _mm256_fmadd_ps(x1, w, s11);
    w = _mm256_loadu_ps(b2 + p); SKINNY_IN_REGISTER(w);
    s02 = _mm256_fmadd_ps(x0, w, s02);
    s12 = _mm256_fmadd_ps(x1, w, s12);
    w = _mm256_loadu_ps(b3 + p); SKINNY_IN_REGISTER(w);
    s03 = _mm256_fmadd_ps(x0, w, s03);
    s13 = _mm256_fmadd_ps(x1, w, s13);
  }
  float d[2][4] = {{skinny_hsum(s00), skinny_hsum(s01), skinny_hsum(s02), skinny_hsum(s03)},
                   {skinny_hsum(s10), skinny_hsum(s11), skinny_hsum(s12), skinny_hsum(s13)}};
  for (; p < k; ++p) {
    for (int j = 0; j < 4; ++j) {
      d[0][j] += a0[p] * b[j * ldb + p];
      d[1][j] += a1[p] * b[j * ldb + p];
    }
  }
  for (int j = 0; j < 4; ++j) {
    skinny_store(c0 + j, alpha, d[0][j], beta);
    skinny_store(c1 + j, alpha, d[1][j], beta);
  }
}

/* one row of A against one row of B (the edges: an odd last row of A, the last rows of B) */
SKINNY_AVX2 static float skinny_dot(int k, const float *a, const float *b) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int p = 0;
  for (; p + 16 <= k; p += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + p), _mm256_loadu_ps(b + p), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + p + 8), _mm256_loadu_ps(b + p + 8), s1);
  }
  for (; p + 8 <= k; p += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + p), _mm256_loadu_ps(b + p), s0);
  float d = skinny_hsum(_mm256_add_ps(s0, s1));
  for (; p < k; ++p) d += a[p] * b[p];
  return d;
}

/* rows [i0, m) of A against every row of B, on AVX2 */
SKINNY_AVX2 static void skinny_rows_avx2(int i0, int m, int n, int k, float alpha,
                                         const float *a, int64_t lda, const float *b, int64_t ldb,
                                         float beta, float *c, int64_t ldc) {
  int j = 0;
  for (; j + 4 <= n; j += 4) { /* four weight rows stay in cache while every A row passes */
    const float *bj = b + (int64_t)j * ldb;
    int i = i0;
    for (; i + 2 <= m; i += 2)
      skinny_2x4(k, alpha, a + i * lda, a + (i + 1) * lda, bj, ldb, beta, c + i * ldc + j,
                 c + (i + 1) * ldc + j);
    if (i < m)
      for (int q = 0; q < 4; ++q)
        skinny_store(c + i * ldc + j + q, alpha, skinny_dot(k, a + i * lda, bj + q * ldb), beta);
  }
  for (; j < n; ++j)
    for (int i = i0; i < m; ++i)
      skinny_store(c + i * ldc + j, alpha, skinny_dot(k, a + i * lda, b + (int64_t)j * ldb),
                   beta);
}

/* four rows of A against four rows of B, 16 lanes: sixteen dot products per pass over k */
SKINNY_AVX512 static void skinny_4x4(int k, float alpha, const float *a, int64_t lda,
                                     const float *b, int64_t ldb, float beta, float *c,
                                     int64_t ldc) {
  __m512 s[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) s[i][j] = _mm512_setzero_ps();
  for (int p = 0; p < k; p += 16) {
    __mmask16 lanes = k - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - p)) - 1u);
    __m512 x0 = _mm512_maskz_loadu_ps(lanes, a + p);
    __m512 x1 = _mm512_maskz_loadu_ps(lanes, a + lda + p);
    __m512 x2 = _mm512_maskz_loadu_ps(lanes, a + 2 * lda + p);
    __m512 x3 = _mm512_maskz_loadu_ps(lanes, a + 3 * lda + p);
    for (int j = 0; j < 4; ++j) {
      __m512 w = _mm512_maskz_loadu_ps(lanes, b + j * ldb + p);
      SKINNY_IN_REGISTER(w);
      s[0][j] = _mm512_fmadd_ps(x0, w, s[0][j]);
      s[1][j] = _mm512_fmadd_ps(x1, w, s[1][j]);
      s[2][j] = _mm512_fmadd_ps(x2, w, s[2][j]);
      s[3][j] = _mm512_fmadd_ps(x3, w, s[3][j]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      skinny_store(c + i * ldc + j, alpha, _mm512_reduce_add_ps(s[i][j]), beta);
}

/* whole blocks of four A rows on AVX-512, the rest of A's rows and of B's on AVX2 */
SKINNY_AVX512 static void skinny_nt_avx512(int m, int n, int k, float alpha, const float *a,
                                           int64_t lda, const float *b, int64_t ldb, float beta,
                                           float *c, int64_t ldc) {
  int m4 = m - m % 4, n4 = n - n % 4;
  for (int j = 0; j < n4; j += 4)
    for (int i = 0; i < m4; i += 4)
      skinny_4x4(k, alpha, a + i * lda, lda, b + (int64_t)j * ldb, ldb, beta, c + i * ldc + j,
                 ldc);
  if (n4 < n) /* B's last rows against A's whole blocks */
    skinny_rows_avx2(0, m4, n - n4, k, alpha, a, lda, b + (int64_t)n4 * ldb, ldb, beta, c + n4,
                     ldc);
  if (m4 < m)
    skinny_rows_avx2(m4, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int skinny_sgemm_nt(int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc) {
  if (m < 2 || m > SKINNY_MAX_ROWS || n < SKINNY_MIN_COLS || k < 1) return 0;
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0;
  if (m >= 4 && __builtin_cpu_supports("avx512f"))
    skinny_nt_avx512(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    skinny_rows_avx2(0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return 1;
}

#else /* not x86-64: always decline */
static int skinny_sgemm_nt(int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc) {
  (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta;
  (void)c, (void)ldc;
  return 0;
}
#endif

#endif /* NEXUS_SKINNY_GEMM_H */
