/*
 * blas_shim.c - CBLAS GEMM forwarders that let MLX's Linux CPU build use an optimized BLAS.
 *
 * Contract
 *   - Exports exactly the CBLAS GEMM entry points libmlx.so imports: cblas_sgemm, cblas_dgemm
 *     and cblas_cgemm, with the reference CBLAS signatures (32-bit ints, enums passed as int).
 *   - Each forwards its arguments unchanged, in order, through a function pointer set by
 *     nexus_blas_init(); nothing is reordered, converted or checked on the way.
 *   - nexus_blas_init() takes the addresses of the target library's sgemm/dgemm/cgemm (for
 *     scipy-openblas32: scipy_cblas_sgemm, ...), found by the Python loader
 *     (nexus_mlx/_platform/blas.py). It returns 0 on success, 1 if any address is NULL.
 *   - One exception to "unchanged": once nexus_blas_set_sgemv() has been given the target's
 *     cblas_sgemv, an sgemm whose result is one row or one column (m == 1 or n == 1, k > 0; a
 *     decode step's every projection) is computed by that sgemv instead, the same product in
 *     the same order of operands. Why: OpenBLAS's sgemm packs the whole weight matrix for a
 *     one-row product, 2-3x slower than reading it once in sgemv. With beta == 0 the output is
 *     zeroed first, so uninitialized memory (MLX's outputs) never reaches the result, whatever
 *     the library does with 0 * NaN. nexus_blas_set_sgemv(NULL) turns the routing off.
 *   - A second exception, while nexus_blas_set_skinny(1) holds: an sgemm computing A * B^T for
 *     2 to SKINNY_MAX_ROWS rows of A (a forward of a few tokens against a weight matrix) is
 *     computed by skinny_gemm.h, which reads B once instead of packing it; where that kernel
 *     declines (no AVX2 + FMA, another shape) sgemm runs. Same product up to summation order.
 *   - A third, checked first: an sgemm computing A * B^T for 1 to TWIN_MAX_ROWS rows of A whose
 *     B has a twin registered with nexus_blas_twin_register() (twin_gemm.h: the same float32
 *     weights rebuilt from one-byte codes) reads the twin instead of B, while
 *     nexus_blas_set_twins(1) holds (the default; nothing is registered until the loader does).
 *     Same product up to summation order. nexus_blas_twin_unregister() and
 *     nexus_blas_twin_count() manage the table.
 *   - nexus_blas_source_id() returns the source hash it was built from (-DNEXUS_BLAS_SOURCE_ID,
 *     "unknown" without it), so the loader can tell a stale build from the current source.
 *   - nexus_blas_call_count(which) reports how many calls went through each forwarder
 *     (0 = sgemm, 1 = dgemm, 2 = cgemm, 3 = sgemm calls routed to sgemv, 4 = to the skinny
 *     kernel, 5 = to a weight twin; -1 for anything else), so tests can prove MLX calls land
 *     here.
 *
 * What it does not know: which library the pointers belong to, how it was loaded, or how
 * symbol resolution makes libmlx.so see these symbols (the loader dlopens this file with
 * RTLD_GLOBAL before mlx.core is imported). LAPACK routines (sgetrf_, ssyevd_, ...) are not
 * forwarded: MLX uses them only for mx.linalg factorizations, not for matmul, the hot path.
 *
 * Calling a forwarder before a successful nexus_blas_init() is a loader bug; it aborts with a
 * message rather than jumping through a NULL pointer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "native_rt.h"
#include "skinny_gemm.h"
#include "twin_gemm.h"

#define NEXUS_EXPORT __attribute__((visibility("default")))

#ifndef NEXUS_BLAS_SOURCE_ID
#define NEXUS_BLAS_SOURCE_ID "unknown"
#endif

typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef void (*sgemv_fn)(int order, int trans, int m, int n, float alpha, const float *a,
                         int lda, const float *x, int incx, float beta, float *y, int incy);
typedef void (*dgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, double alpha,
                         const double *a, int lda, const double *b, int ldb, double beta,
                         double *c, int ldc);
typedef void (*cgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k,
                         const void *alpha, const void *a, int lda, const void *b, int ldb,
                         const void *beta, void *c, int ldc);

static sgemm_fn target_sgemm = NULL;
static dgemm_fn target_dgemm = NULL;
static cgemm_fn target_cgemm = NULL;
static sgemv_fn target_sgemv = NULL; /* NULL: no routing of one-row/one-column products */
static int skinny_on = 0; /* route few-row products to skinny_gemm.h */
static int twins_on = 1; /* read registered weight twins (twin_gemm.h) for few-row products */
static unsigned long long call_counts[6] = {0, 0, 0, 0, 0, 0};

