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
#include <string.h>

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

// Inside a parallel region: `pass()` on every thread, `repeats` + 1 times between barriers; `*best`
// (shared) gets the least seconds of a pass after the first (page faults, clocks) as the master saw it.
template <typename Pass>
static inline void timed_passes(int64_t repeats, double *best, Pass pass) {
  for (int64_t p = 0; p <= repeats; p++) {
    double t0 = 0;
#pragma omp barrier
#pragma omp master
    t0 = now_s();
    pass();
#pragma omp barrier
#pragma omp master
    {
      double dt = now_s() - t0;
      if (p > 0 && dt < *best) *best = dt;
    }
  }
}

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
    timed_passes(repeats, &best, [&] {
      vec acc[CHAINS] = {};
      for (int64_t b = b0; b < b1; b++) {
        const vec *p = (const vec *)(data + b * step);
        for (int c = 0; c < CHAINS; c++) acc[c] += p[c];
      }
      for (int c = 1; c < CHAINS; c++) acc[0] += acc[c];
      for (int l = 0; l < LANES; l++) total += acc[0][l];
    });
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
    timed_passes(repeats, &best, [&] {
      for (int64_t i = 0; i < iters; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * a + b;  // one FMA each (contracted at -O3)
      }
    });
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
    timed_passes(repeats, &best, [&] {
      for (int64_t i = 0; i < iters; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
      }
    });
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

// The integer dot products the decode step's quantised formats run (kernels/cpu_decode.cpp
// input_rounding): "int8" multiplies bytes four (x86 VNNI, Arm SDOT) or two (vpmaddubsw, summed in
// int16) to a lane; "int16" multiplies int16 pairs into int32 lanes (vpdpwssd, vpmaddwd). FLOPs
// count 2 per multiply-add, as the cost model counts the products. The loop is the fewest
// instructions that level accumulates such products with: the fused instruction where the machine
// has one, else the multiply and its add. 0 where the machine has no such instruction (the step then
// multiplies at the float rate).
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
typedef __m512i ivec;
#define INT8_DOT(a, w, x) _mm512_dpbusd_epi32(a, w, x)
#define INT8_MACS 64
#define INT16_DOT(a, w, x) _mm512_dpwssd_epi32(a, w, x)
#define INT16_MACS 32
#elif defined(__AVX512BW__)
typedef __m512i ivec;
#define INT8_DOT(a, w, x) _mm512_add_epi16(a, _mm512_maddubs_epi16(w, x))
#define INT8_MACS 64
#define INT16_DOT(a, w, x) _mm512_add_epi32(a, _mm512_madd_epi16(w, x))
#define INT16_MACS 32
#elif defined(__AVXVNNI__)
typedef __m256i ivec;
#define INT8_DOT(a, w, x) _mm256_dpbusd_avx_epi32(a, w, x)
#define INT8_MACS 32
#define INT16_DOT(a, w, x) _mm256_dpwssd_avx_epi32(a, w, x)
#define INT16_MACS 16
#elif defined(__AVX2__)
typedef __m256i ivec;
#define INT8_DOT(a, w, x) _mm256_add_epi16(a, _mm256_maddubs_epi16(w, x))
#define INT8_MACS 32
#define INT16_DOT(a, w, x) _mm256_add_epi32(a, _mm256_madd_epi16(w, x))
#define INT16_MACS 16
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
typedef int32x4_t ivec;
#define INT8_DOT(a, w, x) vdotq_s32(a, vreinterpretq_s8_s32(w), vreinterpretq_s8_s32(x))
#define INT8_MACS 16
#endif

#if defined(INT8_MACS)
#if defined(__aarch64__)
#define OPAQUE(v) __asm__ volatile("" : "+w"(v))
#else
#define OPAQUE(v) __asm__ volatile("" : "+v"(v))
#endif
static const unsigned char seed[80] = {3, 250, 7, 9, 1, 128, 77, 5};  // the rest zero: any bytes do

