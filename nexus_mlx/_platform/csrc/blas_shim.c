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
 *   - nexus_blas_call_count(which) reports how many calls went through each forwarder
 *     (0 = sgemm, 1 = dgemm, 2 = cgemm; -1 for anything else), so tests can prove MLX calls
 *     land here.
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

#define NEXUS_EXPORT __attribute__((visibility("default")))

typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef void (*dgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, double alpha,
                         const double *a, int lda, const double *b, int ldb, double beta,
                         double *c, int ldc);
typedef void (*cgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k,
                         const void *alpha, const void *a, int lda, const void *b, int ldb,
                         const void *beta, void *c, int ldc);

static sgemm_fn target_sgemm = NULL;
static dgemm_fn target_dgemm = NULL;
static cgemm_fn target_cgemm = NULL;
static unsigned long long call_counts[3] = {0, 0, 0};

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

NEXUS_EXPORT long long nexus_blas_call_count(int which) {
    if (which < 0 || which > 2) {
        return -1;
    }
    return (long long)__atomic_load_n(&call_counts[which], __ATOMIC_RELAXED);
}

NEXUS_EXPORT void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                              float alpha, const float *a, int lda, const float *b, int ldb,
                              float beta, float *c, int ldc) {
    if (target_sgemm == NULL) {
        uninitialized("cblas_sgemm");
    }
    count_call(0);
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
