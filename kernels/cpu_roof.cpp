// The roofs of a CPU: how fast its threads can stream memory in, and how fast they can multiply-add.
// Contract: `membound_read_best_s` and `membound_fma_best_s` return the best (least) seconds one pass
// took over `repeats` passes, run by `threads` OpenMP threads, as the decode step runs them (one
// parallel region, each thread its contiguous share). kernels/cpu_roof.py builds and calls them;
// engine/hardware/roof.py turns the seconds into GB/s and FLOP/s and caches them per machine.
//
// Why C++: the C++ decode step streams its weights with vector loads on every thread; a PyTorch
// reduction read slower than that (the step's MBU came out over 100%) and wobbled between runs.
#include <omp.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// One vector register of floats, at the width the compiler targets (GCC/Clang vector extensions:
// the same loop is AVX-512, AVX2, NEON or SSE code).
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(4 * LANES)));

// Independent accumulators: enough to hide an add's or an FMA's latency on two ports, few enough
// to stay in registers at every width (16 on AVX2, 32 on AVX-512 and NEON).
#define CHAINS 8

static inline double now_s() { return omp_get_wtime(); }

extern "C" {

int64_t membound_roof_lanes(void) { return LANES; }

// Reads floats [0, n) of `data` (n a multiple of LANES * CHAINS), summing them so no load is
// dropped; `sink` gets the sum. Best seconds of a pass, the first (page faults) not counted.
double membound_read_best_s(const float *data, int64_t n, int64_t repeats, int64_t threads, float *sink) {
  double best = 1e30;
  float total = 0;
  const int64_t step = (int64_t)LANES * CHAINS;
  const int64_t blocks = n / step;
#pragma omp parallel num_threads((int)threads) reduction(+ : total)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    for (int64_t pass = 0; pass <= repeats; pass++) {
      double t0 = 0;
#pragma omp barrier
#pragma omp master
      t0 = now_s();
      vec acc[CHAINS] = {};
      for (int64_t b = b0; b < b1; b++) {
        const vec *p = (const vec *)(data + b * step);
        for (int c = 0; c < CHAINS; c++) acc[c] += p[c];
      }
#pragma omp barrier
#pragma omp master
      {
        double dt = now_s() - t0;
        if (pass > 0 && dt < best) best = dt;
      }
      for (int c = 1; c < CHAINS; c++) acc[0] += acc[c];
      for (int l = 0; l < LANES; l++) total += acc[0][l];
    }
  }
  *sink = total;
  return best;
}

// `iters` rounds of CHAINS independent vector FMAs per thread (2 * LANES * CHAINS * iters FLOPs a
// thread). Best seconds of a pass.
double membound_fma_best_s(int64_t iters, int64_t repeats, int64_t threads, float *sink) {
  double best = 1e30;
  float total = 0;
#pragma omp parallel num_threads((int)threads) reduction(+ : total)
  {
    vec acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = (vec){} + (float)(c + omp_get_thread_num()) * 1e-3f;
    const vec a = (vec){} + 0.999999f, b = (vec){} + 1e-7f;
    for (int64_t pass = 0; pass <= repeats; pass++) {
      double t0 = 0;
#pragma omp barrier
#pragma omp master
      t0 = now_s();
      for (int64_t i = 0; i < iters; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * a + b;  // one FMA each (contracted at -O3)
      }
#pragma omp barrier
#pragma omp master
      {
        double dt = now_s() - t0;
        if (pass > 0 && dt < best) best = dt;
      }
    }
    for (int c = 1; c < CHAINS; c++) acc[0] += acc[c];
    for (int l = 0; l < LANES; l++) total += acc[0][l];
  }
  *sink = total;
  return best;
}

// FLOPs one thread's bf16 pass counts per iteration; 0 where the machine has no bf16 dot product
// (the decode step then widens bf16 to fp32 and multiplies at the fp32 rate).
int64_t membound_bf16_flops_per_iter(void) {
#if defined(__AVX512BF16__)
  return 2 * 32 * CHAINS;  // vdpbf16ps: 32 bf16 products summed into 16 fp32 lanes
#else
  return 0;
#endif
}

// `iters` rounds of CHAINS independent bf16 dot-product instructions per thread. Best seconds of a
// pass; a negative number where the machine has none.
double membound_bf16_best_s(int64_t iters, int64_t repeats, int64_t threads, float *sink) {
#if defined(__AVX512BF16__)
  double best = 1e30;
  float total = 0;
#pragma omp parallel num_threads((int)threads) reduction(+ : total)
  {
    __m512 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c * 1e-3f);
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int64_t pass = 0; pass <= repeats; pass++) {
      double t0 = 0;
#pragma omp barrier
#pragma omp master
      t0 = now_s();
      for (int64_t i = 0; i < iters; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
      }
#pragma omp barrier
#pragma omp master
      {
        double dt = now_s() - t0;
        if (pass > 0 && dt < best) best = dt;
      }
    }
    for (int c = 1; c < CHAINS; c++) acc[0] = _mm512_add_ps(acc[0], acc[c]);
    total += _mm512_reduce_add_ps(acc[0]);
  }
  *sink = total;
  return best;
#else
  (void)iters, (void)repeats, (void)threads;
  *sink = 0;
  return -1;
#endif
}

}  // extern "C"
