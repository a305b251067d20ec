/* twin_gemm.h -- few-row products against a weight matrix read from its compact twin.
 *
 * Why: a decode step multiplies one activation row by every weight matrix, and on the CPU that
 * product streams the float32 weights from memory: its time is the bytes it reads. Weights
 * loaded from a quantized file hold few distinct values per block (a Q4/Q5/Q8 block is
 * scale * integer + offset), so each float32 weight is exactly rebuilt from a one-byte code and
 * its block's scale and offset: 1.25-1.5 bytes a weight instead of 4. The twin is built and
 * checked by the caller (nexus_mlx/kernels/weight_twins.py: every weight rebuilt bit for bit, or
 * no twin); here a product whose weight matrix has a registered twin reads the twin instead.
 *
 * Contract (row-major; header-only, included by blas_shim.c after native_rt.h):
 *   - twin_register(src, n, k, block, codes, scale, offset) records that the float32 matrix at
 *     src (n rows of k, row stride k) equals, element for element,
 *       w[j*k + p] = fmaf((float)codes[j*k + p], scale[j*(k/block) + p/block],
 *                         offset[j*(k/block) + p/block])
 *     (block 16 or 32, dividing k). Returns 1, or 0 when the table is full or the arguments are
 *     not such a matrix. A second registration of the same (src, n, k) replaces the first.
 *     The caller keeps src, codes, scale and offset alive until twin_unregister(src, n, k).
 *   - twin_sgemm_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) computes, for i < m, j < n,
 *       c[i*ldc + j] = alpha * sum_p a[i*lda + p] * w[j*k + p] + beta * c[i*ldc + j]
 *     from the twin of b when (b, n, k) is registered, ldb == k and 1 <= m <= TWIN_MAX_ROWS;
 *     beta == 0 writes c without reading it. It returns 1 when it computed the product, 0 when
 *     it declines (no twin, another shape, a CPU without AVX-512F or AVX2 + FMA) and the caller
 *     runs sgemm. The result equals the float32 product up to summation order: the weights are
 *     the same numbers, rebuilt with one fused multiply-add each.
 *   - twin_set_avx2_only(1) makes products take the AVX2 path even where AVX-512F runs (tests
 *     check both paths on one machine); 0 restores the choice by CPU.
 *   - Threads: when b has at least TWIN_PARALLEL_MIN elements (one core does not draw the
 *     bandwidth two do), the caller's thread and one persistent helper thread share its rows by
 *     groups of four (twin_parallel_rows below); the encoder shares rows over up to
 *     TWIN_MAX_THREADS started threads. Registration takes a write lock; a product holds a read
 *     lock while it computes, so a twin is never unregistered (and freed by its owner) under a
 *     product reading it. A fork()ed child resets the helper and the lock.
 *
 * What it does not know: BLAS enums or column-major calls (the shim maps those), how a twin is
 * built, or which model the matrices belong to.
 */
#ifndef NEXUS_TWIN_GEMM_H
#define NEXUS_TWIN_GEMM_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define TWIN_MAX_ROWS 4 /* rows of A a product may have: a decode step, a few drafted tokens */
#define TWIN_CAPACITY 8192 /* registered matrices (a 80-layer model with views: ~1,000) */
#define TWIN_MAX_THREADS 4
#define TWIN_PARALLEL_MIN (1 << 16)
#define TWIN_AHEAD 8 /* rows of codes ahead that the AVX-512 loop prefetches */

typedef struct {
  const float *src; /* the float32 matrix this twin stands for (the lookup key, with n and k) */
  int n, k, block;
  const uint8_t *codes; /* (n, k) */
  const float *scale, *offset; /* (n, k / block) */
} twin_entry;

static twin_entry twin_table[TWIN_CAPACITY];
static int twin_avx2_only = 0; /* tests: run the AVX2 path on an AVX-512 CPU too */
static int twin_used = 0;
static pthread_rwlock_t twin_lock = PTHREAD_RWLOCK_INITIALIZER;