// Eight independent accumulators of one integer dot product `dot`, `iters` rounds a thread, each
// chain its own pair of inputs (named variables, not arrays: arrays went to the stack). The inputs
// pass through an empty asm statement every round: where the product and its add are two
// instructions, the compiler would otherwise multiply once, outside the loop, and time the adds.
static_assert(CHAINS == 8, "int_dot_best_s spells out eight chains");
template <typename Dot>
static double int_dot_best_s(Dot dot, int64_t iters, int64_t repeats, int64_t threads, int64_t *sink) {
  double best = 1e30;
  int64_t total = 0;
#pragma omp parallel num_threads((int)threads) reduction(+ : total)
  {
    ivec w0, w1, w2, w3, x0, x1, acc[CHAINS];
    memcpy(&w0, seed, sizeof w0), memcpy(&w1, seed + 1, sizeof w1), memcpy(&w2, seed + 2, sizeof w2);
    memcpy(&w3, seed + 3, sizeof w3), memcpy(&x0, seed + 5, sizeof x0), memcpy(&x1, seed + 8, sizeof x1);
    for (int c = 0; c < CHAINS; c++) memset(&acc[c], c + omp_get_thread_num(), sizeof acc[c]);
    ivec a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5], a6 = acc[6], a7 = acc[7];
    timed_passes(repeats, &best, [&] {
      for (int64_t i = 0; i < iters; i++) {
        OPAQUE(w0); OPAQUE(w1); OPAQUE(w2); OPAQUE(w3); OPAQUE(x0); OPAQUE(x1);
        a0 = dot(a0, w0, x0), a1 = dot(a1, w1, x0), a2 = dot(a2, w2, x0), a3 = dot(a3, w3, x0);
        a4 = dot(a4, w0, x1), a5 = dot(a5, w1, x1), a6 = dot(a6, w2, x1), a7 = dot(a7, w3, x1);
      }
    });
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3, acc[4] = a4, acc[5] = a5, acc[6] = a6, acc[7] = a7;
    int32_t lanes[sizeof(ivec) / 4];
    for (int c = 0; c < CHAINS; c++) {
      memcpy(lanes, &acc[c], sizeof lanes);
      for (unsigned l = 0; l < sizeof lanes / 4; l++) total += lanes[l];
    }
  }
  *sink = total;
  return best;
}
#endif

extern "C" {

// FLOPs one thread's pass of `membound_int_dot_best_s(kind)` counts per iteration (kind 8: bytes,
// 16: int16 pairs); 0 where this machine has no such instruction.
int64_t membound_int_dot_flops_per_iter(int64_t kind) {
#if defined(INT16_MACS)
  if (kind == 16) return 2 * INT16_MACS * CHAINS;
#endif
#if defined(INT8_MACS)
  if (kind == 8) return 2 * INT8_MACS * CHAINS;
#endif
  (void)kind;
  return 0;
}

// Best seconds of a pass of `iters` rounds of CHAINS independent integer dot products a thread (kind
// 8 or 16, as above); a negative number where the machine has none.
double membound_int_dot_best_s(int64_t kind, int64_t iters, int64_t repeats, int64_t threads, float *sink_out) {
  if (membound_int_dot_flops_per_iter(kind) <= 0) {
    *sink_out = 0;
    return -1;
  }
  int64_t total = 0;
  double seconds = -1;
#if defined(INT16_MACS)
  if (kind == 16)
    seconds = int_dot_best_s([](ivec a, ivec w, ivec x) { return INT16_DOT(a, w, x); }, iters, repeats, threads, &total);
#endif
#if defined(INT8_MACS)
  if (kind == 8)
    seconds = int_dot_best_s([](ivec a, ivec w, ivec x) { return INT8_DOT(a, w, x); }, iters, repeats, threads, &total);
#endif
  (void)iters, (void)repeats, (void)threads;
  *sink_out = (float)total;
  return seconds;
}

}  // extern "C"