enum { ROW_MAJOR = 101, COL_MAJOR = 102, NO_TRANS = 111, TRANS = 112 };

static void count_call(int which) {
    __atomic_fetch_add(&call_counts[which], 1ULL, __ATOMIC_RELAXED);
}

static void uninitialized(const char *name) {
    fprintf(stderr, "nexus_mlx blas_shim: %s called before nexus_blas_init()\n", name);
    abort();
}

NEXUS_EXPORT int nexus_blas_init(void *sgemm, void *dgemm, void *cgemm) {
    if (sgemm == NULL || dgemm == NULL || cgemm == NULL) {
        return 1;
    }
    /* POSIX guarantees data and function pointers share a representation (dlsym relies on it). */
    target_sgemm = (sgemm_fn)sgemm;
    target_dgemm = (dgemm_fn)dgemm;
    target_cgemm = (cgemm_fn)cgemm;
    return 0;
}

NEXUS_EXPORT const char *nexus_blas_source_id(void) { return NEXUS_BLAS_SOURCE_ID; }

NEXUS_EXPORT void nexus_blas_set_sgemv(void *sgemv) {
    __atomic_store_n(&target_sgemv, (sgemv_fn)sgemv, __ATOMIC_RELEASE);
}

NEXUS_EXPORT void nexus_blas_set_skinny(int on) {
    __atomic_store_n(&skinny_on, on ? 1 : 0, __ATOMIC_RELEASE);
}

NEXUS_EXPORT void nexus_blas_set_twins(int on) {
    __atomic_store_n(&twins_on, on ? 1 : 0, __ATOMIC_RELEASE);
}

NEXUS_EXPORT int nexus_blas_twin_register(const float *src, int n, int k, int block,
                                          const unsigned char *codes, const float *scale,
                                          const float *offset) {
    return twin_register(src, n, k, block, codes, scale, offset);
}

NEXUS_EXPORT int nexus_blas_twin_unregister(const float *src, int n, int k) {
    return twin_unregister(src, n, k);
}

NEXUS_EXPORT int nexus_blas_twin_count(void) { return twin_count(); }

NEXUS_EXPORT void nexus_blas_twin_set_avx2_only(int on) { twin_set_avx2_only(on); }

NEXUS_EXPORT long long nexus_blas_twin_encode(const float *src, long long n, int k, int block,
                                              unsigned char *codes, float *scale, float *offset) {
    return (long long)twin_encode(src, (int64_t)n, k, block, codes, scale, offset);
}

NEXUS_EXPORT long long nexus_blas_call_count(int which) {
    if (which < 0 || which > 5) {
        return -1;
    }
    return (long long)__atomic_load_n(&call_counts[which], __ATOMIC_RELAXED);
}

/* Zero the `count` floats of y spaced `inc` apart (beta == 0: y is output only). */
static void zero_strided(float *y, int count, int inc) {
    if (inc == 1) {
        memset(y, 0, (size_t)count * sizeof(float));
        return;
    }
    for (int i = 0; i < count; i++) {
        y[(size_t)i * (size_t)inc] = 0.0f;
    }
}

/*
 * C = alpha * op(A) * op(B) + beta * C with m == 1 or n == 1, as one sgemv. Row-major
 * throughout (a column-major call is the row-major product of the transposes, operands
 * swapped). Returns 0 when the shape is not one it handles, and the caller runs sgemm.
 *   m == 1: c (1 x n) = alpha * x (1 x k) * op(B) + beta * c, i.e. c^T = op(B)^T x^T: sgemv over
 *           B stored k x n (no trans: transposed read) or n x k (trans: plain read); x is A's
 *           only row (stride 1) or, for a transposed A stored k x 1, its column (stride lda).
 *   n == 1: c (m x 1) = alpha * op(A) * x + beta * c: sgemv over A, x is op(B)'s only column
 *           (B stored k x 1: stride ldb; transposed, 1 x k: stride 1), c's column has stride ldc.
 */