/* index of (src, n, k) in the table, or -1; the caller holds the lock */
static int twin_find(const float *src, int n, int k) {
  for (int i = 0; i < twin_used; ++i)
    if (twin_table[i].src == src && twin_table[i].n == n && twin_table[i].k == k) return i;
  return -1;
}

static void twin_watch_forks(void);

static int twin_register(const float *src, int n, int k, int block, const uint8_t *codes,
                         const float *scale, const float *offset) {
  static pthread_once_t watching = PTHREAD_ONCE_INIT;
  pthread_once(&watching, twin_watch_forks);
  if (src == NULL || codes == NULL || scale == NULL || offset == NULL || n < 1 || k < 1 ||
      (block != 16 && block != 32) || k % block != 0)
    return 0;
  twin_entry entry = {src, n, k, block, codes, scale, offset};
  int ok = 1;
  pthread_rwlock_wrlock(&twin_lock);
  int at = twin_find(src, n, k);
  if (at >= 0)
    twin_table[at] = entry;
  else if (twin_used < TWIN_CAPACITY)
    twin_table[__atomic_fetch_add(&twin_used, 1, __ATOMIC_RELAXED)] = entry;
  else
    ok = 0;
  pthread_rwlock_unlock(&twin_lock);
  return ok;
}

static int twin_unregister(const float *src, int n, int k) {
  pthread_rwlock_wrlock(&twin_lock);
  int at = twin_find(src, n, k);
  if (at >= 0) twin_table[at] = twin_table[__atomic_sub_fetch(&twin_used, 1, __ATOMIC_RELAXED)];
  pthread_rwlock_unlock(&twin_lock);
  return at >= 0;
}

static void twin_set_avx2_only(int on) {
  __atomic_store_n(&twin_avx2_only, on ? 1 : 0, __ATOMIC_RELAXED);
}

static int twin_count(void) {
  pthread_rwlock_rdlock(&twin_lock);
  int n = twin_used;
  pthread_rwlock_unlock(&twin_lock);
  return n;
}

/* ------------------------------------------------------------------ building a twin
 * twin_encode(src, n, k, block, codes, scale, offset) fills the twin of the float32 matrix src
 * (n x k, row stride k) for blocks of `block` (16 or 32) and returns how many blocks are not an
 * exact grid (0: the twin rebuilds src exactly), or -1 when it cannot run (bad arguments, no FMA).
 * Per block: offset = its smallest value; the step is the smallest gap above it divided by
 * 1..TWIN_FIRST_DIVISORS, or else the smallest gap between its sorted values divided by
 * 1..TWIN_DIVISORS, or else the greatest common divisor of its distances above the offset (a
 * sparse block: a few values, far apart); codes = rint((w - offset) / step); the first step
 * whose codes fit a byte and rebuild every weight with fmaf wins. It stops at the first block
 * that is no grid (the matrix then has no twin for this block size), so its count is then 1 or
 * a few, not all of them.
 * nexus_mlx/kernels/weight_twins.py holds the same algorithm in numpy as its specification. */
#define TWIN_FIRST_DIVISORS 12 /* tried on the gap above the offset (cheap: no sort) */
#define TWIN_DIVISORS 12 /* tried on the smallest gap between sorted values */
#define TWIN_GCD_STEPS 64 /* Euclid steps per value before the gcd stage gives up */
#if defined(__x86_64__) || defined(_M_X64)
#define TWIN_FMA __attribute__((target("fma"))) /* fmaf inline; twin_encode checks the CPU */
#else
#define TWIN_FMA
#endif

TWIN_FMA static int twin_try_step(const float *w, int block, float lo, float step,
                                  uint8_t *codes) {
  if (!(step > 0.0f) || !isfinite(step)) return 0;
  for (int p = 0; p < block; ++p) {
    float level = rintf((w[p] - lo) / step);
    if (!(level >= 0.0f && level < 256.0f) || fmaf(level, step, lo) != w[p]) return 0;
    codes[p] = (uint8_t)level;
  }
  return 1;
}

