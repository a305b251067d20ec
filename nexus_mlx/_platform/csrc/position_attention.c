/* position_attention.c -- attention masked by absolute position in one fused, blocked pass for
 * the CPU forward pass: scores, softmax and the value product per block of 64 keys, with an
 * online softmax, so the (rows x keys) score matrix never exists in memory.
 *
 * Why: over thousands of keys the unfused path (a scores GEMM, the in-place softmax of
 * position_softmax.c, a PV GEMM) streams a score matrix of rows x keys floats through memory
 * three times and synchronises between the three steps; a packed refresh of 64 rows at N = 8,000
 * spent 262 of its 381 ms there. Here each 4-row panel of queries walks the key blocks with its
 * scores in L1, and skips the blocks no row of the panel can see (keys after every query, or
 * outside every query's window).
 *
 * A plain shared library (no Python API), loaded with ctypes by
 * nexus_mlx/kernels/position_attention.py. One binary holds every path; the caller picks one at
 * run time (nexus_pa_best_isa() names the fastest this CPU supports):
 *
 *   NEXUS_PA_SCALAR   portable C, libm expf, one row at a time (the slow reference path)
 *   NEXUS_PA_AVX512   x86-64 AVX-512F, 4-row panels x 64-key blocks; head_dim % 16 == 0
 *   NEXUS_PA_AVX2     x86-64 AVX2 + FMA, the same panels 16 keys / columns at a time; the same
 *                     head_dim rule
 *
 * Layout contract (checked by the Python wrapper; float32 throughout, last axes contiguous):
 *   q    (hkv, rows, d), head stride q_hs, row stride d. Row r of a head holds query r % t (the
 *        layout of grouped-query attention: (Hkv, G * T, D)).
 *   k, v (hkv, n, d), head strides k_hs / v_hs, row strides k_rs / v_rs (a view into a larger
 *        cache storage is fine).
 *   out  (hkv, rows, d), contiguous.
 *   qpos (t,) and kpos (n,) int32 positions in [0, 2^31 - 1]; window > 0 a sliding window, <= 0
 *        none; scale multiplies every score.
 *
 * Specification (kernels/position_attention.py's MLX reference computes the same):
 *   visible(r, j) = dd >= 0 and (window <= 0 or dd < window),  dd = qpos[r % t] - kpos[j]
 *   s[r, j]  = scale * sum_x q[r, x] k[j, x]
 *   p[r, j]  = visible ? exp(s[r, j] - max_visible s[r, :]) / sum_visible exp(...) : 0
 *   out[r]   = sum_j p[r, j] v[j]       (a row that sees no key is all NaN, as its softmax is)
 * The SIMD paths compute the same sums in another order (online softmax: a running maximum,
 * the partial sums rescaled by exp(m_old - m_new)), so results agree within float32 rounding.
 *
 * Threads: the caller's thread and at most threads - 1 POSIX threads share the work in
 * contiguous slices once a call holds at least NEXUS_PA_PARALLEL multiply-adds: first the key
 * blocks' transposition, then the (head, panel) pairs.
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define NEXUS_PA_X86 1
#include <immintrin.h>
#endif

#include "native_rt.h"
#include "simd_exp.h"

#ifndef NEXUS_PA_SOURCE_ID
#define NEXUS_PA_SOURCE_ID "unknown"
#endif

#define NEXUS_PA_ABI 2
#define NEXUS_PA_PARALLEL (1 << 18) /* multiply-adds per call before a second thread pays off */
#define KB 64                       /* keys per block */
#define PR 4                        /* query rows per panel */
#define MAX_D 512                   /* head_dim bound of the panel buffers */

enum { NEXUS_PA_SCALAR = 0, NEXUS_PA_AVX512 = 1, NEXUS_PA_AVX2 = 2, NEXUS_PA_N_ISA = 3 };
enum { NEXUS_PA_OK = 0, NEXUS_PA_EBADARG = -1, NEXUS_PA_EISA = -2, NEXUS_PA_ENOMEM = -3 };

static const char *const isa_names[NEXUS_PA_N_ISA] = {"scalar", "avx512", "avx2"};

