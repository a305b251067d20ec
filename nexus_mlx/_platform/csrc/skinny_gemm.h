/* skinny_gemm.h -- C = alpha * A * B^T + beta * C for a few rows of A, reading B once.
 *
 * Why: a forward over a handful of tokens (2 to SKINNY_MAX_ROWS: the drafted tokens a decoder
 * verifies in one pass, a short appended message) multiplies a few activation rows by every
 * weight matrix. OpenBLAS's sgemm packs the whole weight matrix first, so such a product costs
 * about twice one read of the weights (a probe on SmolLM2: a forward of 2 to 8 tokens took
 * 1.9-2.4x a one-token step, whose products sgemv computes). Here each weight row is read from
 * memory once and multiplied by every activation row while it is in cache.
 *
 * Contract (row-major; header-only, included by blas_shim.c after native_rt.h, whose thread
 * loop it uses: the build hashes only headers the .c file includes itself):
 *   skinny_sgemm_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) computes, for i < m, j < n,
 *     c[i*ldc + j] = alpha * sum_p a[i*lda + p] * b[j*ldb + p] + beta * c[i*ldc + j]
 *   where beta == 0 writes c without reading it (uninitialized memory never reaches the result).
 *   It returns 1 when it computed the product, 0 when it declines and the caller must run
 *   sgemm: fewer than 2 or more than SKINNY_MAX_ROWS rows of A (SKINNY_MAX_ROWS_AVX2 on a CPU
 *   with AVX2 + FMA but no AVX-512F), fewer than SKINNY_MIN_COLS rows of B, or neither SIMD set.
 *   Sums run in 16 lanes (AVX-512F: 4 x 4 blocks, summed across lanes by one shuffle tree per
 *   block) or 8 (AVX2: 2 x 4 blocks), then across them: the result equals sgemm's up to float32
 *   summation order, as sgemv's does.
 *
 * Prefetch: the AVX-512F blocks prefetch the weight rows SKINNY_AHEAD rows on, one cache line per
 * row per step, while they sum the current ones. In a forward the weights come from memory, not
 * cache, and the hardware prefetchers did not keep up with four interleaved rows: on a 2-core
 * AMD Zen 5, 2-6-token SmolLM2 forwards ran 0.62-0.69x OpenBLAS's speed without it and
 * 1.16-1.35x with it (bench/skinny_gemm.py, results/skinny_gemm_zen5*.json).
 *
 * Threads: B's rows are shared, by groups of four, over the caller's thread and up to
 * SKINNY_MAX_THREADS - 1 more (no more than the CPUs online), started per call, when B has at
 * least SKINNY_PARALLEL_MIN elements. Why: these products stream the weights from memory, and
 * one core does not draw the memory bandwidth two do; OpenBLAS, which it replaces, runs on every
 * core (bench/skinny_gemm.py measured the kernel on one thread slower than OpenBLAS on a 2-core
 * machine, 0.7-0.95x, where the same kernel had been 1.6-2.9x faster on another).
 *
 * What it does not know: BLAS enums or column-major calls (the shim maps those).
 */
#ifndef NEXUS_SKINNY_GEMM_H
#define NEXUS_SKINNY_GEMM_H

#include <stdint.h>
#include <unistd.h>

#define SKINNY_MAX_ROWS 6 /* rows of A on AVX-512F (bench/skinny_gemm.py: at 8 no faster) */
#define SKINNY_MAX_ROWS_AVX2 4 /* rows of A on AVX2 + FMA only: 8 lanes, 2 x 4 blocks */
#define SKINNY_MIN_COLS 64 /* rows of B: smaller products are not worth a special path */
#define SKINNY_MAX_THREADS 4 /* the caller's thread and up to 3 more share B's rows */
#define SKINNY_PARALLEL_MIN (1 << 16) /* elements of B below which one thread does it all */
#ifndef SKINNY_AHEAD
#define SKINNY_AHEAD 8 /* rows of B ahead that the AVX-512 blocks prefetch */
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define SKINNY_AVX2 __attribute__((target("avx2,fma")))
#define SKINNY_AVX512 __attribute__((target("avx512f")))
/* keep a loaded vector in its register: folding the load into every FMA that uses it (what the
 * compiler prefers) doubles the loads of the inner loops, which are load-bound */
#define SKINNY_IN_REGISTER(v) __asm__("" : "+x"(v))
#define SKINNY_IN_ZMM(v) __asm__("" : "+v"(v)) /* the same, any of the 32 AVX-512 registers */

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

/* Sixteen 16-lane accumulators acc[4 * j + i] (B row j, A row i) folded into one vector whose
 * lane 4 * i + j is the sum of acc[4 * j + i]'s lanes: row i of the 4 x 4 block is lanes
 * 4i..4i+3. Shuffles and adds in a tree, 3 + 3 + 9 of each instead of 16 separate reductions. */
SKINNY_AVX512 static inline __m512 skinny_fold_pair(__m512 a, __m512 b) {
  /* 128-bit chunks: [a0 + a2, a1 + a3, b0 + b2, b1 + b3] */
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

SKINNY_AVX512 static inline __m512 skinny_fold_quad(const __m512 *acc) {
  /* chunk q holds a 4-lane partial sum of acc[q] */
  __m512 lo = skinny_fold_pair(acc[0], acc[1]), hi = skinny_fold_pair(acc[2], acc[3]);
  return _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, 0x88), _mm512_shuffle_f32x4(lo, hi, 0xDD));
}