/* the smallest positive gap between the block's sorted values (1 when all are equal) */
static float twin_min_gap(const float *w, int block) {
  float v[32];
  for (int p = 0; p < block; ++p) { /* insertion sort: blocks are 16 or 32 values */
    float x = w[p];
    int q = p;
    for (; q > 0 && v[q - 1] > x; --q) v[q] = v[q - 1];
    v[q] = x;
  }
  float gap = INFINITY;
  for (int p = 1; p < block; ++p)
    if (v[p] - v[p - 1] > 0.0f && v[p] - v[p - 1] < gap) gap = v[p] - v[p - 1];
  return isfinite(gap) ? gap : 1.0f;
}

/* the greatest common divisor of the block's distances above lo, by Euclid's algorithm on
 * floats (fmodf is exact, so exact multiples of a step give that step; other values give a tiny
 * or no step, which twin_try_step then rejects); 0 when it does not settle */
static float twin_gap_gcd(const float *w, int block, float lo) {
  float g = 0.0f;
  for (int p = 0; p < block; ++p) {
    float a = g, b = w[p] - lo;
    for (int i = 0; b != 0.0f; ++i) {
      if (i == TWIN_GCD_STEPS) return 0.0f;
      float r = fmodf(a, b);
      a = b;
      b = r;
    }
    g = a;
  }
  return g;
}

TWIN_FMA static int twin_encode_block(const float *w, int block, uint8_t *codes, float *scale,
                                      float *offset) {
  float lo = w[0], first = INFINITY;
  for (int p = 1; p < block; ++p) lo = w[p] < lo ? w[p] : lo;
  if (!isfinite(lo)) return 0;
  for (int p = 0; p < block; ++p)
    if (w[p] > lo && w[p] - lo < first) first = w[p] - lo;
  if (!isfinite(first)) first = 1.0f; /* one value (or an infinity, which rebuilds nothing) */
  float gaps[3] = {first, 0.0f, 0.0f};
  for (int g = 0; g < 3; ++g) {
    if (g == 1) gaps[1] = twin_min_gap(w, block);
    if (g == 2) gaps[2] = twin_gap_gcd(w, block, lo);
    int divisors = g == 0 ? TWIN_FIRST_DIVISORS : g == 1 ? TWIN_DIVISORS : 1;
    for (int d = 1; d <= divisors; ++d) {
      float step = gaps[g] / (float)d;
      if (twin_try_step(w, block, lo, step, codes)) {
        *scale = step;
        *offset = lo;
        return 1;
      }
    }
  }
  return 0;
}

typedef struct {
  const float *src;
  int k, block;
  uint8_t *codes;
  float *scale, *offset;
  int64_t failed;
} twin_encoding;

TWIN_FMA static void twin_encode_rows(const void *ctx, int64_t r0, int64_t r1) {
  twin_encoding *e = (twin_encoding *)ctx; /* each share writes its own rows */
  const int nb = e->k / e->block;
  for (int64_t r = r0; r < r1 && !__atomic_load_n(&e->failed, __ATOMIC_RELAXED); ++r)
    for (int b = 0; b < nb; ++b) {
      int64_t at = r * nb + b;
      if (!twin_encode_block(e->src + at * e->block, e->block, e->codes + at * e->block,
                             e->scale + at, e->offset + at)) {
        __atomic_fetch_add(&e->failed, 1, __ATOMIC_RELAXED);
        return;
      }
    }
}

static int64_t twin_encode(const float *src, int64_t n, int k, int block, uint8_t *codes,
                           float *scale, float *offset);

static inline void twin_store(float *c, float alpha, float dot, float beta) {
  *c = beta == 0.0f ? alpha * dot : alpha * dot + beta * *c;
}

/* One call's arguments; its work is shared out by groups of four rows of the twin. */
typedef struct {
  twin_entry t;
  int m, wide;
  float alpha, beta;
  const float *a;
  int64_t lda, ldc;
  float *c;
} twin_call;

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define TWIN_AVX2 __attribute__((target("avx2,fma")))
#define TWIN_AVX512 __attribute__((target("avx512f")))