typedef struct {
  const float *q, *k, *v;
  float *out;
  int64_t q_hs, k_hs, k_rs, v_hs, v_rs;
  int64_t hkv, rows, t, n, d;
  const int32_t *qpos, *kpos;
  int32_t window;
  float scale;
  /* SIMD paths: per block the smallest / largest key position and the transposed keys */
  int64_t n_blocks;
  const int32_t *block_min, *block_max;
  float *kt; /* (hkv, n_blocks, d, KB) */
} pa_call;

typedef void (*task_fn)(const pa_call *call, int64_t task);

static inline int visible(int32_t q, int32_t k, int32_t window) {
  int32_t dd = q - k;
  return dd >= 0 && (window <= 0 || dd < window);
}

/* ---- scalar: one row at a time, the same online softmax as the SIMD panels ---------------- */
static void scalar_task(const pa_call *c, int64_t task) {
  const int64_t h = task / c->rows, r = task % c->rows;
  const float *q = c->q + h * c->q_hs + r * c->d;
  const int32_t qp = c->qpos[r % c->t];
  float *o = c->out + task * c->d;
  float m = -INFINITY, l = 0.0f;
  for (int64_t x = 0; x < c->d; ++x) o[x] = 0.0f;
  for (int64_t j = 0; j < c->n; ++j) {
    if (!visible(qp, c->kpos[j], c->window)) continue;
    const float *k = c->k + h * c->k_hs + j * c->k_rs;
    const float *v = c->v + h * c->v_hs + j * c->v_rs;
    float s = 0.0f;
    for (int64_t x = 0; x < c->d; ++x) s += q[x] * k[x];
    s *= c->scale;
    if (s > m) { /* a new maximum: rescale what was summed under the old one */
      const float alpha = m == -INFINITY ? 0.0f : expf(m - s);
      for (int64_t x = 0; x < c->d; ++x) o[x] *= alpha;
      l *= alpha;
      m = s;
    }
    const float e = expf(s - m);
    l += e;
    for (int64_t x = 0; x < c->d; ++x) o[x] += e * v[x];
  }
  const float inv = l > 0.0f ? 1.0f / l : NAN; /* no visible key: NaN, as its softmax */
  for (int64_t x = 0; x < c->d; ++x) o[x] *= inv;
}

#if defined(NEXUS_PA_X86)
/* ---- AVX-512F (and the key transposition both SIMD paths use) ------------------------------ */

/* kt[x * KB + j] = k[j * k_rs + x] for the nk keys of one block; zero past nk. */
static void transpose_block(const float *k, int64_t k_rs, int64_t nk, int64_t d, float *kt) {
  for (int64_t x = 0; x < d; ++x) {
    float *dst = kt + x * KB;
    int64_t j = 0;
    for (; j < nk; ++j) dst[j] = k[j * k_rs + x];
    for (; j < KB; ++j) dst[j] = 0.0f;
  }
}

/* o[r * ldo + c] += sum_{x < kdim} a[r * lda + x] * b[x * ldb + c] for the PR rows and the
 * ncols (a multiple of 16) columns: 64 columns at a time in 16 accumulators, then 16 at a time.
 * The scores are this over the transposed keys, the values over the probabilities. */
PS_AVX512 static void panel_fma(const float *a, int64_t lda, const float *b, int64_t ldb,
                                int64_t kdim, int64_t ncols, float *o, int64_t ldo) {
  int64_t c0 = 0;
  for (; c0 + 64 <= ncols; c0 += 64) {
    __m512 acc[PR][4];
    for (int r = 0; r < PR; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_loadu_ps(o + r * ldo + c0 + 16 * c);
    for (int64_t x = 0; x < kdim; ++x) {
      const float *row = b + x * ldb + c0;
      const __m512 b0 = _mm512_loadu_ps(row), b1 = _mm512_loadu_ps(row + 16);
      const __m512 b2 = _mm512_loadu_ps(row + 32), b3 = _mm512_loadu_ps(row + 48);
      for (int r = 0; r < PR; ++r) {
        const __m512 w = _mm512_set1_ps(a[r * lda + x]);
        acc[r][0] = _mm512_fmadd_ps(w, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(w, b1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(w, b2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(w, b3, acc[r][3]);
      }
    }
    for (int r = 0; r < PR; ++r)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + r * ldo + c0 + 16 * c, acc[r][c]);
  }
  for (; c0 < ncols; c0 += 16) {
    for (int r = 0; r < PR; ++r) {
      __m512 acc = _mm512_loadu_ps(o + r * ldo + c0);
      for (int64_t x = 0; x < kdim; ++x)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + x]), _mm512_loadu_ps(b + x * ldb + c0),
                              acc);
      _mm512_storeu_ps(o + r * ldo + c0, acc);
    }
  }
}