static int sgemm_as_gemv(sgemv_fn gemv, int order, int trans_a, int trans_b, int m, int n, int k,
                         float alpha, const float *a, int lda, const float *b, int ldb,
                         float beta, float *c, int ldc) {
    if (order == COL_MAJOR) {
        return sgemm_as_gemv(gemv, ROW_MAJOR, trans_b, trans_a, n, m, k, alpha, b, ldb, a, lda,
                             beta, c, ldc);
    }
    if (order != ROW_MAJOR) {
        return 0;
    }
    int a_plain = trans_a == NO_TRANS, b_plain = trans_b == NO_TRANS;
    if (m == 1) {
        int trans = b_plain ? TRANS : NO_TRANS; /* op(B)^T: B read transposed iff stored k x n */
        int rows = b_plain ? k : n, cols = b_plain ? n : k;
        if (beta == 0.0f) {
            zero_strided(c, n, 1);
        }
        gemv(ROW_MAJOR, trans, rows, cols, alpha, b, ldb, a, a_plain ? 1 : lda, beta, c, 1);
        return 1;
    }
    int trans = a_plain ? NO_TRANS : TRANS;
    int rows = a_plain ? m : k, cols = a_plain ? k : m;
    if (beta == 0.0f) {
        zero_strided(c, m, ldc);
    }
    gemv(ROW_MAJOR, trans, rows, cols, alpha, a, lda, b, b_plain ? ldb : 1, beta, c, ldc);
    return 1;
}

/* a kernel computing C = alpha * A * B^T + beta * C for row-major A (m x k) and B (n x k) */
typedef int (*sgemm_nt_fn)(int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc);

/*
 * C = alpha * A * B^T + beta * C by `kernel` (skinny_gemm.h's few rows of A, or twin_gemm.h's
 * products against a registered twin of B), in either order: a column-major call is the
 * row-major product of the transposes, so its "A * B^T" with few columns n is the row-major
 * B * A^T with few rows. Returns 0 where it does not apply (another layout, or the kernel
 * declines).
 */
static int sgemm_as_nt(sgemm_nt_fn kernel, int order, int trans_a, int trans_b, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc) {
    if (order == ROW_MAJOR && trans_a == NO_TRANS && trans_b == TRANS) {
        return kernel(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    if (order == COL_MAJOR && trans_a == TRANS && trans_b == NO_TRANS) {
        return kernel(n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
    }
    return 0;
}

NEXUS_EXPORT void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                              float alpha, const float *a, int lda, const float *b, int ldb,
                              float beta, float *c, int ldc) {
    if (target_sgemm == NULL) {
        uninitialized("cblas_sgemm");
    }
    count_call(0);
    if (__atomic_load_n(&twins_on, __ATOMIC_ACQUIRE) && k > 0 &&
        sgemm_as_nt(twin_sgemm_nt, order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                    beta, c, ldc)) {
        count_call(5);
        return;
    }
    sgemv_fn gemv = __atomic_load_n(&target_sgemv, __ATOMIC_ACQUIRE);
    if (gemv != NULL && k > 0 && (m == 1 || n == 1) &&
        sgemm_as_gemv(gemv, order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                      ldc)) {
        count_call(3);
        return;
    }
    if (__atomic_load_n(&skinny_on, __ATOMIC_ACQUIRE) &&
        sgemm_as_nt(skinny_sgemm_nt, order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                    beta, c, ldc)) {
        count_call(4);
        return;
    }
    target_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

NEXUS_EXPORT void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                              double alpha, const double *a, int lda, const double *b, int ldb,
                              double beta, double *c, int ldc) {
    if (target_dgemm == NULL) {
        uninitialized("cblas_dgemm");
    }
    count_call(1);
    target_dgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

NEXUS_EXPORT void cblas_cgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                              const void *alpha, const void *a, int lda, const void *b, int ldb,
                              const void *beta, void *c, int ldc) {
    if (target_cgemm == NULL) {
        uninitialized("cblas_cgemm");
    }
    count_call(2);
    target_cgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