/* rows [j0, j1) of the twin against M rows of A (M = the call's m, a constant once inlined), 16
 * lanes: four weight rows at a time, each block's scale and offset broadcast once, each chunk
 * of 16 codes widened, rebuilt with one FMA and multiplied into every A row while in registers
 * (M x 4 accumulators), the rows TWIN_AHEAD on prefetched a cache line at a time. */
TWIN_AVX512 static inline __attribute__((always_inline)) void twin_tile_avx512(
    const twin_call *x, int j0, int j1, const int M) {
  const twin_entry *t = &x->t;
  const int k = t->k, nb = k / t->block, chunks = t->block / 16;
  for (int j = j0; j < j1; j += 4) {
    int nj = j1 - j < 4 ? j1 - j : 4;
    const uint8_t *code[4];
    const float *sc[4], *of[4];
    for (int q = 0; q < 4; ++q) { /* a short last group repeats its last row, not stored */
      int64_t row = j + (q < nj ? q : nj - 1);
      code[q] = t->codes + row * k;
      sc[q] = t->scale + row * nb;
      of[q] = t->offset + row * nb;
    }
    int ahead_row = j + TWIN_AHEAD + 3 < t->n ? j + TWIN_AHEAD : t->n - 4 > 0 ? t->n - 4 : 0;
    const uint8_t *ahead = t->codes + (int64_t)ahead_row * k;
    __m512 acc[TWIN_MAX_ROWS][4];
    for (int i = 0; i < M; ++i)
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_setzero_ps();
    for (int b = 0, p = 0; b < nb; ++b) {
      __m512 scale[4], offset[4];
      for (int q = 0; q < 4; ++q) {
        scale[q] = _mm512_set1_ps(sc[q][b]);
        offset[q] = _mm512_set1_ps(of[q][b]);
      }
      for (int h = 0; h < chunks; ++h, p += 16) {
        if ((p & 63) == 0)
          for (int q = 0; q < 4 && ahead_row + q < t->n; ++q)
            _mm_prefetch((const char *)(ahead + (int64_t)q * k + p), _MM_HINT_T0);
        __m512 xs[TWIN_MAX_ROWS];
        for (int i = 0; i < M; ++i) xs[i] = _mm512_loadu_ps(x->a + i * x->lda + p);
        for (int q = 0; q < 4; ++q) {
          __m128i bytes = _mm_loadu_si128((const __m128i *)(code[q] + p));
          __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), scale[q],
                                     offset[q]);
          for (int i = 0; i < M; ++i) acc[i][q] = _mm512_fmadd_ps(xs[i], w, acc[i][q]);
        }
      }
    }
    for (int i = 0; i < M; ++i)
      for (int q = 0; q < nj; ++q)
        twin_store(x->c + i * x->ldc + j + q, x->alpha, _mm512_reduce_add_ps(acc[i][q]),
                   x->beta);
  }
}

/* The same for one row of A (a decode step), written out: four named accumulators, which the
 * compiler keeps in registers (the tile above, inlined with M = 1, ran decode 1.2x slower). */