/* One panel row's online-softmax step over a block: mask, new running maximum, probabilities
 * written over the scores, running sum and output rescaled. kp holds the block's key positions
 * (KB of them, padded past nk); `all` skips the mask (every key of the block visible to the
 * whole panel). */
PS_AVX512 static void row_softmax_avx512(const pa_call *c, const int32_t *kp, int64_t nk, int all,
                                         int32_t qp, float *s, float *m, float *l, float *o) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512i vq = _mm512_set1_epi32(qp), vw = _mm512_set1_epi32(c->window);
  __mmask16 ok[4];
  __m512 top = ninf;
  for (int x = 0; x < 4; ++x) {
    int64_t left = nk - 16 * x;
    __mmask16 lanes = left >= 16 ? (__mmask16)0xFFFF
                                 : (left > 0 ? (__mmask16)((1u << left) - 1u) : (__mmask16)0);
    if (all) {
      ok[x] = lanes;
    } else {
      __m512i dd = _mm512_sub_epi32(vq, _mm512_maskz_loadu_epi32(lanes, kp + 16 * x));
      ok[x] = _mm512_mask_cmpge_epi32_mask(lanes, dd, _mm512_setzero_si512());
      if (c->window > 0) ok[x] = _mm512_mask_cmplt_epi32_mask(ok[x], dd, vw);
    }
    top = _mm512_max_ps(top, _mm512_mask_loadu_ps(ninf, ok[x], s + 16 * x));
  }
  const float block_max = _mm512_reduce_max_ps(top);
  const float m_new = block_max > *m ? block_max : *m;
  if (m_new == -INFINITY) { /* nothing visible yet: this block adds nothing */
    memset(s, 0, sizeof(float) * KB);
    return;
  }
  const __m512 vm = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int x = 0; x < 4; ++x) {
    __m512 arg = _mm512_sub_ps(_mm512_mask_loadu_ps(ninf, ok[x], s + 16 * x), vm);
    __m512 e = _mm512_maskz_mov_ps(ok[x], exp512(_mm512_min_ps(arg, _mm512_setzero_ps())));
    sum = _mm512_add_ps(sum, e);
    _mm512_storeu_ps(s + 16 * x, e);
  }
  const float alpha = *m == -INFINITY ? 0.0f : expf(*m - m_new);
  *l = *l * alpha + _mm512_reduce_add_ps(sum);
  *m = m_new;
  if (alpha != 1.0f) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t x = 0; x < c->d; x += 16)
      _mm512_storeu_ps(o + x, _mm512_mul_ps(_mm512_loadu_ps(o + x), va));
  }
}


