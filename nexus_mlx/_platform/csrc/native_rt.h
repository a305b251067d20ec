/* native_rt.h -- what the native CPU kernels share besides the exp (simd_exp.h): the export
 * macro, the x86-64 feature checks, and a loop that splits rows over POSIX threads.
 *
 * Header-only (static functions); include it after <stdint.h>. The build keys its cache on
 * this header too (cbuild.source_digest hashes quoted includes).
 */
#ifndef NEXUS_NATIVE_RT_H
#define NEXUS_NATIVE_RT_H

#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#if defined(_WIN32)
#define NEXUS_API __declspec(dllexport)
#else
#define NEXUS_API __attribute__((visibility("default")))
#endif

#define NEXUS_MAX_THREADS 16

/* 1 where this CPU runs AVX-512F / AVX2 with FMA, else 0 (always 0 off x86-64) */
static inline int nexus_has_avx512f(void) {
#if defined(__x86_64__) || defined(_M_X64)
  return __builtin_cpu_supports("avx512f") ? 1 : 0;
#else
  return 0;
#endif
}

static inline int nexus_has_avx2_fma(void) {
#if defined(__x86_64__) || defined(_M_X64)
  return (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
#else
  return 0;
#endif
}

/* the CPUs online, between 1 and cap, read once into *cache (a kernel's own static) */
static inline int nexus_cpus_capped(int *cache, int cap) {
  int t = __atomic_load_n(cache, __ATOMIC_RELAXED);
  if (t == 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    t = online < 1 ? 1 : online > cap ? cap : (int)online;
    __atomic_store_n(cache, t, __ATOMIC_RELAXED);
  }
  return t;
}

/* rows [row0, row1) of one call's work; ctx is the call's own arguments */
typedef void (*nexus_rows_fn)(const void *ctx, int64_t row0, int64_t row1);

typedef struct {
  nexus_rows_fn fn;
  const void *ctx;
  int64_t row0, row1;
} nexus_share;

static void *nexus_run_share(void *arg) {
  const nexus_share *share = (const nexus_share *)arg;
  share->fn(share->ctx, share->row0, share->row1);
  return NULL;
}

/* fn(ctx, r0, r1) over contiguous shares of [0, rows), on min(threads, rows, NEXUS_MAX_THREADS)
 * threads when parallel is nonzero, else on one. The caller's thread takes the first share; a
 * share whose thread cannot start runs on the caller's thread. Returns after every share. */
static void nexus_parallel_rows(nexus_rows_fn fn, const void *ctx, int64_t rows, int threads,
                                int parallel) {
  int64_t want = parallel ? threads : 1;
  if (want > rows) want = rows;
  if (want > NEXUS_MAX_THREADS) want = NEXUS_MAX_THREADS;
  if (want < 1) want = 1;
  nexus_share shares[NEXUS_MAX_THREADS];
  pthread_t ids[NEXUS_MAX_THREADS];
  int started[NEXUS_MAX_THREADS] = {0};
  for (int64_t k = 0; k < want; ++k) {
    nexus_share share = {fn, ctx, rows * k / want, rows * (k + 1) / want};
    shares[k] = share;
  }
  for (int64_t k = 1; k < want; ++k) {
    started[k] = pthread_create(&ids[k], NULL, nexus_run_share, &shares[k]) == 0;
    if (!started[k]) nexus_run_share(&shares[k]);
  }
  nexus_run_share(&shares[0]);
  for (int64_t k = 1; k < want; ++k)
    if (started[k]) pthread_join(ids[k], NULL);
}

#endif /* NEXUS_NATIVE_RT_H */