TWIN_AVX512 static void twin_rows1_avx512(const twin_call *x, int j0, int j1) {
  const twin_entry *t = &x->t;
  const int k = t->k, nb = k / t->block, chunks = t->block / 16;
  const float *a = x->a;
  for (int j = j0; j < j1; j += 4) {
    int nj = j1 - j < 4 ? j1 - j : 4;
    int r0 = j, r1 = j + (nj > 1), r2 = j + (nj > 2 ? 2 : nj - 1), r3 = j + nj - 1;
    const uint8_t *c0 = t->codes + (int64_t)r0 * k, *c1 = t->codes + (int64_t)r1 * k;
    const uint8_t *c2 = t->codes + (int64_t)r2 * k, *c3 = t->codes + (int64_t)r3 * k;
    const float *s0 = t->scale + (int64_t)r0 * nb, *s1 = t->scale + (int64_t)r1 * nb;
    const float *s2 = t->scale + (int64_t)r2 * nb, *s3 = t->scale + (int64_t)r3 * nb;
    const float *o0 = t->offset + (int64_t)r0 * nb, *o1 = t->offset + (int64_t)r1 * nb;
    const float *o2 = t->offset + (int64_t)r2 * nb, *o3 = t->offset + (int64_t)r3 * nb;
    int ahead_row = j + TWIN_AHEAD + 3 < t->n ? j + TWIN_AHEAD : t->n - 4 > 0 ? t->n - 4 : 0;
    const uint8_t *ahead = t->codes + (int64_t)ahead_row * k;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int b = 0, p = 0; b < nb; ++b) {
      __m512 sc0 = _mm512_set1_ps(s0[b]), of0 = _mm512_set1_ps(o0[b]);
      __m512 sc1 = _mm512_set1_ps(s1[b]), of1 = _mm512_set1_ps(o1[b]);
      __m512 sc2 = _mm512_set1_ps(s2[b]), of2 = _mm512_set1_ps(o2[b]);
      __m512 sc3 = _mm512_set1_ps(s3[b]), of3 = _mm512_set1_ps(o3[b]);
      for (int h = 0; h < chunks; ++h, p += 16) {
        if ((p & 63) == 0)
          for (int q = 0; q < 4 && ahead_row + q < t->n; ++q)
            _mm_prefetch((const char *)(ahead + (int64_t)q * k + p), _MM_HINT_T0);
        __m512 xv = _mm512_loadu_ps(a + p);
#define TWIN_ROW(c, sc, of, acc)                                                            \
  acc = _mm512_fmadd_ps(                                                                    \
      xv,                                                                                   \
      _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(                              \
                          _mm_loadu_si128((const __m128i *)((c) + p)))),                     \
                      sc, of),                                                              \
      acc)
        TWIN_ROW(c0, sc0, of0, acc0);
        TWIN_ROW(c1, sc1, of1, acc1);
        TWIN_ROW(c2, sc2, of2, acc2);
        TWIN_ROW(c3, sc3, of3, acc3);
#undef TWIN_ROW
      }
    }
    float dots[4] = {_mm512_reduce_add_ps(acc0), _mm512_reduce_add_ps(acc1),
                     _mm512_reduce_add_ps(acc2), _mm512_reduce_add_ps(acc3)};
    for (int q = 0; q < nj; ++q) twin_store(x->c + j + q, x->alpha, dots[q], x->beta);
  }
}

TWIN_AVX512 static void twin_rows2_avx512(const twin_call *x, int j0, int j1) {
  twin_tile_avx512(x, j0, j1, 2);
}
TWIN_AVX512 static void twin_rows3_avx512(const twin_call *x, int j0, int j1) {
  twin_tile_avx512(x, j0, j1, 3);
}
TWIN_AVX512 static void twin_rows4_avx512(const twin_call *x, int j0, int j1) {
  twin_tile_avx512(x, j0, j1, 4);
}

TWIN_AVX2 static float twin_hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x1));
  return _mm_cvtss_f32(s);
}