/* ---- AVX2 + FMA: the same panel multiply-add and softmax step, 16 columns at a time ------- */
PS_AVX2 static void panel_fma_avx2(const float *a, int64_t lda, const float *b, int64_t ldb,
                                   int64_t kdim, int64_t ncols, float *o, int64_t ldo) {
  for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
    __m256 acc[PR][2];
    for (int r = 0; r < PR; ++r) {
      acc[r][0] = _mm256_loadu_ps(o + r * ldo + c0);
      acc[r][1] = _mm256_loadu_ps(o + r * ldo + c0 + 8);
    }
    for (int64_t x = 0; x < kdim; ++x) {
      const float *row = b + x * ldb + c0;
      const __m256 b0 = _mm256_loadu_ps(row), b1 = _mm256_loadu_ps(row + 8);
      for (int r = 0; r < PR; ++r) {
        const __m256 w = _mm256_broadcast_ss(a + r * lda + x);
        acc[r][0] = _mm256_fmadd_ps(w, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < PR; ++r) {
      _mm256_storeu_ps(o + r * ldo + c0, acc[r][0]);
      _mm256_storeu_ps(o + r * ldo + c0 + 8, acc[r][1]);
    }
  }
}

PS_AVX2 static void row_softmax_avx2(const pa_call *c, const int32_t *kp, int64_t nk, int all,
                                     int32_t qp, float *s, float *m, float *l, float *o) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const __m256i vq = _mm256_set1_epi32(qp), vw = _mm256_set1_epi32(c->window);
  __m256 ok[KB / 8];
  __m256 top = ninf;
  for (int x = 0; x < KB / 8; ++x) {
    if (all && nk == KB) {
      ok[x] = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    } else { /* padded positions (INT32_MAX) are never visible */
      __m256i dd = _mm256_sub_epi32(vq, _mm256_loadu_si256((const __m256i *)(kp + 8 * x)));
      __m256i seen = _mm256_cmpgt_epi32(dd, _mm256_set1_epi32(-1));
      if (c->window > 0) seen = _mm256_and_si256(seen, _mm256_cmpgt_epi32(vw, dd));
      ok[x] = _mm256_castsi256_ps(seen);
    }
    top = _mm256_max_ps(top, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * x), ok[x]));
  }
  const float block_max = hmax256(top);
  const float m_new = block_max > *m ? block_max : *m;
  if (m_new == -INFINITY) {
    memset(s, 0, sizeof(float) * KB);
    return;
  }
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int x = 0; x < KB / 8; ++x) {
    __m256 arg = _mm256_sub_ps(_mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * x), ok[x]), vm);
    __m256 e = _mm256_and_ps(ok[x], exp256(_mm256_min_ps(arg, _mm256_setzero_ps())));
    sum = _mm256_add_ps(sum, e);
    _mm256_storeu_ps(s + 8 * x, e);
  }
  const float alpha = *m == -INFINITY ? 0.0f : expf(*m - m_new);
  *l = *l * alpha + hsum256(sum);
  *m = m_new;
  if (alpha != 1.0f) {
    const __m256 va = _mm256_set1_ps(alpha);
    for (int64_t x = 0; x < c->d; x += 8)
      _mm256_storeu_ps(o + x, _mm256_mul_ps(_mm256_loadu_ps(o + x), va));
  }
}

/* ---- the panel driver, shared by both SIMD paths ------------------------------------------ */
typedef struct {
  void (*fma)(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t kdim,
              int64_t ncols, float *o, int64_t ldo);
  void (*row_softmax)(const pa_call *c, const int32_t *kp, int64_t nk, int all, int32_t qp,
                      float *s, float *m, float *l, float *o);
} panel_ops;

static const panel_ops AVX512_OPS = {panel_fma, row_softmax_avx512};
static const panel_ops AVX2_OPS = {panel_fma_avx2, row_softmax_avx2};