SKINNY_AVX512 static inline __m512 skinny_fold16(const __m512 *acc) {
  __m512 x0 = skinny_fold_quad(acc), x1 = skinny_fold_quad(acc + 4);
  __m512 x2 = skinny_fold_quad(acc + 8), x3 = skinny_fold_quad(acc + 12);
  /* within each chunk, a 4 x 4 transpose-and-add over x0..x3 */
  __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(x0, x1), _mm512_unpackhi_ps(x0, x1));
  __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(x2, x3), _mm512_unpackhi_ps(x2, x3));
  __m512d d01 = _mm512_castps_pd(s01), d23 = _mm512_castps_pd(s23);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d01, d23)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(d01, d23)));
}

/* rows a[0..3] of A against rows b[0..3] of B, 16 lanes: out[4 * i + j] = dot(a[i], b[j]) */
SKINNY_AVX512 static void skinny_block4(int k, const float *const *a, const float *const *b,
                                        const float *const *ahead, float *out) {
  __m512 acc[16];
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  for (int p = 0; p < k; p += 16) {
    __mmask16 lanes = k - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - p)) - 1u);
    __m512 x0 = _mm512_maskz_loadu_ps(lanes, a[0] + p);
    __m512 x1 = _mm512_maskz_loadu_ps(lanes, a[1] + p);
    __m512 x2 = _mm512_maskz_loadu_ps(lanes, a[2] + p);
    __m512 x3 = _mm512_maskz_loadu_ps(lanes, a[3] + p);
    for (int j = 0; j < 4; ++j) {
      _mm_prefetch((const char *)(ahead[j] + p), _MM_HINT_T0);
      __m512 w = _mm512_maskz_loadu_ps(lanes, b[j] + p);
      SKINNY_IN_ZMM(w);
      acc[4 * j + 0] = _mm512_fmadd_ps(x0, w, acc[4 * j + 0]);
      acc[4 * j + 1] = _mm512_fmadd_ps(x1, w, acc[4 * j + 1]);
      acc[4 * j + 2] = _mm512_fmadd_ps(x2, w, acc[4 * j + 2]);
      acc[4 * j + 3] = _mm512_fmadd_ps(x3, w, acc[4 * j + 3]);
    }
  }
  _mm512_storeu_ps(out, skinny_fold16(acc));
}

/* Every row of A against every row of B in 4 x 4 blocks. A short last block of A (or of B)
 * repeats its last row, whose sums are computed and not stored: each weight row is still read
 * once per block of four A rows, and B's four rows stay in cache while the A blocks pass. */
SKINNY_AVX512 static void skinny_nt_avx512(int m, int n, int k, float alpha, const float *a,
                                           int64_t lda, const float *b, int64_t ldb, float beta,
                                           float *c, int64_t ldc) {
  float out[16];
  const float *brow[4], *arow[4], *ahead[4];
  for (int j = 0; j < n; j += 4) {
    int nj = n - j < 4 ? n - j : 4;
    for (int q = 0; q < 4; ++q) brow[q] = b + (int64_t)(j + (q < nj ? q : nj - 1)) * ldb;
    for (int q = 0; q < 4; ++q) /* the rows two blocks on, read while these are summed */
      ahead[q] = b + (int64_t)(j + SKINNY_AHEAD + q < n ? j + SKINNY_AHEAD + q : n - 1) * ldb;
    for (int i = 0; i < m; i += 4) {
      int mi = m - i < 4 ? m - i : 4;
      for (int q = 0; q < 4; ++q) arow[q] = a + (int64_t)(i + (q < mi ? q : mi - 1)) * lda;
      skinny_block4(k, arow, brow, ahead, out);
      for (int r = 0; r < mi; ++r)
        for (int q = 0; q < nj; ++q)
          skinny_store(c + (int64_t)(i + r) * ldc + j + q, alpha, out[4 * r + q], beta);
    }
  }
}

/* One call's arguments; its work is shared out by groups of four rows of B. */
typedef struct {
  int m, n, k, wide;
  float alpha, beta;
  const float *a, *b;
  int64_t lda, ldb, ldc;
  float *c;
} skinny_call;

static void skinny_groups(const void *ctx, int64_t g0, int64_t g1) {
  const skinny_call *x = (const skinny_call *)ctx;
  int j0 = (int)(4 * g0), j1 = (int)(4 * g1) < x->n ? (int)(4 * g1) : x->n;
  const float *b = x->b + (int64_t)j0 * x->ldb;
  if (x->wide)
    skinny_nt_avx512(x->m, j1 - j0, x->k, x->alpha, x->a, x->lda, b, x->ldb, x->beta, x->c + j0,
                     x->ldc);
  else
    skinny_rows_avx2(0, x->m, j1 - j0, x->k, x->alpha, x->a, x->lda, b, x->ldb, x->beta,
                     x->c + j0, x->ldc);
}

static int skinny_threads(void) {
  static int cached = 0;
  return nexus_cpus_capped(&cached, SKINNY_MAX_THREADS);
}

static int skinny_sgemm_nt(int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc) {
  if (m < 2 || m > SKINNY_MAX_ROWS || n < SKINNY_MIN_COLS || k < 1) return 0;
  int wide = __builtin_cpu_supports("avx512f");
  if (!wide && (m > SKINNY_MAX_ROWS_AVX2 || !(__builtin_cpu_supports("avx2") &&
                                               __builtin_cpu_supports("fma"))))
    return 0;
  skinny_call call = {m, n, k, wide, alpha, beta, a, b, lda, ldb, ldc, c};
  int64_t groups = (n + 3) / 4;
  nexus_parallel_rows(skinny_groups, &call, groups, skinny_threads(),
                      (int64_t)n * k >= SKINNY_PARALLEL_MIN);
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