/* the same on 8 lanes, two weight rows at a time */
TWIN_AVX2 static void twin_rows_avx2(const twin_call *x, int j0, int j1) {
  const twin_entry *t = &x->t;
  const int k = t->k, nb = k / t->block, shift = t->block == 32 ? 5 : 4;
  for (int j = j0; j < j1; j += 2) {
    int nj = j1 - j < 2 ? j1 - j : 2;
    const uint8_t *code[2];
    const float *sc[2], *of[2];
    for (int q = 0; q < 2; ++q) {
      int row = j + (q < nj ? q : nj - 1);
      code[q] = t->codes + (int64_t)row * k;
      sc[q] = t->scale + (int64_t)row * nb;
      of[q] = t->offset + (int64_t)row * nb;
    }
    __m256 acc[TWIN_MAX_ROWS][2];
    for (int i = 0; i < TWIN_MAX_ROWS; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int p = 0; p < k; p += 8) {
      int b = p >> shift;
      for (int q = 0; q < 2; ++q) {
        __m128i bytes = _mm_loadl_epi64((const __m128i *)(code[q] + p));
        __m256 codes = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
        __m256 w = _mm256_fmadd_ps(codes, _mm256_set1_ps(sc[q][b]), _mm256_set1_ps(of[q][b]));
        for (int i = 0; i < x->m; ++i)
          acc[i][q] = _mm256_fmadd_ps(_mm256_loadu_ps(x->a + i * x->lda + p), w, acc[i][q]);
      }
    }
    for (int i = 0; i < x->m; ++i)
      for (int q = 0; q < nj; ++q)
        twin_store(x->c + i * x->ldc + j + q, x->alpha, twin_hsum256(acc[i][q]), x->beta);
  }
}

static void twin_groups(const void *ctx, int64_t g0, int64_t g1) {
  const twin_call *x = (const twin_call *)ctx;
  int j0 = (int)(4 * g0), j1 = (int)(4 * g1) < x->t.n ? (int)(4 * g1) : x->t.n;
  if (x->wide) {
    void (*rows[TWIN_MAX_ROWS])(const twin_call *, int, int) = {
        twin_rows1_avx512, twin_rows2_avx512, twin_rows3_avx512, twin_rows4_avx512};
    rows[x->m - 1](x, j0, j1);
  } else
    twin_rows_avx2(x, j0, j1);
}

static int twin_threads(void) {
  static int cached = 0;
  return nexus_cpus_capped(&cached, TWIN_MAX_THREADS);
}

/* A persistent helper thread for the products (TWIN_MAX_THREADS is 2 here: the caller's thread
 * and this one). A decode step makes ~100-200 small products; starting a thread for each cost
 * more than the second core saved. The helper takes the second half of a call's row groups,
 * spins briefly for the next call (decode products come a few hundred microseconds apart) and
 * then sleeps on a condition variable. A call finding the helper busy (another thread's product)
 * runs all its rows itself. */
#define TWIN_SPIN_NS 30000 /* how long a waiting side polls before it sleeps */

/* poll *flag until it differs from `from` or TWIN_SPIN_NS pass; whether it changed */
static int twin_spin_while(const unsigned *flag, unsigned from) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 1;; ++i) {
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != from) return 1;
    __builtin_ia32_pause();
    if ((i & 63) == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > TWIN_SPIN_NS)
        return 0;
    }
  }
}

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t wake, finished;
  pthread_mutex_t owner; /* held by the call using the helper */
  int started, running;
  unsigned generation; /* bumped per job */
  unsigned pending; /* 1 while the helper has a job */
  nexus_rows_fn fn;
  const void *ctx;
  int64_t r0, r1;
} twin_helper_t;

static twin_helper_t twin_helper = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                                    PTHREAD_COND_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                    0, 0, 0, 0, NULL, NULL, 0, 0};

static void *twin_helper_loop(void *arg) {
  (void)arg;
  twin_helper_t *h = &twin_helper;
  unsigned seen = 0;
  for (;;) {
    twin_spin_while(&h->generation, seen);
    pthread_mutex_lock(&h->mu);
    while (h->generation == seen) pthread_cond_wait(&h->wake, &h->mu);
    seen = h->generation;
    nexus_rows_fn fn = h->fn;
    const void *ctx = h->ctx;
    int64_t r0 = h->r0, r1 = h->r1;
    pthread_mutex_unlock(&h->mu);
    fn(ctx, r0, r1);
    pthread_mutex_lock(&h->mu);
    __atomic_store_n(&h->pending, 0, __ATOMIC_RELEASE);
    pthread_cond_signal(&h->finished);
    pthread_mutex_unlock(&h->mu);
  }
  return NULL;
}

/* A child made by fork() has no helper thread (fork copies only the caller's thread) and may
 * inherit locks another thread held: it starts its own helper on first use, with fresh locks. */