/* The rows [r0, r0 + PR) of head h (fewer at the end: the panel repeats row r0 and drops it). */
static void run_panel(const pa_call *c, int64_t task, const panel_ops *ops) {
  const int64_t panels = (c->rows + PR - 1) / PR, h = task / panels, r0 = (task % panels) * PR;
  const int64_t d = c->d, nr = c->rows - r0 < PR ? c->rows - r0 : PR;
  float q[PR * MAX_D] __attribute__((aligned(64)));
  float o[PR * MAX_D] __attribute__((aligned(64)));
  float s[PR * KB] __attribute__((aligned(64)));
  float m[PR], l[PR];
  int32_t kp[KB], qp[PR], q_lo = INT32_MAX, q_hi = INT32_MIN;
  for (int r = 0; r < PR; ++r) {
    const int64_t row = r0 + (r < nr ? r : 0);
    const float *src = c->q + h * c->q_hs + row * d;
    for (int64_t x = 0; x < d; ++x) q[r * d + x] = src[x] * c->scale;
    qp[r] = c->qpos[row % c->t];
    q_lo = qp[r] < q_lo ? qp[r] : q_lo;
    q_hi = qp[r] > q_hi ? qp[r] : q_hi;
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  memset(o, 0, sizeof(float) * PR * d);
  const float *kt = c->kt + h * c->n_blocks * d * KB;
  for (int64_t b = 0; b < c->n_blocks; ++b) {
    const int32_t k_lo = c->block_min[b], k_hi = c->block_max[b];
    if (k_lo > q_hi) continue;                                         /* after every query */
    if (c->window > 0 && (int64_t)q_lo - k_hi >= c->window) continue; /* outside every window */
    const int64_t j0 = b * KB, nk = c->n - j0 < KB ? c->n - j0 : KB;
    const int all = k_hi <= q_lo && (c->window <= 0 || (int64_t)q_hi - k_lo < c->window);
    for (int64_t j = 0; j < KB; ++j) kp[j] = j < nk ? c->kpos[j0 + j] : INT32_MAX;
    memset(s, 0, sizeof(float) * PR * KB);
    ops->fma(q, d, kt + b * d * KB, KB, d, KB, s, KB); /* scores: q (PR x d) @ kt (d x KB) */
    for (int r = 0; r < PR; ++r)
      ops->row_softmax(c, kp, nk, all, qp[r], s + r * KB, &m[r], &l[r], o + r * d);
    ops->fma(s, KB, c->v + h * c->v_hs + j0 * c->v_rs, c->v_rs, nk, d, o, d); /* o += p @ v */
  }
  for (int r = 0; r < nr; ++r) {
    float *dst = c->out + (h * c->rows + r0 + r) * d;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : NAN;
    for (int64_t x = 0; x < d; ++x) dst[x] = o[r * d + x] * inv;
  }
}

static void panel_avx512(const pa_call *c, int64_t task) { run_panel(c, task, &AVX512_OPS); }
static void panel_avx2(const pa_call *c, int64_t task) { run_panel(c, task, &AVX2_OPS); }

static void transpose_task(const pa_call *c, int64_t task) {
  const int64_t h = task / c->n_blocks, b = task % c->n_blocks;
  const int64_t nk = c->n - b * KB < KB ? c->n - b * KB : KB;
  transpose_block(c->k + h * c->k_hs + b * KB * c->k_rs, c->k_rs, nk, c->d,
                  c->kt + (h * c->n_blocks + b) * c->d * KB);
}

/* The transposed keys' buffer, kept per calling thread and grown as needed: a fresh allocation
 * of megabytes per call came back from the kernel as new pages, and faulting them in cost a
 * third of the call inside a forward pass. Freed only when a larger one replaces it. */
static float *scratch_keys(size_t floats) {
  static __thread float *buf = NULL;
  static __thread size_t have = 0;
  if (floats > have) {
    free(buf);
    have = 0;
    buf = (float *)aligned_alloc(64, sizeof(float) * floats);
    if (buf == NULL) return NULL;
    have = floats;
  }
  return buf;
}
#endif /* x86-64 */

/* ---- threads ------------------------------------------------------------------------------ */
typedef struct {
  const pa_call *call;
  task_fn fn;
} pa_tasks;

static void run_task_range(const void *ctx, int64_t task0, int64_t task1) {
  const pa_tasks *tasks = (const pa_tasks *)ctx;
  for (int64_t task = task0; task < task1; ++task) tasks->fn(tasks->call, task);
}

/* Tasks [0, n_tasks) over `threads` contiguous shares; the caller's thread runs the first. */
static void run_tasks(const pa_call *call, task_fn fn, int64_t n_tasks, int threads) {
  pa_tasks tasks = {call, fn};
  nexus_parallel_rows(run_task_range, &tasks, n_tasks, threads, 1);
}

/* ---- dispatch ----------------------------------------------------------------------------- */
static int cpu_supports(int isa) {
  switch (isa) {
    case NEXUS_PA_SCALAR:
      return 1;
    case NEXUS_PA_AVX512:
      return nexus_has_avx512f();
    case NEXUS_PA_AVX2:
      return nexus_has_avx2_fma();
    default:
      return 0;
  }
}

NEXUS_API int nexus_pa_abi_version(void) { return NEXUS_PA_ABI; }
NEXUS_API const char *nexus_pa_source_id(void) { return NEXUS_PA_SOURCE_ID; }
NEXUS_API int nexus_pa_isa_available(int isa) {
  return isa >= 0 && isa < NEXUS_PA_N_ISA && cpu_supports(isa);
}
NEXUS_API int nexus_pa_best_isa(void) {
  if (cpu_supports(NEXUS_PA_AVX512)) return NEXUS_PA_AVX512;
  return cpu_supports(NEXUS_PA_AVX2) ? NEXUS_PA_AVX2 : NEXUS_PA_SCALAR;
}
/* Whether `isa` runs head_dim d (the SIMD panels need d % 16 == 0 and d <= MAX_D). */
NEXUS_API int nexus_pa_supports_head_dim(int isa, int64_t d) {
  if (d < 1) return 0;
  return isa == NEXUS_PA_SCALAR || (d % 16 == 0 && d <= MAX_D);
}

/* Attention of every row (see the specification above) into `out`. isa < 0 picks the fastest
 * available. Returns NEXUS_PA_OK or a negative error code; on an error `out` is untouched. */
NEXUS_API int nexus_pa_attention(int isa, const float *q, int64_t q_hs, const float *k,
                                 int64_t k_hs, int64_t k_rs, const float *v, int64_t v_hs,
                                 int64_t v_rs, float *out, int64_t hkv, int64_t rows, int64_t t,
                                 int64_t n, int64_t d, const int32_t *qpos, const int32_t *kpos,
                                 int32_t window, float scale, int threads) {
  if (q == NULL || k == NULL || v == NULL || out == NULL || qpos == NULL || kpos == NULL ||
      hkv < 1 || rows < 1 || t < 1 || rows % t != 0 || n < 1 || d < 1 || q_hs < rows * d ||
      k_rs < d || v_rs < d || k_hs < 0 || v_hs < 0)
    return NEXUS_PA_EBADARG;
  if (isa < 0) isa = nexus_pa_best_isa();
  if (!nexus_pa_isa_available(isa)) return NEXUS_PA_EISA;
  if (!nexus_pa_supports_head_dim(isa, d)) return NEXUS_PA_EBADARG;
  pa_call call = {q, k, v, out, q_hs, k_hs, k_rs, v_hs, v_rs, hkv, rows, t, n, d,
                  qpos, kpos, window, scale, 0, NULL, NULL, NULL};
  const int want = (double)hkv * (double)rows * (double)n * (double)d < NEXUS_PA_PARALLEL ? 1
                                                                                        : threads;
  if (isa == NEXUS_PA_SCALAR) {
    run_tasks(&call, scalar_task, hkv * rows, want);
    return NEXUS_PA_OK;
  }
#if defined(NEXUS_PA_X86)
  const int64_t n_blocks = (n + KB - 1) / KB;
  int32_t *bounds = (int32_t *)malloc(sizeof(int32_t) * (size_t)(2 * n_blocks));
  float *kt = scratch_keys((size_t)(hkv * n_blocks * d * KB));
  if (bounds == NULL || kt == NULL) {
    free(bounds);
    return NEXUS_PA_ENOMEM;
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (int64_t j = b * KB; j < n && j < (b + 1) * KB; ++j) {
      lo = kpos[j] < lo ? kpos[j] : lo;
      hi = kpos[j] > hi ? kpos[j] : hi;
    }
    bounds[b] = lo;
    bounds[n_blocks + b] = hi;
  }
  call.n_blocks = n_blocks;
  call.block_min = bounds;
  call.block_max = bounds + n_blocks;
  call.kt = kt;
  run_tasks(&call, transpose_task, hkv * n_blocks, want);
  run_tasks(&call, isa == NEXUS_PA_AVX512 ? panel_avx512 : panel_avx2,
            hkv * ((rows + PR - 1) / PR), want);
  free(bounds);
  return NEXUS_PA_OK;
#else
  return NEXUS_PA_EISA;
#endif
}

NEXUS_API const char *nexus_pa_isa_name(int isa) {
  return (isa >= 0 && isa < NEXUS_PA_N_ISA) ? isa_names[isa] : NULL;
}