static void twin_at_fork_child(void) {
  twin_helper_t fresh = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                         PTHREAD_COND_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                         0, 0, 0, 0, NULL, NULL, 0, 0};
  pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
  twin_helper = fresh;
  twin_lock = lock;
}

static void twin_watch_forks(void) { pthread_atfork(NULL, NULL, twin_at_fork_child); }

/* fn over [0, rows): the helper takes the second half when it is free, else the caller all */
static void twin_parallel_rows(nexus_rows_fn fn, const void *ctx, int64_t rows, int parallel) {
  twin_helper_t *h = &twin_helper;
  if (!parallel || rows < 2 || pthread_mutex_trylock(&h->owner) != 0) {
    fn(ctx, 0, rows);
    return;
  }
  pthread_mutex_lock(&h->mu);
  if (!h->started) {
    pthread_t id;
    h->running = pthread_create(&id, NULL, twin_helper_loop, NULL) == 0;
    if (h->running) pthread_detach(id);
    h->started = 1;
  }
  if (!h->running) {
    pthread_mutex_unlock(&h->mu);
    pthread_mutex_unlock(&h->owner);
    fn(ctx, 0, rows);
    return;
  }
  int64_t half = rows / 2;
  h->fn = fn, h->ctx = ctx, h->r0 = half, h->r1 = rows;
  __atomic_store_n(&h->pending, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&h->generation, 1, __ATOMIC_RELEASE);
  pthread_cond_signal(&h->wake);
  pthread_mutex_unlock(&h->mu);
  fn(ctx, 0, half);
  twin_spin_while(&h->pending, 1);
  pthread_mutex_lock(&h->mu);
  while (h->pending) pthread_cond_wait(&h->finished, &h->mu);
  pthread_mutex_unlock(&h->mu);
  pthread_mutex_unlock(&h->owner);
}

static int64_t twin_encode(const float *src, int64_t n, int k, int block, uint8_t *codes,
                           float *scale, float *offset) {
  if (src == NULL || codes == NULL || scale == NULL || offset == NULL || n < 1 || k < 1 ||
      (block != 16 && block != 32) || k % block != 0 || !nexus_has_avx2_fma())
    return -1;
  twin_encoding e = {src, k, block, codes, scale, offset, 0};
  nexus_parallel_rows(twin_encode_rows, &e, n, twin_threads(), n * (int64_t)k >= (1 << 20));
  return e.failed;
}

static int twin_sgemm_nt(int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc) {
  if (m < 1 || m > TWIN_MAX_ROWS || ldb != k ||
      __atomic_load_n(&twin_used, __ATOMIC_RELAXED) == 0)
    return 0;
  int wide = __builtin_cpu_supports("avx512f") &&
             !__atomic_load_n(&twin_avx2_only, __ATOMIC_RELAXED);
  if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0;
  pthread_rwlock_rdlock(&twin_lock); /* held while computing: an unregistration waits for it */
  int at = twin_find(b, n, k);
  if (at >= 0) {
    twin_call call = {twin_table[at], m, wide, alpha, beta, a, lda, ldc, c};
    twin_parallel_rows(twin_groups, &call, ((int64_t)n + 3) / 4,
                       twin_threads() > 1 && (int64_t)n * k >= TWIN_PARALLEL_MIN);
  }
  pthread_rwlock_unlock(&twin_lock);
  return at >= 0;
}

#else /* not x86-64: always decline */
static void twin_watch_forks(void) {}

static int64_t twin_encode(const float *src, int64_t n, int k, int block, uint8_t *codes,
                           float *scale, float *offset) {
  (void)src, (void)n, (void)k, (void)block, (void)codes, (void)scale, (void)offset;
  return -1; /* no kernel reads twins here: building one would be wasted */
}

static int twin_sgemm_nt(int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc) {
  (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta;
  (void)c, (void)ldc;
  return 0;
}
#endif

#endif /* NEXUS_TWIN_GEMM_H */
