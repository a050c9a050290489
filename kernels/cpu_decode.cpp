// One decode-shaped step of a Llama-family transformer on a CPU, in one OpenMP parallel region.
// Contract: `membound_step` computes the logits of M token rows (each at its own position, over its
// own K/V: rows of different sequences, or consecutive rows of one sequence, causal among them),
// writing their K/V into the cache; kernels/cpu_decode.py builds the descriptors, and the tests hold
// it to PyTorch's step (tests/kernels/test_cpu_decode*.py).
//
// Why one region: an eager PyTorch step is ~700 operators, each a parallel region (a wake-up and a
// barrier) plus Python between them; on a 2-core machine that overhead rivalled the memory time of
// the small formats. Here the threads stay in one region for the whole step and meet at ~6 barriers
// per layer. Every weight is read from memory once per step, at its stored precision, whatever M:
// a block of rows is applied to every token row while it is in registers or L1/L2.
//
// Vector levels, chosen by the compiler's target (reported by `membound_isa`): AVX-512 (bf16 dot
// products where __AVX512BF16__, INT4 by vpdpbusd against int8 input codes where __AVX512VNNI__), AVX2 +
// FMA + F16C (INT4 by vpmaddubsw against the same codes), NEON on aarch64 (BFDOT where __ARM_FEATURE_BF16, SDOT where
// __ARM_FEATURE_DOTPROD) and scalar, the reference of last resort.
// One loop body per operation over the mapping layer below (vector width, loads of fp32 / bf16 /
// int8 / fp16, FMA, sums, tails); the quantised dot products that need their own intrinsics sit in
// per-architecture blocks beside the generic version.
//
// Bits: each output of a product is one chain of operations that depends on its weight row and its
// token row only, never on M, on the blocking or on the threads, so the same token gives the same
// logits alone or among others (the one-token step and a speculative verify step agree exactly).
//
// Matrix formats (struct Mat): F32 and BF16 (N, K) row-major; INT8 codes (N, K) with one bf16 scale
// per row; INT4 in tiles of 16 rows (engine/model/quant.py `Int4Linear.cpu_matrix`): tile t holds,
// for each octet of inputs k = 8j .. 8j + 7, 64 bytes: one little-endian 32-bit word per row
// i = 0..15 whose nibble at bit 4a + 16b is the code of input 8j + 2a + b; fp16 scales and mins
// (tiles, groups, 16): w = code * scale + min.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>

#if defined(_OPENMP)
#include <omp.h>
#else  // one thread (Apple clang without libomp): the pragmas are ignored, the region runs once
#include <chrono>
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline double omp_get_wtime(void) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define ARCH_X86 1
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12 flags the intrinsics' own undefined pass-through operands (its bug 105593, fixed in 13)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LEVEL_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LEVEL_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define LEVEL_NEON 1
#include <arm_neon.h>
#else
#define LEVEL_SCALAR 1
#endif

#if defined(LEVEL_AVX512) && defined(__AVX512BF16__)
#define HAVE_BF16_DOT 1  // vdpbf16ps
#endif
#if defined(LEVEL_AVX512) && defined(__AVX512VNNI__)
#define HAVE_VNNI 1  // vpdpbusd: INT4's codes (u8) times signed input bytes, four a lane
#endif
#if defined(LEVEL_NEON) && (defined(__ARM_FEATURE_BF16) || defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC))
#define HAVE_BF16_DOT 1  // BFDOT (GCC names the feature by its vector half)
#endif
#if defined(LEVEL_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define HAVE_SDOT 1
#endif

enum { F32 = 0, BF16 = 1, INT8 = 2, INT4 = 3 };
// how a product takes its input rows (membound_input_rounding): exactly, rounded to bf16, or
// quantised per group to int16 or int8 (the integer dot products)
enum { X_EXACT = 0, X_BF16 = 1, X_INT16 = 2, X_INT8 = 3 };
#define MAX_ROWS 64  // token rows a step takes

struct Mat {
  int64_t fmt, n, k, group;
  const void *w;      // codes or weights
  const void *scale;  // INT8: bf16 (n); INT4: fp16 (tiles, k / group, 16)
  const void *min;    // INT4: fp16 (tiles, k / group, 16)
};

struct Layer {
  const void *attn_norm, *ffn_norm;  // (dim), activation dtype
  const void *bqkv;                  // (q_dim + 2 kv_dim) or null
  const void *qk_norm;               // (n_heads + n_kv, head_dim) or null
  struct Mat wqkv, wo, w_gate_up, w_down;
  void *k_cache, *v_cache;           // this layer's K/V, activation dtype (addressed through struct Row)
};

struct Model {
  int64_t dim, n_layers, n_heads, n_kv, head_dim, ffn_dim, vocab, max_len;
  int64_t act;  // F32 or BF16: the embedding, norm weights, biases and KV cache
  float eps;
  const void *embed;  // (vocab, dim)
  const void *norm;   // (dim)
  struct Mat head;
  const struct Layer *layers;
  int64_t kv_head_stride;  // elements from one KV head to the next in a layer's cache
  int64_t block_size;      // positions per block of a row's block table
};

// One token row of a step: element (kv head h, position p, i) of a layer's K cache is at
// k_cache + kv_base + h * kv_head_stride + slot(p) * head_dim + i, slot(p) = p without a table
// (a contiguous cache), else table[p / block_size] * block_size + p % block_size (a paged pool).
struct Row {
  int64_t token, pos, kv_base;
  const int32_t *table;
};

// ---- scalar conversions ----------------------------------------------------------------------
static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t f32_to_bf16(float f) {  // round to nearest even (finite values)
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
  if (exp == 0) {  // zero or subnormal
    float f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  u = exp == 31 ? sign | 0x7F800000 | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float load_act(const void *p, int64_t i, int64_t act) {
  return act == BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void store_act(void *p, int64_t i, float v, int64_t act) {
  if (act == BF16)
    ((uint16_t *)p)[i] = f32_to_bf16(v);
  else
    ((float *)p)[i] = v;
}

static inline uint32_t load_u32(const void *p) {
  uint32_t u;
  memcpy(&u, p, 4);
  return u;
}

// ---- the SIMD mapping layer: V holds W fp32 lanes ---------------------------------------------------
#if defined(LEVEL_AVX512)
#define W 16
typedef __m512 V;
static inline __mmask16 vmask(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }
static inline V vzero(void) { return _mm512_setzero_ps(); }
static inline V vset1(float f) { return _mm512_set1_ps(f); }
static inline V vload(const float *p) { return _mm512_loadu_ps(p); }
static inline V vloadn(const float *p, int64_t n) { return _mm512_maskz_loadu_ps(vmask(n), p); }
static inline void vstore(float *p, V v) { _mm512_storeu_ps(p, v); }
static inline void vstoren(float *p, V v, int64_t n) { _mm512_mask_storeu_ps(p, vmask(n), v); }
static inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
static inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
static inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
static inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
static inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static inline V vfnma(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
static inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
static inline float vhsum(V v) { return _mm512_reduce_add_ps(v); }
// out[0..3] = vhsum(a), vhsum(b), vhsum(c), vhsum(d), each in vhsum's own order (halves, quarters, pairs),
// four at a time: 12 instructions where four vhsum take ~32
#define HAVE_VHSUM4 1
static inline void vhsum4(V a, V b, V c, V d, float *out) {
  const V ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));  // x[i] + x[i + 8]
  const V cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // + x[i + 4]: quarter q of s is the four sums of a, b, c, d's own
  const V s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const V t = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));  // lanes 0, 1 of each quarter: [0] + [2], [1] + [3]
  const V u = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));  // lane 0: their sum
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                                      0, 0, 0, 0), u)));
}
static inline float vhmax(V v) { return _mm512_reduce_max_ps(v); }
static inline V vround(V v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline V vscale2(V p, V k) { return _mm512_scalef_ps(p, k); }  // p 2^k
static inline V bf16_wide(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
static inline V vload_bf16(const uint16_t *p) { return bf16_wide(_mm256_loadu_si256((const __m256i *)p)); }
static inline V vload_bf16n(const uint16_t *p, int64_t n) { return bf16_wide(_mm256_maskz_loadu_epi16(vmask(n), p)); }
static inline V vload_i8(const int8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline V vload_i8n(const int8_t *p, int64_t n) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(vmask(n), p)));
}
static inline V vload_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
#elif defined(LEVEL_AVX2)
#define W 8
typedef __m256 V;
static inline __m256i vmask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline V vzero(void) { return _mm256_setzero_ps(); }
static inline V vset1(float f) { return _mm256_set1_ps(f); }
static inline V vload(const float *p) { return _mm256_loadu_ps(p); }
static inline V vloadn(const float *p, int64_t n) { return _mm256_maskload_ps(p, vmask(n)); }
static inline void vstore(float *p, V v) { _mm256_storeu_ps(p, v); }
static inline void vstoren(float *p, V v, int64_t n) { _mm256_maskstore_ps(p, vmask(n), v); }
static inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
static inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
static inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
static inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
static inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
static inline V vfnma(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
static inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
static inline float vhsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float vhmax(V v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline V vround(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline V vscale2(V p, V k) {  // k integral in [-126, 127]
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k),
                                                                                   _mm256_set1_epi32(127)), 23)));
}
static inline V bf16_wide(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
static inline V vload_bf16(const uint16_t *p) { return bf16_wide(_mm_loadu_si128((const __m128i *)p)); }
static inline V vload_i8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static inline V vload_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#elif defined(LEVEL_NEON)
#define W 4
typedef float32x4_t V;
static inline V vzero(void) { return vdupq_n_f32(0.0f); }
static inline V vset1(float f) { return vdupq_n_f32(f); }
static inline V vload(const float *p) { return vld1q_f32(p); }
static inline void vstore(float *p, V v) { vst1q_f32(p, v); }
static inline V vadd(V a, V b) { return vaddq_f32(a, b); }
static inline V vsub(V a, V b) { return vsubq_f32(a, b); }
static inline V vmul(V a, V b) { return vmulq_f32(a, b); }
static inline V vdiv(V a, V b) { return vdivq_f32(a, b); }
static inline V vfma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
static inline V vfnma(V a, V b, V c) { return vfmsq_f32(c, a, b); }
static inline V vmax(V a, V b) { return vmaxq_f32(a, b); }
static inline float vhsum(V v) { return vaddvq_f32(v); }
static inline float vhmax(V v) { return vmaxvq_f32(v); }
static inline V vround(V v) { return vrndnq_f32(v); }
static inline V vscale2(V p, V k) {
  return vmulq_f32(p, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23)));
}
static inline V vload_bf16(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
static inline V vload_i8(const int8_t *p) {
  int8x8_t b = vreinterpret_s8_u32(vdup_n_u32(load_u32(p)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(b))));
}
static inline V vload_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
#else  // scalar: eight lanes in plain C (the compiler may vectorise them for the baseline target)
#define W 8
struct V {
  float v[W];
};
static inline V vzero(void) {
  V r;
  for (int i = 0; i < W; i++) r.v[i] = 0.0f;
  return r;
}
static inline V vset1(float f) {
  V r;
  for (int i = 0; i < W; i++) r.v[i] = f;
  return r;
}
static inline V vload(const float *p) {
  V r;
  memcpy(r.v, p, sizeof r.v);
  return r;
}
static inline void vstore(float *p, V v) { memcpy(p, v.v, sizeof v.v); }
#define SCALAR_OP(name, expr)               \
  static inline V name(V a, V b) {          \
    V r;                                    \
    for (int i = 0; i < W; i++) r.v[i] = expr; \
    return r;                               \
  }
SCALAR_OP(vadd, a.v[i] + b.v[i])
SCALAR_OP(vsub, a.v[i] - b.v[i])
SCALAR_OP(vmul, a.v[i] * b.v[i])
SCALAR_OP(vdiv, a.v[i] / b.v[i])
SCALAR_OP(vmax, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
static inline V vfma(V a, V b, V c) {
  V r;
  for (int i = 0; i < W; i++) r.v[i] = fmaf(a.v[i], b.v[i], c.v[i]);
  return r;
}
static inline V vfnma(V a, V b, V c) {
  V r;
  for (int i = 0; i < W; i++) r.v[i] = fmaf(-a.v[i], b.v[i], c.v[i]);
  return r;
}
static inline float vhsum(V v) {  // pairwise, as a vector unit sums
  for (int w = W / 2; w > 0; w /= 2)
    for (int i = 0; i < w; i++) v.v[i] += v.v[i + w];
  return v.v[0];
}
static inline float vhmax(V v) {
  float m = v.v[0];
  for (int i = 1; i < W; i++) m = v.v[i] > m ? v.v[i] : m;
  return m;
}
static inline V vround(V v) {
  for (int i = 0; i < W; i++) v.v[i] = nearbyintf(v.v[i]);
  return v;
}
static inline V vscale2(V p, V k) {
  for (int i = 0; i < W; i++) p.v[i] = ldexpf(p.v[i], (int)k.v[i]);
  return p;
}
static inline V vload_bf16(const uint16_t *p) {
  V r;
  for (int i = 0; i < W; i++) r.v[i] = bf16_to_f32(p[i]);
  return r;
}
static inline V vload_i8(const int8_t *p) {
  V r;
  for (int i = 0; i < W; i++) r.v[i] = (float)p[i];
  return r;
}
static inline V vload_f16(const uint16_t *p) {
  V r;
  for (int i = 0; i < W; i++) r.v[i] = f16_to_f32(p[i]);
  return r;
}
#endif

#if !defined(LEVEL_AVX512) && !defined(LEVEL_AVX2)  // tails through a zero-padded copy
static inline V vloadn(const float *p, int64_t n) {
  float t[W] = {0};
  memcpy(t, p, n * sizeof(float));
  return vload(t);
}
static inline void vstoren(float *p, V v, int64_t n) {
  float t[W];
  vstore(t, v);
  memcpy(p, t, n * sizeof(float));
}
#endif
#if !defined(LEVEL_AVX512)
static inline V vload_bf16n(const uint16_t *p, int64_t n) {
  uint16_t t[W] = {0};
  memcpy(t, p, n * 2);
  return vload_bf16(t);
}
#endif
#if !defined(LEVEL_AVX512)
static inline V vload_i8n(const int8_t *p, int64_t n) {
  int8_t t[16] = {0};
  memcpy(t, p, n);
  return vload_i8(t);
}
#endif

// Software prefetches go to L2 (prefetcht1), not L1 (t0): on the 2-core Zen 4 a product's streams of
// prefetcht0 filled at ~15 GB/s (the L1's few outstanding misses), prefetcht1 at 22-43 GB/s (bf16, int8
// products over 30 matrices beyond the LLC, M = 1, 2 threads, 2026-12-02; docs/benchmarks.md, issue 22)
#if !defined(PREFETCH_LOCALITY)  // (-D to try another: 3 = prefetcht0, 2 = t1, 1 = t2, 0 = nta)
#define PREFETCH_LOCALITY 2
#endif
static inline void prefetch(const void *p) { __builtin_prefetch(p, 0, PREFETCH_LOCALITY); }
// INT4's tiles are one stream a thread, INT4_AHEAD bytes ahead: prefetcht0 keeps them in step (its products fell
// from 92-103% to 64-68% of the roof with prefetcht1 in the same run)
static inline void prefetch_l1(const void *p) { __builtin_prefetch(p, 0, 3); }
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

// Keeps a loaded vector in a register: without it GCC re-reads a block's weights from memory for every
// token row (a load per FMA, the loads then bound the product), or folds a load into each FMA
#if (defined(LEVEL_AVX512) || defined(LEVEL_AVX2)) && defined(__GNUC__)
#define in_register(v) __asm__("" : "+v"(v))
#elif defined(LEVEL_NEON) && defined(__GNUC__)
#define in_register(v) __asm__("" : "+w"(v))
#else
#define in_register(v) ((void)0)
#endif

// ---- the rows of this thread --------------------------------------------------------------------
static inline void my_rows(int64_t n, int64_t align, int64_t *r0, int64_t *r1) {
  int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  int64_t blocks = (n + align - 1) / align;
  int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
  *r0 = b0 * align < n ? b0 * align : n;
  *r1 = b1 * align < n ? b1 * align : n;
}

// ---- a product's input rows, as each format takes them (prepared once per product per thread) ---------
struct In {
  const float *x;  // m rows of ld fp32
  int64_t m, ld;
  uint16_t *xb;    // the rows rounded to bf16 (row stride ld)
  int16_t *xq;     // the rows as int16 (or int8) codes per group (row stride ld)
  float *xsum;     // per row and group: the sum of the inputs as the product takes them (stride ld / 8 + 2)
  float *xqs;      // per row and group: the scale of xq's codes (stride ld / 8 + 2)
};

static inline int64_t sums_ld(int64_t ld) { return ld / 8 + 2; }

// How each format takes its input rows at this level (the tests round their reference the same way)
static int input_rounding(int64_t fmt) {
  switch (fmt) {
    case BF16:
#if defined(HAVE_BF16_DOT)
      return X_BF16;
#else
      return X_EXACT;
#endif
    case INT8:
#if defined(HAVE_SDOT)
      return X_INT8;
#elif defined(LEVEL_AVX512) || defined(LEVEL_AVX2)
      return X_INT16;
#else
      return X_EXACT;
#endif
    case INT4:
#if defined(HAVE_VNNI)
      return X_INT8;
#elif defined(HAVE_BF16_DOT)
      return X_BF16;
#elif defined(LEVEL_AVX512) || defined(LEVEL_AVX2)
      return X_INT8;
#elif defined(HAVE_SDOT)
      return X_INT8;
#else
      return X_BF16;
#endif
    default:
      return X_EXACT;
  }
}

// xq: one code per input (int16: |code| <= 32767, int8 packed two to an int16 slot: |code| <= 127)
// with one scale per group of `group` inputs; xsum: the group's sum of the exact inputs
static void quantise_groups(const float *x, int64_t k, int64_t group, int bits, int16_t *xq, float *xqs, float *xsum) {
  const float top = bits == 16 ? 32767.0f : 127.0f;
  for (int64_t g = 0; g * group < k; g++) {
    const int64_t j0 = g * group, j1 = j0 + group < k ? j0 + group : k;
    float mx = 0, s = 0;
    for (int64_t j = j0; j < j1; j++) {
      float a = fabsf(x[j]);
      mx = a > mx ? a : mx;
      s += x[j];
    }
    const float scale = mx / top, inv = mx > 0 ? top / mx : 0.0f;
    xqs[g] = scale;
    xsum[g] = s;
    if (bits == 16)
      for (int64_t j = j0; j < j1; j++) xq[j] = (int16_t)lrintf(x[j] * inv);
    else
      for (int64_t j = j0; j < j1; j++) ((int8_t *)xq)[j] = (int8_t)lrintf(x[j] * inv);
  }
}

#if defined(LEVEL_AVX512)
// prepare's bf16 rounding 16 inputs at a time (each as f32_to_bf16 rounds it)
static inline __m512i bf16_bits(__m512 v) {  // in each lane's low half
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
}

// x (k inputs) rounded to bf16 into xb; with `sums`, each group's sum of the rounded inputs
static void round_bf16_row(const float *x, int64_t k, int64_t group, uint16_t *xb, float *sums) {
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) _mm256_storeu_si256((__m256i *)(xb + j), _mm512_cvtepi32_epi16(bf16_bits(vload(x + j))));
  for (; j < k; j++) xb[j] = f32_to_bf16(x[j]);
  if (sums)  // (in order, as the scalar loop: INT4's bits as before)
    for (int64_t g = 0; g < k / group; g++) {
      float a = 0;
      for (int64_t i = g * group; i < (g + 1) * group; i++) a += bf16_to_f32(xb[i]);
      sums[g] = a;
    }
}
#endif

#if defined(LEVEL_AVX512) || defined(LEVEL_AVX2)
// INT8's inputs: int16 codes per group of I8_GROUP (code = x * 32767 / max|x| of the group, rounded to
// nearest even, as quantise_groups rounds them), the group's scale max|x| / 32767 in xqs; no sums. Each
// group's int32 sums become fp32 once an output and token row (a conversion and an FMA): at 64 inputs a
// group that was as many instructions as the dot products; at 256 the products of several token rows
// compute 22-25% faster from L2 on a Zen 4 (one row 10%), each code still within max|x| / 65534 of its input
#define I8_GROUP 256

// codes per group of `group` inputs (the last group may be shorter), W inputs a vector: each group's
// scale max|x| / 32767 in xqs and, with xsum, the sum of its exact inputs (in the vector's order: the
// same for one row or many): INT8's, groups of I8_GROUP (a scalar loop took ~1 us a product a thread)
static void quantise_i16_groups(const float *x, int64_t k, int64_t group, int16_t *xq, float *xqs, float *xsum) {
  const V sign = vset1(-0.0f);
  for (int64_t j0 = 0, g = 0; j0 < k; j0 += group, g++) {
    const int64_t n = k - j0 < group ? k - j0 : group;
    V mx = vzero(), sum = vzero();
    for (int64_t j = 0; j < n; j += W) {
      const V v = j + W <= n ? vload(x + j0 + j) : vloadn(x + j0 + j, n - j);
#if defined(LEVEL_AVX512)
      mx = vmax(mx, _mm512_andnot_ps(sign, v));
#else
      mx = vmax(mx, _mm256_andnot_ps(sign, v));
#endif
      if (xsum) sum = vadd(sum, v);
    }
    const float top = vhmax(mx);
    xqs[g] = top / 32767.0f;
    if (xsum) xsum[g] = vhsum(sum);
    const V inv = vset1(top > 0 ? 32767.0f / top : 0.0f);
    int16_t *q = xq + j0;
    int64_t j = 0;
    for (; j + W <= n; j += W) {
#if defined(LEVEL_AVX512)
      _mm256_storeu_si256((__m256i *)(q + j), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(vmul(vload(x + j0 + j), inv))));
#else
      const __m256i c = _mm256_cvtps_epi32(vmul(vload(x + j0 + j), inv));  // |c| <= 32767: packs is exact
      _mm_storeu_si128((__m128i *)(q + j), _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1)));
#endif
    }
    for (; j < n; j++) q[j] = (int16_t)lrintf(x[j0 + j] * (top > 0 ? 32767.0f / top : 0.0f));
  }
}
#endif

#if (defined(HAVE_VNNI) || !defined(HAVE_BF16_DOT)) && (defined(LEVEL_AVX512) || defined(LEVEL_AVX2))
// INT4's inputs for vpdpbusd (AVX-512 VNNI) and vpmaddubsw (AVX2, AVX-512 without VNNI or bf16 dots): per
// group, int8 codes c = x * 127 /
// max|x| rounded to nearest even (as quantise_groups rounds them), each octet's in the order of a tile
// word's low nibbles (inputs 0, 4, 1, 5) then its high nibbles (2, 6, 3, 7); the scale max|x| / 127 in
// xqs, the group's sum of the exact inputs in xsum (eight lanes, then across them: the same for one
// row or many)
static void quantise_int4_octets(const float *x, int64_t k, int64_t group, int8_t *xq, float *xqs, float *xsum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m128i order = _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  for (int64_t g = 0; g * group < k; g++) {
    const int64_t j0 = g * group;
    __m256 mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < group; j += 8) {  // (a group is whole octets)
      const __m256 v = _mm256_loadu_ps(x + j0 + j);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
      sum = _mm256_add_ps(sum, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float top = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    xsum[g] = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
    xqs[g] = top / 127.0f;
    const __m256 inv = _mm256_set1_ps(top > 0 ? 127.0f / top : 0.0f);
    for (int64_t j = 0; j < group; j += 8) {
      const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j0 + j), inv));  // |c| <= 127
      const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
      _mm_storel_epi64((__m128i *)(xq + j0 + j), _mm_shuffle_epi8(_mm_packs_epi16(w, w), order));
    }
  }
}
#endif

static void prepare(struct In *in, const struct Mat *m) {
  const int rounding = input_rounding(m->fmt);
  const int64_t k = m->k, ls = sums_ld(in->ld);
  for (int64_t r = 0; r < in->m; r++) {
    const float *x = in->x + r * in->ld;
#if defined(LEVEL_AVX512)
    if (rounding == X_BF16) {
      round_bf16_row(x, k, m->group, in->xb + r * in->ld, m->fmt == INT4 ? in->xsum + r * ls : NULL);
      continue;
    }
#endif
    if (rounding == X_BF16) {
      uint16_t *xb = in->xb + r * in->ld;
      for (int64_t j = 0; j < k; j++) xb[j] = f32_to_bf16(x[j]);
      if (m->fmt == INT4)  // the sums of what the products multiply: x as rounded to bf16
        for (int64_t g = 0; g < k / m->group; g++) {
          float s = 0;
          for (int64_t j = g * m->group; j < (g + 1) * m->group; j++) s += bf16_to_f32(xb[j]);
          in->xsum[r * ls + g] = s;
        }
#if defined(LEVEL_AVX512) || defined(LEVEL_AVX2)
    } else if (rounding == X_INT16 && m->fmt == INT8) {
      quantise_i16_groups(x, k, I8_GROUP, in->xq + r * in->ld, in->xqs + r * ls, NULL);
#endif
#if (defined(HAVE_VNNI) || !defined(HAVE_BF16_DOT)) && (defined(LEVEL_AVX512) || defined(LEVEL_AVX2))
    } else if (rounding == X_INT8 && m->fmt == INT4) {
      quantise_int4_octets(x, k, m->group, (int8_t *)(in->xq + r * in->ld), in->xqs + r * ls, in->xsum + r * ls);
#endif
    } else if (rounding == X_INT16) {
      quantise_groups(x, k, m->group, 16, in->xq + r * in->ld, in->xqs + r * ls, in->xsum + r * ls);
    } else if (rounding == X_INT8) {
      quantise_groups(x, k, m->fmt == INT4 ? m->group : 32, 8, in->xq + r * in->ld, in->xqs + r * ls, in->xsum + r * ls);
    }
  }
}

// ---- floating-point and int8 rows: R weight rows against G token rows, one FMA chain per output --------
#define R 4           // weight rows a block reads side by side
// The hardware prefetchers lose track of four short rows read side by side, so each block asks for
// the same columns of the rows at least AHEAD_BYTES further on (a multiple of four rows: 4 rows of
// fp32 at K = 576, 16 of int8), one block running ahead in memory while this one computes.
#if !defined(AHEAD_BYTES)  // (-D to try another)
#define AHEAD_BYTES 8192
#endif
static inline int64_t ahead_rows(int64_t row_bytes) {
  const int64_t blocks = (AHEAD_BYTES + R * row_bytes - 1) / (R * row_bytes);
  return blocks < 1 ? R : blocks * R;
}
#if defined(LEVEL_AVX512) || defined(LEVEL_NEON)
#define G_MAX 6  // token rows per pass: 24 accumulators, 4 weight vectors and an input (of 32 registers)
#elif defined(LEVEL_AVX2)
#define G_MAX 2  // of 16
#else
#define G_MAX 1
#endif

// The passes of a block over m token rows, as even as G_MAX allows (8 rows: 4 + 4, not 6 + 2): pass p
// takes rows [pass_start(m, passes, p), pass_start(m, passes, p + 1))
static inline int64_t passes_of(int64_t m) { return (m + G_MAX - 1) / G_MAX; }
static inline int64_t pass_start(int64_t m, int64_t passes, int64_t p) { return m * p / passes; }

// What a pass prefetches: the same columns of the block `ahead_rows()` on (row 0 at p, null: none),
// every `every`-th cache line from the `first`-th: the passes of a block share its next one's lines, so
// memory streams while the later passes compute from L1 (one pass asking for all of them left the memory
// idle through the others)
struct Ahead {
  const char *p;
  int64_t row_bytes, bytes;  // a row's bytes and an element's, in the matrix's own format
  int every, first;
};
static inline struct Ahead no_ahead(void) { return Ahead{NULL, 0, 1, 1, 0}; }

// Whether column j's lines are this pass's to ask for (call for every column step, in order). Free
// functions, not a member of a struct holding the countdown: GCC 12 dropped every prefetch of that form
// (no prefetch instruction in the M > 1 products of fp32 and bf16 from session 8 to 24)
static ALWAYS_INLINE bool ahead_due(const struct Ahead &a, int64_t j, int &countdown) {
  if (!a.p || ((j * a.bytes) & 63) != 0 || countdown-- != 0) return false;
  countdown = a.every - 1;
  return true;
}
template <int RR>
static ALWAYS_INLINE void prefetch_rows(const char *p, int64_t row_bytes) {
  for (int i = 0; i < RR; i++) prefetch(p + i * row_bytes);
}

// out[g * R + i] = the sum of acc[g][i]'s lanes
template <int G, int RR>
static ALWAYS_INLINE void sums_out(V (*acc)[RR], float *out) {
#if defined(HAVE_VHSUM4)
  if (RR == 4) {
    for (int g = 0; g < G; g++) vhsum4(acc[g][0], acc[g][RR > 1 ? 1 : 0], acc[g][RR > 2 ? 2 : 0], acc[g][RR > 3 ? 3 : 0], out + g * R);
    return;
  }
#endif
  for (int g = 0; g < G; g++)
    for (int i = 0; i < RR; i++) out[g * R + i] = vhsum(acc[g][i]);
}

// the weight rows of a block as fp32 vectors: each format's loader (exact conversions)
struct F32Rows {
  const float *p[R];
  enum { BYTES = 4 };
  V load(int i, int64_t j) const { return vload(p[i] + j); }
  V loadn(int i, int64_t j, int64_t n) const { return vloadn(p[i] + j, n); }
};
struct BF16Rows {
  const uint16_t *p[R];
  enum { BYTES = 2 };
  V load(int i, int64_t j) const { return vload_bf16(p[i] + j); }
  V loadn(int i, int64_t j, int64_t n) const { return vload_bf16n(p[i] + j, n); }
};
struct I8Rows {
  const int8_t *p[R];
  enum { BYTES = 1 };
  V load(int i, int64_t j) const { return vload_i8(p[i] + j); }
  V loadn(int i, int64_t j, int64_t n) const { return vload_i8n(p[i] + j, n); }
};

// out[g * R + i] = sum_j w[i][j] x[g][j] for RR rows and G token rows (x rows ldx apart). The weights
// are loaded once a column step and each input once (in_register: not once per FMA)
template <int G, int RR, class Rows>
static inline void block_fma(const Rows &w, const float *x, int64_t ldx, int64_t k, float *out, const struct Ahead &ahead) {
  V acc[G][RR];
  for (int g = 0; g < G; g++)
    for (int i = 0; i < RR; i++) acc[g][i] = vzero();
  int countdown = ahead.first;
  int64_t j = 0;
  for (; j + W <= k; j += W) {
    if (ahead_due(ahead, j, countdown)) prefetch_rows<RR>(ahead.p + j * ahead.bytes, ahead.row_bytes);
    V wv[RR];
    for (int i = 0; i < RR; i++) {
      wv[i] = w.load(i, j);
      if (Rows::BYTES == 4) in_register(wv[i]);  // (a converted row is in a register already)
    }
    for (int g = 0; g < G; g++) {
      V xv = vload(x + g * ldx + j);
      in_register(xv);
      for (int i = 0; i < RR; i++) acc[g][i] = vfma(wv[i], xv, acc[g][i]);
    }
  }
  if (j < k) {
    V wv[RR];
    for (int i = 0; i < RR; i++) wv[i] = w.loadn(i, j, k - j);
    for (int g = 0; g < G; g++) {
      const V xv = vloadn(x + g * ldx + j, k - j);
      for (int i = 0; i < RR; i++) acc[g][i] = vfma(wv[i], xv, acc[g][i]);
    }
  }
  sums_out<G, RR>(acc, out);
}

// One token row (the one-token step): the loop as it was before the passes of several rows, the same
// operations in the same order as block_fma<1, RR> (the same bits; vhsum4 sums in vhsum's order), which
// GCC schedules better for one row (its loads folded into the FMAs, the prefetch test on constants)
template <int RR, class Rows>
static inline void block_fma_one(const Rows &w, const float *x, int64_t k, float *out, const char *ahead,
                                 int64_t row_bytes) {
  V acc[RR];
  for (int i = 0; i < RR; i++) acc[i] = vzero();
  int64_t j = 0;
  for (; j + W <= k; j += W) {
    if (ahead && ((j * Rows::BYTES) & 63) == 0)
      for (int i = 0; i < RR; i++) prefetch(ahead + i * row_bytes + j * Rows::BYTES);
    const V xv = vload(x + j);
    for (int i = 0; i < RR; i++) acc[i] = vfma(w.load(i, j), xv, acc[i]);
  }
  if (j < k) {
    const V xv = vloadn(x + j, k - j);
    for (int i = 0; i < RR; i++) acc[i] = vfma(w.loadn(i, j, k - j), xv, acc[i]);
  }
  for (int i = 0; i < RR; i++) out[i] = vhsum(acc[i]);
}

template <int RR, class Rows>
static inline void block_fma_rows(const Rows &w, const float *x, int64_t ldx, int64_t k, int64_t g_rows, float *out,
                                  const struct Ahead &ahead) {
  switch (g_rows) {  // G_MAX >= every case taken
#if G_MAX >= 6
    case 6: block_fma<6, RR>(w, x, ldx, k, out, ahead); break;
    case 5: block_fma<5, RR>(w, x, ldx, k, out, ahead); break;
    case 4: block_fma<4, RR>(w, x, ldx, k, out, ahead); break;
    case 3: block_fma<3, RR>(w, x, ldx, k, out, ahead); break;
#endif
#if G_MAX >= 2
    case 2: block_fma<2, RR>(w, x, ldx, k, out, ahead); break;
#endif
    default: block_fma<1, RR>(w, x, ldx, k, out, ahead); break;
  }
}

// A block of RR weight rows against every token row. One pass when the rows fit the registers;
// otherwise a format that converts (bf16, int8) is converted once into `wbuf` (fp32, in L1/L2) and the
// passes read that, and fp32 rows are re-read from cache: the same values in the same order either way.
template <int RR, class Rows>
static void rows_times_tokens(const Rows &w, const struct In *in, int64_t k, float *out, float *wbuf,
                              const char *ahead, int64_t row_bytes) {
  const int64_t m = in->m, passes = passes_of(m);
  if (m == 1) {
    block_fma_one<RR>(w, in->x, k, out, ahead, row_bytes);
    return;
  }
  if (passes == 1) {
    block_fma_rows<RR>(w, in->x, in->ld, k, m, out, Ahead{ahead, row_bytes, Rows::BYTES, 1, 0});
    return;
  }
  const int64_t ldb = (k + W - 1) / W * W;
  F32Rows fb;
  if (Rows::BYTES == 4) {
    for (int i = 0; i < R; i++) fb.p[i] = (const float *)w.p[i < RR ? i : 0];
  } else {
    int64_t j = 0;
    for (; j + W <= k; j += W)
      for (int i = 0; i < RR; i++) vstore(wbuf + i * ldb + j, w.load(i, j));
    if (j < k)
      for (int i = 0; i < RR; i++) vstore(wbuf + i * ldb + j, w.loadn(i, j, k - j));
    for (int i = 0; i < R; i++) fb.p[i] = wbuf + (i < RR ? i : 0) * ldb;
  }
  for (int64_t p = 0; p < passes; p++) {
    const int64_t m0 = pass_start(m, passes, p), m1 = pass_start(m, passes, p + 1);
    block_fma_rows<RR>(fb, in->x + m0 * in->ld, in->ld, k, m1 - m0, out + m0 * R,
                       Ahead{ahead, row_bytes, Rows::BYTES, (int)passes, (int)p});
  }
}

// y[t * ldy + r] = scale(r) * W[r] . x[t] for rows [r0, r1) and every token row t
template <class Rows, class MakeRows>
static void gemm_rows(const struct Mat *mt, const struct In *in, float *y, int64_t ldy, int64_t r0, int64_t r1,
                      float *wbuf, MakeRows make) {
  const int64_t k = mt->k, row_bytes = k * Rows::BYTES;
  float out[MAX_ROWS * R];
  const uint16_t *scale = mt->fmt == INT8 ? (const uint16_t *)mt->scale : NULL;
  for (int64_t r = r0; r < r1;) {
    const int rr = r + R <= r1 ? R : 1;
    const Rows w = make(r);
    const char *ahead = (const char *)mt->w + (r + ahead_rows(row_bytes)) * row_bytes;
    if (rr == R)
      rows_times_tokens<R>(w, in, k, out, wbuf, ahead, row_bytes);
    else
      rows_times_tokens<1>(w, in, k, out, wbuf, NULL, row_bytes);
    for (int64_t t = 0; t < in->m; t++)
      for (int i = 0; i < rr; i++)
        y[t * ldy + r + i] = scale ? out[t * R + i] * bf16_to_f32(scale[r + i]) : out[t * R + i];
    r += rr;
  }
}

#if defined(HAVE_BF16_DOT)
// bf16 weights against the token rows rounded to bf16, two products a lane per instruction
#if defined(LEVEL_AVX512)
#define DOT_STEP 32
typedef __m512 DotAcc;
typedef __m512i DotIn;
static inline DotAcc dot_zero(void) { return _mm512_setzero_ps(); }
static inline DotIn dot_load(const uint16_t *p) { return _mm512_loadu_si512(p); }
static inline DotAcc dot_step(DotAcc a, DotIn w, DotIn x) { return _mm512_dpbf16_ps(a, (__m512bh)w, (__m512bh)x); }
static inline DotAcc dot_stepn(DotAcc a, const uint16_t *w, const uint16_t *x, int64_t n) {
  const __mmask32 mk = (__mmask32)((1ull << n) - 1);
  return _mm512_dpbf16_ps(a, (__m512bh)_mm512_maskz_loadu_epi16(mk, w), (__m512bh)_mm512_maskz_loadu_epi16(mk, x));
}
static inline float dot_sum(DotAcc a) { return vhsum(a); }
#else
#define DOT_STEP 8
typedef float32x4_t DotAcc;
typedef uint16x8_t DotIn;
static inline DotAcc dot_zero(void) { return vdupq_n_f32(0.0f); }
static inline DotIn dot_load(const uint16_t *p) { return vld1q_u16(p); }
static inline DotAcc dot_step(DotAcc a, DotIn w, DotIn x) {
  return vbfdotq_f32(a, vreinterpretq_bf16_u16(w), vreinterpretq_bf16_u16(x));
}
static inline DotAcc dot_stepn(DotAcc a, const uint16_t *w, const uint16_t *x, int64_t n) {
  uint16_t tw[8] = {0}, tx[8] = {0};
  memcpy(tw, w, n * 2);
  memcpy(tx, x, n * 2);
  return dot_step(a, dot_load(tw), dot_load(tx));
}
static inline float dot_sum(DotAcc a) { return vaddvq_f32(a); }
#endif

template <int G, int RR>
static inline void block_bf16dot(const uint16_t *const *w, const uint16_t *xb, int64_t ldx, int64_t k, float *out,
                                 const struct Ahead &ahead) {
  DotAcc acc[G][RR];
  for (int g = 0; g < G; g++)
    for (int i = 0; i < RR; i++) acc[g][i] = dot_zero();
  int countdown = ahead.first;
  int64_t j = 0;
  for (; j + DOT_STEP <= k; j += DOT_STEP) {
    if (ahead_due(ahead, j, countdown)) prefetch_rows<RR>(ahead.p + j * ahead.bytes, ahead.row_bytes);
    DotIn wv[RR];
    for (int i = 0; i < RR; i++) {
      wv[i] = dot_load(w[i] + j);
      in_register(wv[i]);
    }
    for (int g = 0; g < G; g++) {
      DotIn xv = dot_load(xb + g * ldx + j);
      in_register(xv);
      for (int i = 0; i < RR; i++) acc[g][i] = dot_step(acc[g][i], wv[i], xv);
    }
  }
  if (j < k)
    for (int g = 0; g < G; g++)
      for (int i = 0; i < RR; i++) acc[g][i] = dot_stepn(acc[g][i], w[i] + j, xb + g * ldx + j, k - j);
#if defined(LEVEL_AVX512)
  sums_out<G, RR>(acc, out);  // (DotAcc is V: dot_sum is vhsum)
#else
  for (int g = 0; g < G; g++)
    for (int i = 0; i < RR; i++) out[g * R + i] = dot_sum(acc[g][i]);
#endif
}

// one token row: the loop as it was before the passes (as block_fma_one is block_fma's)
template <int RR>
static inline void block_bf16dot_one(const uint16_t *const *w, const uint16_t *xb, int64_t k, float *out, const char *ahead,
                                     int64_t row_bytes) {
  DotAcc acc[RR];
  for (int i = 0; i < RR; i++) acc[i] = dot_zero();
  int64_t j = 0;
  for (; j + DOT_STEP <= k; j += DOT_STEP) {
    if (ahead && ((j * 2) & 63) == 0)
      for (int i = 0; i < RR; i++) prefetch(ahead + i * row_bytes + 2 * j);
    for (int i = 0; i < RR; i++) acc[i] = dot_step(acc[i], dot_load(w[i] + j), dot_load(xb + j));
  }
  if (j < k)
    for (int i = 0; i < RR; i++) acc[i] = dot_stepn(acc[i], w[i] + j, xb + j, k - j);
  for (int i = 0; i < RR; i++) out[i] = dot_sum(acc[i]);
}

template <int RR>
static inline void bf16dot_rows(const uint16_t *const *w, const uint16_t *xb, int64_t ldx, int64_t k, int64_t g_rows,
                                float *out, const struct Ahead &ahead) {
  switch (g_rows) {
#if G_MAX >= 6
    case 6: block_bf16dot<6, RR>(w, xb, ldx, k, out, ahead); break;
    case 5: block_bf16dot<5, RR>(w, xb, ldx, k, out, ahead); break;
    case 4: block_bf16dot<4, RR>(w, xb, ldx, k, out, ahead); break;
    case 3: block_bf16dot<3, RR>(w, xb, ldx, k, out, ahead); break;
#endif
#if G_MAX >= 2
    case 2: block_bf16dot<2, RR>(w, xb, ldx, k, out, ahead); break;
#endif
    default: block_bf16dot<1, RR>(w, xb, ldx, k, out, ahead); break;
  }
}

static void gemm_bf16dot(const struct Mat *mt, const struct In *in, float *y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t k = mt->k, passes = passes_of(in->m);
  const uint16_t *base = (const uint16_t *)mt->w;
  float out[MAX_ROWS * R];
  for (int64_t r = r0; r < r1;) {
    const int rr = r + R <= r1 ? R : 1;
    const uint16_t *w[R];
    for (int i = 0; i < R; i++) w[i] = base + (r + (i < rr ? i : 0)) * k;
    const char *ahead = (const char *)(base + (r + ahead_rows(2 * k)) * k);
    if (in->m == 1) {
      if (rr == R)
        block_bf16dot_one<R>(w, in->xb, k, out, ahead, 2 * k);
      else
        block_bf16dot_one<1>(w, in->xb, k, out, NULL, 2 * k);
    }
    for (int64_t p = 0; p < passes && in->m > 1; p++) {  // later passes read the rows from L1/L2
      const int64_t m0 = pass_start(in->m, passes, p), m1 = pass_start(in->m, passes, p + 1);
      const uint16_t *xb = in->xb + m0 * in->ld;
      if (rr == R)
        bf16dot_rows<R>(w, xb, in->ld, k, m1 - m0, out + m0 * R, Ahead{ahead, 2 * k, 2, (int)passes, (int)p});
      else
        bf16dot_rows<1>(w, xb, in->ld, k, m1 - m0, out + m0 * R, no_ahead());
    }
    for (int64_t t = 0; t < in->m; t++)
      for (int i = 0; i < rr; i++) y[t * ldy + r + i] = out[t * R + i];
    r += rr;
  }
}
#endif

#if defined(HAVE_SDOT)
// int8 weights against token rows quantised to int8 per block of 32 (SDOT: four products a lane)
static inline float sdot_row(const int8_t *q, const int8_t *xq, const float *xqs, int64_t k) {
  float32x4_t acc = vdupq_n_f32(0.0f);
  int64_t j = 0, b = 0;
  for (; j + 32 <= k; j += 32, b++) {
    int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(q + j), vld1q_s8(xq + j));
    s = vdotq_s32(s, vld1q_s8(q + j + 16), vld1q_s8(xq + j + 16));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(s), vdupq_n_f32(xqs[b]));
  }
  if (j < k) {
    int8_t tq[32] = {0}, tx[32] = {0};
    memcpy(tq, q + j, k - j);
    memcpy(tx, xq + j, k - j);
    int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(tq), vld1q_s8(tx));
    s = vdotq_s32(s, vld1q_s8(tq + 16), vld1q_s8(tx + 16));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(s), vdupq_n_f32(xqs[b]));
  }
  return vaddvq_f32(acc);
}

static void gemm_int8_sdot(const struct Mat *mt, const struct In *in, float *y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t k = mt->k, ls = sums_ld(in->ld);
  const int8_t *q = (const int8_t *)mt->w;
  const uint16_t *scale = (const uint16_t *)mt->scale;
  for (int64_t r = r0; r < r1; r++) {  // the row (k bytes) stays in L1 across the token rows
    prefetch(q + (r + ahead_rows(k)) * k);
    for (int64_t t = 0; t < in->m; t++)
      y[t * ldy + r] = sdot_row(q + r * k, (const int8_t *)(in->xq + t * in->ld), in->xqs + t * ls, k) *
                       bf16_to_f32(scale[r]);
  }
}
#endif

#if defined(LEVEL_AVX512) || defined(LEVEL_AVX2)
// int8 weights against the token rows' int16 codes (quantise_i16_groups): the codes sign-extended to int16
// (one instruction a vector) and multiplied pairwise into int32 lanes (vpdpwssd where AVX512-VNNI,
// else vpmaddwd + vpaddd): half the instructions per product of the int8 -> int32 -> fp32 widening and
// an FMA. Each group's int32 sums (at most I8_GROUP / 2 pairs of |code| products <= 32767 * 127 a
// lane, < 2^31: exact) become fp32 once, times the group's scale, into an fp32 chain per output; the row's own
// scale multiplies the sum. One chain per output whatever the token rows (the same bits alone or among
// others); `ahead`: the first pass prefetches the block AHEAD_BYTES on.
#if defined(LEVEL_AVX512)
#define I8_STEP 32  // inputs a vector
#define I8_G 2      // token rows a pass: 16 accumulators, 4 weight vectors and an input (of 32 registers)
typedef __m512i IV;
static inline __mmask32 mask32(int64_t n) { return n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1); }
static inline IV i8_wide(const int8_t *p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)); }
static inline IV i8_widen(const int8_t *p, int64_t n) { return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask32(n), p)); }
static inline IV i16_load(const int16_t *p) { return _mm512_loadu_si512(p); }
static inline IV i16_loadn(const int16_t *p, int64_t n) { return _mm512_maskz_loadu_epi16(mask32(n), p); }
static inline IV izero(void) { return _mm512_setzero_si512(); }
#if defined(__AVX512VNNI__)
static inline IV idot(IV a, IV w, IV x) { return _mm512_dpwssd_epi32(a, w, x); }
#else
static inline IV idot(IV a, IV w, IV x) { return _mm512_add_epi32(a, _mm512_madd_epi16(w, x)); }
#endif
static inline V itof(IV a) { return _mm512_cvtepi32_ps(a); }
#else
#define I8_STEP 16
#define I8_G 1  // 8 accumulators, 4 weight vectors and an input (of 16 registers)
typedef __m256i IV;
static inline IV i8_wide(const int8_t *p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)); }
static inline IV i8_widen(const int8_t *p, int64_t n) {
  int8_t t[16] = {0};
  memcpy(t, p, n);
  return i8_wide(t);
}
static inline IV i16_load(const int16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline IV i16_loadn(const int16_t *p, int64_t n) {
  int16_t t[16] = {0};
  memcpy(t, p, n * 2);
  return i16_load(t);
}
static inline IV izero(void) { return _mm256_setzero_si256(); }
#if defined(__AVXVNNI__)
static inline IV idot(IV a, IV w, IV x) { return _mm256_dpwssd_avx_epi32(a, w, x); }
#else
static inline IV idot(IV a, IV w, IV x) { return _mm256_add_epi32(a, _mm256_madd_epi16(w, x)); }
#endif
static inline V itof(IV a) { return _mm256_cvtepi32_ps(a); }
#endif

template <int G, int RR>
static inline void block_i8i16(const int8_t *const *w, const struct In *in, int64_t t0, int64_t k, float *out,
                               const char *ahead, int64_t row_bytes) {
  const int64_t ls = sums_ld(in->ld);
  const int16_t *xq[G];
  for (int r = 0; r < G; r++) xq[r] = in->xq + (t0 + r) * in->ld;
  V acc[G][RR];
  for (int r = 0; r < G; r++)
    for (int i = 0; i < RR; i++) acc[r][i] = vzero();
  for (int64_t j0 = 0, g = 0; j0 < k; j0 += I8_GROUP, g++) {
    const int64_t j1 = j0 + I8_GROUP < k ? j0 + I8_GROUP : k;
    IV s[G][RR];
    for (int r = 0; r < G; r++)
      for (int i = 0; i < RR; i++) s[r][i] = izero();
    int64_t j = j0;
    for (; j + I8_STEP <= j1; j += I8_STEP) {
      if (ahead && (j & 63) == 0)
        for (int i = 0; i < RR; i++) prefetch(ahead + i * row_bytes + j);
      IV wv[RR];
      for (int i = 0; i < RR; i++) wv[i] = i8_wide(w[i] + j);
      for (int r = 0; r < G; r++) {
        IV xv = i16_load(xq[r] + j);
        in_register(xv);
        for (int i = 0; i < RR; i++) s[r][i] = idot(s[r][i], wv[i], xv);
      }
    }
    if (j < j1) {  // the row's last inputs (k not a multiple of I8_STEP)
      IV wv[RR];
      for (int i = 0; i < RR; i++) wv[i] = i8_widen(w[i] + j, j1 - j);
      for (int r = 0; r < G; r++) {
        const IV xv = i16_loadn(xq[r] + j, j1 - j);
        for (int i = 0; i < RR; i++) s[r][i] = idot(s[r][i], wv[i], xv);
      }
    }
    for (int r = 0; r < G; r++) {
      const V xs = vset1(in->xqs[(t0 + r) * ls + g]);
      for (int i = 0; i < RR; i++) acc[r][i] = vfma(itof(s[r][i]), xs, acc[r][i]);
    }
  }
  float o[G * R];
  sums_out<G, RR>(acc, o);
  for (int r = 0; r < G; r++)
    for (int i = 0; i < RR; i++) out[(t0 + r) * R + i] = o[r * R + i];
}

template <int RR>
static void i8i16_rows(const int8_t *const *w, const struct In *in, int64_t k, float *out, const char *ahead,
                       int64_t row_bytes) {
  const int64_t m = in->m, passes = (m + I8_G - 1) / I8_G;
  for (int64_t p = 0; p < passes; p++) {  // later passes read the block from L1
    const int64_t m0 = m * p / passes, rows = m * (p + 1) / passes - m0;
    const char *a = p == 0 ? ahead : NULL;
#if I8_G >= 2
    if (rows == 2) {
      block_i8i16<2, RR>(w, in, m0, k, out, a, row_bytes);
      continue;
    }
#endif
    for (int64_t t = 0; t < rows; t++) block_i8i16<1, RR>(w, in, m0 + t, k, out, t == 0 ? a : NULL, row_bytes);
  }
}

static void gemm_int8_i16(const struct Mat *mt, const struct In *in, float *y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t k = mt->k;
  const int8_t *q = (const int8_t *)mt->w;
  const uint16_t *scale = (const uint16_t *)mt->scale;
  float out[MAX_ROWS * R];
  for (int64_t r = r0; r < r1;) {
    const int rr = r + R <= r1 ? R : 1;
    const int8_t *w[R];
    for (int i = 0; i < R; i++) w[i] = q + (r + (i < rr ? i : 0)) * k;
    if (rr == R)
      i8i16_rows<R>(w, in, k, out, (const char *)(q + (r + ahead_rows(k)) * k), k);
    else
      i8i16_rows<1>(w, in, k, out, NULL, k);
    for (int64_t t = 0; t < in->m; t++)
      for (int i = 0; i < rr; i++) y[t * ldy + r + i] = out[t * R + i] * bf16_to_f32(scale[r + i]);
    r += rr;
  }
}
#endif

// ---- INT4 tiles: the 16 rows of a tile are vector lanes; each token row keeps 16 accumulators ----------
// Bytes of codes ahead of the octet being read that each octet asks for (-D to try another). AVX2's product
// takes twice AVX-512's instructions an octet; 4096 ahead made its one-token INT4 step 4-6% faster than 2048
// on a Zen 5 (the step in one process, two libraries alternating: docs/benchmarks.md, session 23), where
// AVX-512's moved within the noise
// ... and INT4_L2_AHEAD bytes ahead into L2 as well (prefetcht1; session 26 measured it 22-33% faster from memory
// in a one-thread harness and not in the step, in the host's slow memory mode; session 28, the step at one row
// with and without, builds alternating: AVX-512 VNNI 0.89x in the fast mode (8 rounds), 0.96x in the slow (24),
// five and sixteen rows 0.97x / 0.96x; AVX2 0.97x in the fast mode (30): docs/benchmarks.md)
#if !defined(INT4_L2_AHEAD)
#define INT4_L2_AHEAD 8192
#endif
#if !defined(INT4_AHEAD) && defined(LEVEL_AVX2)
#define INT4_AHEAD 4096
#elif !defined(INT4_AHEAD)
#define INT4_AHEAD 2048
#endif
// Per group of inputs: sum = sum_j code[j] x[j] over the group (each level its own way), then
// acc += sum * scale + min * xsum. `acc` is (m, 16) fp32.
#define INT4_G 4  // token rows per pass over a group's codes

#if defined(HAVE_VNNI)
// vpdpbusd: a tile word's low nibbles (bytes 0..3 of word & 0x0F0F0F0F: inputs 0, 4, 1, 5 of the
// octet) and high nibbles (2, 6, 3, 7) as unsigned bytes, times the token row's int8 input codes in
// that order (quantise_int4_octets), four products a lane summed into int32: exact integer sums per
// group, whatever the order, scaled once. Two logic ops and two dot products per 128 weights a row.
// (Until session 26 the inputs were 15-bit codes as two bytes, twice the dot products: a five-row
// verify step took 1.7-2.1x a one-row step, 1.3-1.9x now; perplexity through the step +0.8%, the same
// scheme as AVX2's and SDOT's: docs/benchmarks.md.)
static ALWAYS_INLINE void int4_bytes(const uint8_t *p, int64_t j, __m512i *c) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i v = _mm512_loadu_si512(p + 64 * j);
  prefetch_l1(p + 64 * j + INT4_AHEAD);
  prefetch(p + 64 * j + INT4_L2_AHEAD);
  c[0] = _mm512_and_si512(v, low4);
  c[1] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
}

// one octet's two code vectors times a token row's eight input codes at xp (quantise_int4_octets)
// (GCC 12 copied each accumulator to another register and back around every _mm512_dpbusd_epi32 of a
// multi-row tile: 14 register copies an octet for five rows; the instruction written out, its four input
// bytes broadcast from memory, took 3-8% less time a product from L2 on a Zen 4. Other compilers: the intrinsic)
#if defined(__GNUC__) && !defined(__clang__)
#define DPBUSD_X4(acc, codes, x4) \
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*(const uint32_t *)(x4)))
#else
#define DPBUSD_X4(acc, codes, x4) acc = _mm512_dpbusd_epi32(acc, codes, _mm512_set1_epi32((int)load_u32(x4)))
#endif
static ALWAYS_INLINE void int4_octet(const __m512i *c, const uint8_t *xp, __m512i &sum) {
  DPBUSD_X4(sum, c[0], xp);
  DPBUSD_X4(sum, c[1], xp + 4);
}

// a group's sums into a row's 16 outputs: a + sum x scale x the inputs' scale + min x their sum
static ALWAYS_INLINE __m512 int4_scaled(__m512 a, __m512i sum, __m512 d, __m512 mn, float xqs, float xsum) {
  a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(xqs)), a);
  return _mm512_fmadd_ps(mn, _mm512_set1_ps(xsum), a);
}

// a group's sums code x input code for G token rows (exact in int32: |sum| <= 15 x 127 x group); the
// codes held in registers across the rows (GCC otherwise loaded them again for each row's dot products)
template <int G>
static ALWAYS_INLINE void int4_sums(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                                    int64_t group, __m512i *sum) {
  for (int r = 0; r < G; r++) sum[r] = _mm512_setzero_si512();
  for (int64_t j = 0; j < octets; j++) {
    __m512i c[2];
    int4_bytes(p, j, c);
    for (int b = 0; b < 2; b++) in_register(c[b]);
    for (int r = 0; r < G; r++) int4_octet(c, (const uint8_t *)(in->xq + (t0 + r) * in->ld) + g * group + 8 * j, sum[r]);
  }
}

// one group for G token rows, their outputs in memory (the one-row step; int4_tile takes more rows)
template <int G>
static inline void int4_group(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                              int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const __m512i *unpacked) {
  (void)unpacked;  // (INT4_TILES: no pass reads unpacked codes)
  __m512i sum[G];
  int4_sums<G>(p, octets, in, t0, g, group, sum);
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(st + g * 16)));
  const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mt + g * 16)));
  const int64_t ls = sums_ld(in->ld);
  for (int r = 0; r < G; r++) {
    float *ap = acc + (t0 + r) * 16;
    _mm512_storeu_ps(ap, int4_scaled(_mm512_loadu_ps(ap), sum[r], d, mn, in->xqs[(t0 + r) * ls + g],
                                     in->xsum[(t0 + r) * ls + g]));
  }
}

typedef __m512i Unpacked;  // (the scratch's size: int4_tile reads the codes themselves)
#define UNPACKED_PER_OCTET 2

// A whole tile for G token rows, their accumulators in registers across the groups (int4_group's
// operations in its order: the same bits), up to six rows a pass: 12 accumulators, two codes and
// the constants of 32 registers, so a five-row verify step is one pass over the tile's codes
#define INT4_TILES 1
#define INT4_TILE_G 6
template <int G>
static inline void int4_tile(const uint8_t *p, int64_t groups, int64_t octets, const struct In *in, int64_t t0,
                             int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const __m512i *unpacked) {
  (void)unpacked;
  const int64_t ls = sums_ld(in->ld);
  __m512 a[G];
  for (int r = 0; r < G; r++) a[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++, p += 64 * octets) {
    __m512i sum[G];
    int4_sums<G>(p, octets, in, t0, g, group, sum);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(st + g * 16)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mt + g * 16)));
    for (int r = 0; r < G; r++)
      a[r] = int4_scaled(a[r], sum[r], d, mn, in->xqs[(t0 + r) * ls + g], in->xsum[(t0 + r) * ls + g]);
  }
  for (int r = 0; r < G; r++) _mm512_storeu_ps(acc + (t0 + r) * 16, a[r]);
}

#elif defined(LEVEL_AVX512) && defined(HAVE_BF16_DOT)
// code c becomes the bf16 number 128 + c by setting the exponent bits (c | 0x4300): one logic op,
// exact; the 128 * sum(x) it adds to each group's sum comes off with the mins' term. Two chains per
// token row: the products of an octet do not wait on each other.
// the 64 bytes of octet j of a group (16 rows' words) as four vectors of bf16 numbers 128 + code, one per
// nibble pair (inputs 2a, 2a + 1 of the octet in each word's halves), the octet INT4_AHEAD bytes on prefetched
static ALWAYS_INLINE void int4_nibbles(const uint8_t *p, int64_t j, __m512i *c) {
  const __m512i low4 = _mm512_set1_epi32(0x000F000F), exponent = _mm512_set1_epi32(0x43004300);
  const __m512i v = _mm512_loadu_si512(p + 64 * j);
  prefetch_l1(p + 64 * j + INT4_AHEAD);
  c[0] = _mm512_ternarylogic_epi32(v, low4, exponent, 0xEA);  // (v & mask) | 0x4300 per word
  c[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 4), low4, exponent, 0xEA);
  c[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 8), low4, exponent, 0xEA);
  c[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 12), low4, exponent, 0xEA);
}

template <int G>
static inline void int4_group(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                              int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const __m512i *unpacked) {
  __m512 s0[G], s1[G];
  for (int r = 0; r < G; r++) s0[r] = s1[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < octets; j++) {
    __m512i c[4];
    if (unpacked) {
      for (int a = 0; a < 4; a++) c[a] = unpacked[4 * j + a];
    } else {
      int4_nibbles(p, j, c);
    }
    for (int r = 0; r < G; r++) {
      const uint32_t *xp = (const uint32_t *)(in->xb + (t0 + r) * in->ld + g * group) + 4 * j;  // input pairs
      s0[r] = _mm512_dpbf16_ps(s0[r], (__m512bh)c[0], (__m512bh)_mm512_set1_epi32((int)xp[0]));
      s1[r] = _mm512_dpbf16_ps(s1[r], (__m512bh)c[1], (__m512bh)_mm512_set1_epi32((int)xp[1]));
      s0[r] = _mm512_dpbf16_ps(s0[r], (__m512bh)c[2], (__m512bh)_mm512_set1_epi32((int)xp[2]));
      s1[r] = _mm512_dpbf16_ps(s1[r], (__m512bh)c[3], (__m512bh)_mm512_set1_epi32((int)xp[3]));
    }
  }
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(st + g * 16)));
  const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mt + g * 16)));
  const __m512 corr = _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), d, mn);  // min - 128 scale
  const int64_t ls = sums_ld(in->ld);
  for (int r = 0; r < G; r++) {
    __m512 a = _mm512_loadu_ps(acc + (t0 + r) * 16);
    a = _mm512_fmadd_ps(_mm512_add_ps(s0[r], s1[r]), d, a);
    a = _mm512_fmadd_ps(corr, _mm512_set1_ps(in->xsum[(t0 + r) * ls + g]), a);
    _mm512_storeu_ps(acc + (t0 + r) * 16, a);
  }
}

static inline void int4_unpack(const uint8_t *p, int64_t octets, __m512i *out) {
  for (int64_t j = 0; j < octets; j++) int4_nibbles(p, j, out + 4 * j);
}
typedef __m512i Unpacked;
#define UNPACKED_PER_OCTET 4

// A whole tile for G token rows, their accumulators in registers across the groups (the same operations
// in the same order as int4_group's, which keeps them in memory: a load and a store per row and group
// less, and six rows a pass instead of four, so a five-row verify step is one pass)
#define INT4_TILES 1
#define INT4_TILE_G 6  // token rows a pass: 18 accumulators, four codes and the constants (of 32 registers)
template <int G>
static inline void int4_tile(const uint8_t *p, int64_t groups, int64_t octets, const struct In *in, int64_t t0,
                             int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const __m512i *unpacked) {
  const int64_t ls = sums_ld(in->ld);
  __m512 a[G];
  for (int r = 0; r < G; r++) a[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++, p += 64 * octets) {
    __m512 s0[G], s1[G];
    for (int r = 0; r < G; r++) s0[r] = s1[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < octets; j++) {
      __m512i c[4];
      if (unpacked) {
        for (int b = 0; b < 4; b++) c[b] = unpacked[4 * (g * octets + j) + b];
      } else {
        int4_nibbles(p, j, c);
      }
      for (int b = 0; b < 4; b++) in_register(c[b]);
      for (int r = 0; r < G; r++) {
        const uint32_t *xp = (const uint32_t *)(in->xb + (t0 + r) * in->ld + g * group) + 4 * j;
        s0[r] = _mm512_dpbf16_ps(s0[r], (__m512bh)c[0], (__m512bh)_mm512_set1_epi32((int)xp[0]));
        s1[r] = _mm512_dpbf16_ps(s1[r], (__m512bh)c[1], (__m512bh)_mm512_set1_epi32((int)xp[1]));
        s0[r] = _mm512_dpbf16_ps(s0[r], (__m512bh)c[2], (__m512bh)_mm512_set1_epi32((int)xp[2]));
        s1[r] = _mm512_dpbf16_ps(s1[r], (__m512bh)c[3], (__m512bh)_mm512_set1_epi32((int)xp[3]));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(st + g * 16)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mt + g * 16)));
    const __m512 corr = _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), d, mn);
    for (int r = 0; r < G; r++) {
      a[r] = _mm512_fmadd_ps(_mm512_add_ps(s0[r], s1[r]), d, a[r]);
      a[r] = _mm512_fmadd_ps(corr, _mm512_set1_ps(in->xsum[(t0 + r) * ls + g]), a[r]);
    }
  }
  for (int r = 0; r < G; r++) _mm512_storeu_ps(acc + (t0 + r) * 16, a[r]);
}

#elif defined(LEVEL_AVX512) || defined(LEVEL_AVX2)
// vpmaddubsw: each row's word split into its low nibbles (inputs 0, 4, 1, 5 in bytes 0..3) and high
// nibbles (2, 6, 3, 7), unsigned bytes against the token row's int8 codes in that order
// (quantise_int4_octets), adjacent products summed into int16: at most 2 x 15 x 127 = 3810 a lane
// and instruction, so the int16 sums of INT4_OCTETS_16 octets (|s| <= 30480) cannot saturate; then
// widened by vpmaddwd with ones, converted and scaled. Half the instructions an octet of the int16
// codes by vpmaddwd it replaced. Eight rows a 256-bit vector, two per tile.
#define INT4_OCTETS_16 4

// the int16 sums of octets [j0, j1) of group g for G token rows from t0, each row's two halves of the
// tile (eight outputs each); the codes from `unpacked` where given, else unpacked from p
template <int G>
static ALWAYS_INLINE void int4_chunk(const uint8_t *p, int64_t j0, int64_t j1, const struct In *in, int64_t t0, int64_t g,
                                     int64_t group, const __m256i *unpacked, __m256i (*s)[2]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int r = 0; r < G; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
  for (int64_t j = j0; j < j1; j++) {
    __m256i xl[G], xh[G];  // the row's eight input codes: four for the low nibbles, four for the high
    for (int r = 0; r < G; r++) {
      const int32_t *xp = (const int32_t *)((const int8_t *)(in->xq + (t0 + r) * in->ld) + g * group) + 2 * j;
      xl[r] = _mm256_set1_epi32(xp[0]), xh[r] = _mm256_set1_epi32(xp[1]);
    }
    for (int h = 0; h < 2; h++) {
      __m256i cl, ch;
      if (unpacked) {
        cl = unpacked[4 * j + 2 * h], ch = unpacked[4 * j + 2 * h + 1];
      } else {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * j + 32 * h));
        if (h == 0) {
          prefetch_l1(p + 64 * j + INT4_AHEAD);
          prefetch(p + 64 * j + INT4_L2_AHEAD);
        }
        cl = _mm256_and_si256(v, low4);
        ch = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      }
      for (int r = 0; r < G; r++)
        s[r][h] = _mm256_add_epi16(s[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(cl, xl[r]), _mm256_maddubs_epi16(ch, xh[r])));
    }
  }
}

template <int G>
static inline void int4_group(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                              int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const __m256i *unpacked) {
  const int64_t ls = sums_ld(in->ld);
  for (int64_t j0 = 0; j0 < octets; j0 += INT4_OCTETS_16) {
    const int64_t j1 = j0 + INT4_OCTETS_16 < octets ? j0 + INT4_OCTETS_16 : octets;
    __m256i s[G][2];
    int4_chunk<G>(p, j0, j1, in, t0, g, group, unpacked, s);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(st + g * 16 + 8 * h)));
      for (int r = 0; r < G; r++) {
        float *ap = acc + (t0 + r) * 16 + 8 * h;
        const __m256 dx = _mm256_mul_ps(d, _mm256_set1_ps(in->xqs[(t0 + r) * ls + g]));
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[r][h], ones));
        _mm256_storeu_ps(ap, _mm256_fmadd_ps(sum, dx, _mm256_loadu_ps(ap)));
      }
    }
  }
  for (int h = 0; h < 2; h++) {
    const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mt + g * 16 + 8 * h)));
    for (int r = 0; r < G; r++) {
      float *ap = acc + (t0 + r) * 16 + 8 * h;
      _mm256_storeu_ps(ap, _mm256_fmadd_ps(mn, _mm256_set1_ps(in->xsum[(t0 + r) * ls + g]), _mm256_loadu_ps(ap)));
    }
  }
}

// One token row over a whole tile, its 16 sums in two registers across the groups (int4_group<1>'s
// operations in its order, so the same bits: its sums went through memory, a store and a load on the
// chain of every group)
static inline void int4_row_tile(const uint8_t *p, int64_t groups, int64_t octets, const struct In *in, int64_t group,
                                 const uint16_t *st, const uint16_t *mt, float *acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < groups; g++, p += 64 * octets) {
    for (int64_t j0 = 0; j0 < octets; j0 += INT4_OCTETS_16) {
      const int64_t j1 = j0 + INT4_OCTETS_16 < octets ? j0 + INT4_OCTETS_16 : octets;
      __m256i s[1][2];
      int4_chunk<1>(p, j0, j1, in, 0, g, group, NULL, s);
      for (int h = 0; h < 2; h++) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(st + g * 16 + 8 * h)));
        const __m256 dx = _mm256_mul_ps(d, _mm256_set1_ps(in->xqs[g]));
        a[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s[0][h], ones)), dx, a[h]);
      }
    }
    for (int h = 0; h < 2; h++) {
      const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mt + g * 16 + 8 * h)));
      a[h] = _mm256_fmadd_ps(mn, _mm256_set1_ps(in->xsum[g]), a[h]);
    }
  }
  _mm256_storeu_ps(acc, a[0]);
  _mm256_storeu_ps(acc + 8, a[1]);
}
#define INT4_ROW_TILE 1

static inline void int4_unpack(const uint8_t *p, int64_t octets, __m256i *out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t j = 0; j < octets; j++)
    for (int h = 0; h < 2; h++) {
      const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * j + 32 * h));
      out[4 * j + 2 * h] = _mm256_and_si256(v, low4);
      out[4 * j + 2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
}
typedef __m256i Unpacked;
#define UNPACKED_PER_OCTET 4

#elif defined(LEVEL_NEON) && defined(HAVE_BF16_DOT)
// as AVX-512's: code c as the bf16 number 128 + c (one AND and one OR), BFDOT with input pairs;
// four rows a vector, four vectors a tile
template <int G>
static inline void int4_group(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                              int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const uint32x4_t *unpacked) {
  const uint32x4_t low4 = vdupq_n_u32(0x000F000F), exponent = vdupq_n_u32(0x43004300);
  float32x4_t s[G][4];
  for (int r = 0; r < G; r++)
    for (int q = 0; q < 4; q++) s[r][q] = vdupq_n_f32(0.0f);
  for (int64_t j = 0; j < octets; j++)
    for (int q = 0; q < 4; q++) {
      uint32x4_t c[4];
      if (unpacked) {
        for (int a = 0; a < 4; a++) c[a] = unpacked[16 * j + 4 * q + a];
      } else {
        const uint32x4_t v = vld1q_u32((const uint32_t *)(p + 64 * j + 16 * q));
        c[0] = vorrq_u32(vandq_u32(v, low4), exponent);
        c[1] = vorrq_u32(vandq_u32(vshrq_n_u32(v, 4), low4), exponent);
        c[2] = vorrq_u32(vandq_u32(vshrq_n_u32(v, 8), low4), exponent);
        c[3] = vorrq_u32(vandq_u32(vshrq_n_u32(v, 12), low4), exponent);
      }
      for (int r = 0; r < G; r++) {
        const uint32_t *xp = (const uint32_t *)(in->xb + (t0 + r) * in->ld + g * group) + 4 * j;
        for (int a = 0; a < 4; a++)
          s[r][q] = vbfdotq_f32(s[r][q], vreinterpretq_bf16_u32(c[a]), vreinterpretq_bf16_u32(vdupq_n_u32(xp[a])));
      }
    }
  const int64_t ls = sums_ld(in->ld);
  for (int q = 0; q < 4; q++) {
    const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(st + g * 16 + 4 * q)));
    const float32x4_t mn = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(mt + g * 16 + 4 * q)));
    const float32x4_t corr = vfmsq_f32(mn, vdupq_n_f32(128.0f), d);
    for (int r = 0; r < G; r++) {
      float *ap = acc + (t0 + r) * 16 + 4 * q;
      float32x4_t a = vfmaq_f32(vld1q_f32(ap), s[r][q], d);
      vst1q_f32(ap, vfmaq_f32(a, corr, vdupq_n_f32(in->xsum[(t0 + r) * ls + g])));
    }
  }
}

static inline void int4_unpack(const uint8_t *p, int64_t octets, uint32x4_t *out) {
  const uint32x4_t low4 = vdupq_n_u32(0x000F000F), exponent = vdupq_n_u32(0x43004300);
  for (int64_t j = 0; j < octets; j++)
    for (int q = 0; q < 4; q++) {
      const uint32x4_t v = vld1q_u32((const uint32_t *)(p + 64 * j + 16 * q));
      out[16 * j + 4 * q] = vorrq_u32(vandq_u32(v, low4), exponent);
      out[16 * j + 4 * q + 1] = vorrq_u32(vandq_u32(vshrq_n_u32(v, 4), low4), exponent);
      out[16 * j + 4 * q + 2] = vorrq_u32(vandq_u32(vshrq_n_u32(v, 8), low4), exponent);
      out[16 * j + 4 * q + 3] = vorrq_u32(vandq_u32(vshrq_n_u32(v, 12), low4), exponent);
    }
}
typedef uint32x4_t Unpacked;
#define UNPACKED_PER_OCTET 16

#elif defined(LEVEL_NEON) && defined(HAVE_SDOT)
// SDOT: each row's word split into its low nibbles (inputs 0, 4, 1, 5 in bytes 0..3) and high
// nibbles (inputs 2, 6, 3, 7), against the token row's int8 codes in that order
template <int G>
static inline void int4_group(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                              int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const int8x16_t *unpacked) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  int32x4_t s[G][4];
  for (int r = 0; r < G; r++)
    for (int q = 0; q < 4; q++) s[r][q] = vdupq_n_s32(0);
  for (int64_t j = 0; j < octets; j++) {
    for (int r = 0; r < G; r++) {
      const int8_t *x = (const int8_t *)(in->xq + (t0 + r) * in->ld) + g * group + 8 * j;
      const int8_t lo[4] = {x[0], x[4], x[1], x[5]}, hi[4] = {x[2], x[6], x[3], x[7]};
      const int8x16_t xl = vreinterpretq_s8_u32(vdupq_n_u32(load_u32(lo)));
      const int8x16_t xh = vreinterpretq_s8_u32(vdupq_n_u32(load_u32(hi)));
      for (int q = 0; q < 4; q++) {
        int8x16_t cl, ch;
        if (unpacked) {
          cl = unpacked[8 * j + 2 * q], ch = unpacked[8 * j + 2 * q + 1];
        } else {
          const uint8x16_t v = vld1q_u8(p + 64 * j + 16 * q);
          cl = vreinterpretq_s8_u8(vandq_u8(v, low4));
          ch = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        }
        s[r][q] = vdotq_s32(vdotq_s32(s[r][q], cl, xl), ch, xh);
      }
    }
  }
  const int64_t ls = sums_ld(in->ld);
  for (int q = 0; q < 4; q++) {
    const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(st + g * 16 + 4 * q)));
    const float32x4_t mn = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(mt + g * 16 + 4 * q)));
    for (int r = 0; r < G; r++) {
      float *ap = acc + (t0 + r) * 16 + 4 * q;
      const float32x4_t dx = vmulq_f32(d, vdupq_n_f32(in->xqs[(t0 + r) * ls + g]));
      float32x4_t a = vfmaq_f32(vld1q_f32(ap), vcvtq_f32_s32(s[r][q]), dx);
      vst1q_f32(ap, vfmaq_f32(a, mn, vdupq_n_f32(in->xsum[(t0 + r) * ls + g])));
    }
  }
}

static inline void int4_unpack(const uint8_t *p, int64_t octets, int8x16_t *out) {
  for (int64_t j = 0; j < octets; j++)
    for (int q = 0; q < 4; q++) {
      const uint8x16_t v = vld1q_u8(p + 64 * j + 16 * q);
      out[8 * j + 2 * q] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
      out[8 * j + 2 * q + 1] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    }
}
typedef int8x16_t Unpacked;
#define UNPACKED_PER_OCTET 8

#else
// the generic version (scalar, and NEON without BF16 or DOTPROD): codes as fp32 times the inputs
// rounded to bf16, W rows a vector
static inline V int4_codes(const uint8_t *p, int shift) {  // the code at `shift` of W consecutive rows' words
#if defined(LEVEL_NEON)
  return vcvtq_f32_u32(vandq_u32(vshlq_u32(vld1q_u32((const uint32_t *)p), vdupq_n_s32(-shift)), vdupq_n_u32(15)));
#else
  V r;
  for (int i = 0; i < W; i++) r.v[i] = (float)((load_u32(p + 4 * i) >> shift) & 15);
  return r;
#endif
}

template <int G>
static inline void int4_group(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                              int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const V *unpacked) {
  enum { Q = 16 / W };
  V s[G][Q];
  for (int r = 0; r < G; r++)
    for (int q = 0; q < Q; q++) s[r][q] = vzero();
  for (int64_t j = 0; j < octets; j++)
    for (int q = 0; q < Q; q++)
      for (int e = 0; e < 8; e++) {  // input 8j + e: nibble 4 (e / 2) + 16 (e % 2)
        const V c = unpacked ? unpacked[(j * Q + q) * 8 + e] : int4_codes(p + 64 * j + 4 * W * q, 4 * (e / 2) + 16 * (e % 2));
        for (int r = 0; r < G; r++)
          s[r][q] = vfma(c, vset1(bf16_to_f32(in->xb[(t0 + r) * in->ld + g * group + 8 * j + e])), s[r][q]);
      }
  const int64_t ls = sums_ld(in->ld);
  for (int q = 0; q < Q; q++) {
    const V d = vload_f16(st + g * 16 + W * q), mn = vload_f16(mt + g * 16 + W * q);
    for (int r = 0; r < G; r++) {
      float *ap = acc + (t0 + r) * 16 + W * q;
      V a = vfma(s[r][q], d, vload(ap));
      vstore(ap, vfma(mn, vset1(in->xsum[(t0 + r) * ls + g]), a));
    }
  }
}

static inline void int4_unpack(const uint8_t *p, int64_t octets, V *out) {
  enum { Q = 16 / W };
  for (int64_t j = 0; j < octets; j++)
    for (int q = 0; q < Q; q++)
      for (int e = 0; e < 8; e++) out[(j * Q + q) * 8 + e] = int4_codes(p + 64 * j + 4 * W * q, 4 * (e / 2) + 16 * (e % 2));
}
typedef V Unpacked;
#define UNPACKED_PER_OCTET (8 * 16 / W)
#endif

template <int G>
static inline void int4_pass(const uint8_t *p, int64_t octets, const struct In *in, int64_t t0, int64_t g,
                             int64_t group, const uint16_t *st, const uint16_t *mt, float *acc, const Unpacked *u) {
  int4_group<G>(p, octets, in, t0, g, group, st, mt, acc, u);
}

// `unpacked`: room for a group's codes unpacked (octets * UNPACKED_PER_OCTET vectors): with more token
// rows than one pass takes, each group of a tile is unpacked once and every pass reads it from L1
static void gemm_int4(const struct Mat *mt, const struct In *in, float *y, int64_t ldy, int64_t r0, int64_t r1,
                      Unpacked *unpacked) {
  const uint8_t *codes = (const uint8_t *)mt->w;
  const uint16_t *scale = (const uint16_t *)mt->scale, *mins = (const uint16_t *)mt->min;
  const int64_t k = mt->k, group = mt->group, groups = k / group, octets = group / 8, tile_bytes = 16 * k / 2;
  const int64_t m = in->m;
  float acc[MAX_ROWS * 16];
  for (int64_t t = r0 / 16; t * 16 < r1; t++) {
    const uint8_t *p = codes + t * tile_bytes;
    const uint16_t *st = scale + t * groups * 16, *mnt = mins + t * groups * 16;
    // the rows of this tile to store: those in [r0, r1) (a range may start or end inside a tile)
    const int64_t first = r0 > t * 16 ? r0 - t * 16 : 0, end = r1 - t * 16 < 16 ? r1 - t * 16 : 16;
#if defined(INT4_TILES)
    if (m == 1) {  // one token row: a group at a time, as before the tiles (the same operations, in order)
      memset(acc, 0, sizeof(float) * 16);
      for (int64_t g = 0; g < groups; g++) int4_group<1>(p + g * 64 * octets, octets, in, 0, g, group, st, mnt, acc, NULL);
    }
    // passes as even as INT4_TILE_G allows; each unpacks the tile's codes again from L1 (cheaper than
    // reading them back unpacked: four times the bytes)
    const int64_t passes = m == 1 ? 0 : (m + INT4_TILE_G - 1) / INT4_TILE_G;
    (void)unpacked;
    for (int64_t q = 0; q < passes; q++) {
      const int64_t m0 = m * q / passes, rows = m * (q + 1) / passes - m0;
      const Unpacked *u = NULL;
      switch (rows) {
        case 6: int4_tile<6>(p, groups, octets, in, m0, group, st, mnt, acc, u); break;
        case 5: int4_tile<5>(p, groups, octets, in, m0, group, st, mnt, acc, u); break;
        case 4: int4_tile<4>(p, groups, octets, in, m0, group, st, mnt, acc, u); break;
        case 3: int4_tile<3>(p, groups, octets, in, m0, group, st, mnt, acc, u); break;
        case 2: int4_tile<2>(p, groups, octets, in, m0, group, st, mnt, acc, u); break;
        default: int4_tile<1>(p, groups, octets, in, m0, group, st, mnt, acc, u); break;
      }
    }
#else
#if defined(INT4_ROW_TILE)
    if (m == 1) {
      int4_row_tile(p, groups, octets, in, group, st, mnt, acc);
      for (int64_t i = first; i < end; i++) y[t * 16 + i] = acc[i];
      continue;
    }
#endif
    memset(acc, 0, sizeof(float) * 16 * m);
    for (int64_t g = 0; g < groups; g++, p += 64 * octets) {
      const Unpacked *u = NULL;
      if (m > INT4_G) {
        int4_unpack(p, octets, unpacked);
        u = unpacked;
      }
      for (int64_t t0 = 0; t0 < m; t0 += INT4_G) {
        switch (m - t0 < INT4_G ? m - t0 : INT4_G) {
          case 4: int4_pass<4>(p, octets, in, t0, g, group, st, mnt, acc, u); break;
          case 3: int4_pass<3>(p, octets, in, t0, g, group, st, mnt, acc, u); break;
          case 2: int4_pass<2>(p, octets, in, t0, g, group, st, mnt, acc, u); break;
          default: int4_pass<1>(p, octets, in, t0, g, group, st, mnt, acc, u); break;
        }
      }
    }
#endif
    for (int64_t r = 0; r < m; r++)
      for (int64_t i = first; i < end; i++) y[r * ldy + t * 16 + i] = acc[r * 16 + i];
  }
}

// per-thread room of one product: a converted block of rows, or a group's unpacked codes
static int64_t product_floats(int64_t wide) {
  const int64_t rows = R * ((wide + W - 1) / W * W);
  const int64_t codes = (wide / 8) * UNPACKED_PER_OCTET * (int64_t)(sizeof(Unpacked) / sizeof(float));
  return (rows > codes ? rows : codes) + 64;
}

static void gemm(const struct Mat *mt, const struct In *in, float *y, int64_t ldy, int64_t r0, int64_t r1, float *work) {
  switch (mt->fmt) {
    case F32:
      gemm_rows<F32Rows>(mt, in, y, ldy, r0, r1, work, [mt](int64_t r) {
        F32Rows w;
        for (int i = 0; i < R; i++) w.p[i] = (const float *)mt->w + (r + i) * mt->k;
        return w;
      });
      break;
    case BF16:
#if defined(HAVE_BF16_DOT)
      gemm_bf16dot(mt, in, y, ldy, r0, r1);
#else
      gemm_rows<BF16Rows>(mt, in, y, ldy, r0, r1, work, [mt](int64_t r) {
        BF16Rows w;
        for (int i = 0; i < R; i++) w.p[i] = (const uint16_t *)mt->w + (r + i) * mt->k;
        return w;
      });
#endif
      break;
    case INT8:
#if defined(HAVE_SDOT)
      gemm_int8_sdot(mt, in, y, ldy, r0, r1);
#elif defined(LEVEL_AVX512) || defined(LEVEL_AVX2)
      gemm_int8_i16(mt, in, y, ldy, r0, r1);
#else
      gemm_rows<I8Rows>(mt, in, y, ldy, r0, r1, work, [mt](int64_t r) {
        I8Rows w;
        for (int i = 0; i < R; i++) w.p[i] = (const int8_t *)mt->w + (r + i) * mt->k;
        return w;
      });
#endif
      break;
    default:
      gemm_int4(mt, in, y, ldy, r0, r1, (Unpacked *)work);
      break;
  }
}

// ---- the small vector work (every thread does it in full, into its own buffer: no barrier) ---------
static void rms_norm(const float *x, const void *w, int64_t act, float eps, float *out, int64_t n) {
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
  float inv = 1.0f / sqrtf(ss / (float)n + eps);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * (w ? load_act(w, i, act) : 1.0f);
}

// RoPE in the rotate-half layout (engine/model/transformer.py apply_rope); cos/sin: (head_dim) fp32
static void rope(float *v, const float *cos_row, const float *sin_row, int64_t hd) {
  int64_t half = hd / 2;
  for (int64_t i = 0; i < half; i++) {
    float a = v[i], b = v[i + half];
    v[i] = a * cos_row[i] - b * sin_row[i];
    v[i + half] = b * cos_row[i + half] + a * sin_row[i + half];
  }
}

// q/k head `head` (0 .. n_heads + n_kv - 1) of one token row's qkv: per-head RMSNorm (Qwen3) and
// RoPE applied (the bias was added with the product)
static void qk_head(const struct Model *md, const struct Layer *ly, const float *qkv, int64_t head,
                    const float *cos_row, const float *sin_row, float *out) {
  int64_t hd = md->head_dim;
  memcpy(out, qkv + head * hd, hd * sizeof(float));
  if (ly->qk_norm) {
    float normed[1024];
    rms_norm(out, NULL, md->act, md->eps, normed, hd);
    for (int64_t i = 0; i < hd; i++) out[i] = normed[i] * load_act(ly->qk_norm, head * hd + i, md->act);
  }
  rope(out, cos_row, sin_row, hd);
}

// exp(x) for x in [-87, 88]: 2^k exp(r), k = round(x / ln 2), |r| <= ln 2 / 2, and exp(r) by its Taylor
// series to r^6 (relative error < 2e-7)
static ALWAYS_INLINE V vexp(V x) {
  V k = vround(vmul(x, vset1(1.44269504f)));
  V r = vfnma(k, vset1(0.693145752f), x);  // ln 2 in two parts: r stays exact
  r = vfnma(k, vset1(1.42860677e-6f), r);
  V p = vset1(1.0f / 720);
  p = vfma(p, r, vset1(1.0f / 120));
  p = vfma(p, r, vset1(1.0f / 24));
  p = vfma(p, r, vset1(1.0f / 6));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
  return vscale2(p, k);
}

// s[t] = exp(s[t] - shift) for t < n (every s[t] <= shift), and their sum: at 4k positions a step takes a
// million of them, so they are vectorised, the last ones masked (a scalar expf took ~15 ns each, and the sum
// one dependent add a position); x below -87 counts as -87 (exp ~ 1e-38)
static float exp_shifted(float *s, int64_t n, float shift) {
  int64_t t = 0;
  const V sh = vset1(shift), lowest = vset1(-87.0f);
  V total = vzero();
  for (; t + W <= n; t += W) {
    const V e = vexp(vmax(vsub(vload(s + t), sh), lowest));
    vstore(s + t, e);
    total = vadd(total, e);
  }
  if (t < n) {
    vstoren(s + t, vexp(vmax(vsub(vloadn(s + t, n - t), sh), lowest)), n - t);
    total = vadd(total, vloadn(s + t, n - t));
  }
  return vhsum(total);
}

// ---- one row of logits sampled on a CPU (engine/model/sampling.py: tempered, kept_tokens, draw_one) ----------
// After a step each PyTorch or numpy operator on the 49k logits costs 20-100 us (its code and data come back from
// memory); these take one call a row.

// probs = softmax(logits / temperature) over the tokens at or above the top_k-th largest (all of them where top_k
// is 0 or >= n), exp as the step's (vexp); a token cut by top-k, masked (-inf) or more than 87 below the largest
// gets exactly 0 (vexp(-87), what the clamp gives, subtracted from every exp: below 1e-30 the only change).
// scratch: n floats (top-k's cut). Returns 1 where a logit is NaN or +inf or none is finite (nothing to sample)
extern "C" int membound_tempered(const float *logits, int64_t n, float temperature, int64_t top_k, float *probs,
                                 float *scratch) {
  if (n < 1 || !(temperature > 0.0f)) return 1;
  // logits / temperature (a division, as torch's), their largest, and their sum: NaN where a logit is NaN or
  // +inf beside a -inf, +inf where one is +inf, -inf where some are masked (fine), else finite
  const V vt = vset1(temperature);
  V vmx = vset1(-INFINITY), vsum = vzero();
  int64_t t = 0;
  for (; t + W <= n; t += W) {
    const V y = vdiv(vload(logits + t), vt);
    vstore(probs + t, y);
    vmx = vmax(vmx, y);
    vsum = vadd(vsum, y);
  }
  float mx = vhmax(vmx), sum = vhsum(vsum);
  for (; t < n; t++) {  // (the tail one by one: padding lanes would count as logits of 0)
    const float y = logits[t] / temperature;
    probs[t] = y;
    mx = y > mx ? y : mx;
    sum += y;
  }
  if (sum != sum || sum == INFINITY || mx != mx || mx == -INFINITY) return 1;
  float kth = -INFINITY;  // the cut: torch.topk's k-th value; ties at it all stay
  if (top_k >= 1 && top_k < n) {
    memcpy(scratch, probs, n * sizeof(float));
    std::nth_element(scratch, scratch + (top_k - 1), scratch + n, [](float a, float b) { return a > b; });
    kth = scratch[top_k - 1];
  }
  // under the cut: (kth - y) x 1e30 off the exponent, past the clamp (0 for the tokens that stay)
  const bool cut = kth > -INFINITY;
  const V shift = vset1(mx), lowest = vset1(-87.0f), at_lowest = vexp(vset1(-87.0f)), zero = vzero();
  const V vkth = vset1(kth), far = vset1(1e30f);
  V total = vzero();
  for (t = 0; t + W <= n; t += W) {
    const V y = vload(probs + t);
    V d = vsub(y, shift);
    if (cut) d = vfnma(vmax(vsub(vkth, y), zero), far, d);
    const V e = vmax(vsub(vexp(vmax(d, lowest)), at_lowest), zero);
    vstore(probs + t, e);
    total = vadd(total, e);
  }
  if (t < n) {
    const V y = vloadn(probs + t, n - t);
    V d = vsub(y, shift);
    if (cut) d = vfnma(vmax(vsub(vkth, y), zero), far, d);
    vstoren(probs + t, vmax(vsub(vexp(vmax(d, lowest)), at_lowest), zero), n - t);
    total = vadd(total, vloadn(probs + t, n - t));
  }
  const V inv = vset1(1.0f / vhsum(total));  // (the largest token's exp is 1: the sum is at least that)
  for (t = 0; t + W <= n; t += W) vstore(probs + t, vmul(vload(probs + t), inv));
  if (t < n) vstoren(probs + t, vmul(vloadn(probs + t, n - t), inv), n - t);
  return 0;
}

// top-p's token of a row of probabilities at uniform number u, as sampling.top_p_token draws it: the candidates
// (within `near` of the most likely, widened 2^-8 at a time until their fp64 mass reaches top_p + margin; with
// that margin where the widening stops does not change the set kept) sorted most likely first, ties lowest id
// first; a token kept while the mass before it (fp64 sums rounded to fp32, less its own, in fp32) is under
// top_p, at least one; then the first whose fp64 cumulative sum passes u x their total (a zero weight never).
// ids: n int64 of scratch. Returns the token, or -1 where the kept tokens have no finite positive mass
extern "C" int64_t membound_top_p_token(const float *probs, int64_t n, double top_p, double margin, double near,
                                        double u, int64_t *ids) {
  const int64_t blocks = n / W;
  V vmx = vset1(-INFINITY);
  for (int64_t b = 0; b < blocks; b++) vmx = vmax(vmx, vload(probs + b * W));
  float pmax = vhmax(vmx);
  for (int64_t i = blocks * W; i < n; i++) pmax = probs[i] > pmax ? probs[i] : pmax;
  double floor = (double)pmax * near;
  int64_t c = 0;
  for (;;) {
    c = 0;
    if (floor > 0) {  // (floor is a float: pmax x a power of two, above 1e-33)
      const float f = (float)floor;
      for (int64_t b = 0; b < blocks; b++)  // the blocks that hold a candidate, scanned one by one
        if (vhmax(vload(probs + b * W)) >= f)
          for (int64_t i = b * W; i < (b + 1) * W; i++)
            if (probs[i] >= f) ids[c++] = i;
      for (int64_t i = blocks * W; i < n; i++)
        if (probs[i] >= f) ids[c++] = i;
    } else {
      for (int64_t i = 0; i < n; i++) ids[c++] = i;
      break;
    }
    double mass = 0;
    for (int64_t j = 0; j < c; j++) mass += probs[ids[j]];
    if (mass >= top_p + margin) break;
    floor = floor > 1e-30 ? floor * 0.00390625 : 0.0;
  }
  std::stable_sort(ids, ids + c, [probs](int64_t a, int64_t b) { return probs[a] > probs[b]; });
  const float p32 = (float)top_p;
  double acc = 0;
  int64_t kept = 0;
  for (int64_t j = 0; j < c; j++) {  // (every candidate counted, as numpy's count_nonzero)
    const float v = probs[ids[j]];
    acc += v;
    const float before = (float)acc - v;
    kept += before < p32;
  }
  kept = kept > 1 ? kept : 1;
  double total = 0;
  for (int64_t j = 0; j < kept; j++) total += probs[ids[j]];
  if (!(total > 0) || !isfinite(total)) return -1;
  const double at = u * total;
  double cdf = 0;
  for (int64_t j = 0; j < kept; j++) {
    cdf += probs[ids[j]];
    if (cdf > at) return ids[j];
  }
  for (int64_t j = kept - 1; j >= 0; j--)  // (u * total rounded to the total: the last token with any weight)
    if (probs[ids[j]] > 0) return ids[j];
  return -1;
}

// membound_tempered then membound_top_p_token on one row: the token, or -1 (nothing to sample).
// scratch: 3n + 2 floats, 8-byte aligned (the probabilities, then top-k's cut and after it the candidates' ids)
extern "C" int64_t membound_sample_top_p(const float *logits, int64_t n, float temperature, int64_t top_k,
                                         double top_p, double margin, double near, double u, float *scratch) {
  float *probs = scratch, *after = scratch + ((n + 1) & ~(int64_t)1);
  if (membound_tempered(logits, n, temperature, top_k, probs, after)) return -1;
  return membound_top_p_token(probs, n, top_p, margin, near, u, (int64_t *)after);
}

// SiLU(g) u = g / (1 + exp(-g)) u, exp(-g) as vexp computes it: -g clamped to [-87, 88] (beyond, the
// result is g, or under 1e-36 in magnitude, to fp32's precision)
static ALWAYS_INLINE V vsilu_times(V g, V u) {
  const V e = vexp(vmax(vsub(vzero(), vmax(g, vset1(-88.0f))), vset1(-87.0f)));
  return vmul(vdiv(g, vadd(vset1(1.0f), e)), u);
}

// out[i] = SiLU(g[i]) u[i] for i < n. A scalar expf took ~5 ns an element: 7 ms of a 64-row fp32 step.
// Every element goes through the vector code (the last ones masked), so its bits never depend on where it falls
static void silu_times(const float *g, const float *u, float *out, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) vstore(out + i, vsilu_times(vload(g + i), vload(u + i)));
  if (i < n) vstoren(out + i, vsilu_times(vloadn(g + i, n - i), vloadn(u + i, n - i)), n - i);
}

// the cache rows of one token row and KV head: positions [0, n) in runs of consecutive slots
struct Run {
  int64_t pos, len, offset;  // first position, positions, element offset of the first
};
#define MAX_RUNS 4096  // blocks a row's context may span (kernels/cpu_decode.py checks it)
#define RUN_FLOATS ((int64_t)(sizeof(struct Run) / sizeof(float)))
extern "C" int64_t membound_max_blocks(void) { return MAX_RUNS; }

static inline float *aligned64(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

static inline int64_t runs_of(const struct Model *md, const struct Row *row, int64_t head, int64_t n, struct Run *out,
                              int64_t max_runs) {
  const int64_t hd = md->head_dim, base = row->kv_base + head * md->kv_head_stride;
  if (!row->table) {
    out[0].pos = 0, out[0].len = n, out[0].offset = base;
    return 1;
  }
  const int64_t bs = md->block_size;
  int64_t count = 0;
  for (int64_t p = 0; p < n && count < max_runs; p += bs, count++) {
    out[count].pos = p;
    out[count].len = n - p < bs ? n - p : bs;
    out[count].offset = base + (int64_t)row->table[p / bs] * bs * hd;
  }
  return count;
}

static inline int64_t slot_offset(const struct Model *md, const struct Row *row, int64_t head, int64_t p) {
  const int64_t slot = row->table ? (int64_t)row->table[p / md->block_size] * md->block_size + p % md->block_size : p;
  return row->kv_base + head * md->kv_head_stride + slot * md->head_dim;
}

// one query head over cache positions 0..n-1: softmax(q k / sqrt(hd)) v into out (hd)
template <class T>
static inline V load_kv(const T *p);
template <>
inline V load_kv<float>(const float *p) { return vload(p); }
template <>
inline V load_kv<uint16_t>(const uint16_t *p) { return vload_bf16(p); }
template <class T>
static inline V load_kvn(const T *p, int64_t n);
template <>
inline V load_kvn<float>(const float *p, int64_t n) { return vloadn(p, n); }
template <>
inline V load_kvn<uint16_t>(const uint16_t *p, int64_t n) { return vload_bf16n(p, n); }

// out[i + b W] for NB full column blocks from i: the positions' values weighed by their scores, two
// chains a block over the positions (even and odd ones of each run); the blocks side by side, so one
// block's chains do not wait on each other's latency
template <class T, int NB>
static ALWAYS_INLINE void weigh_values(const T *vc, const struct Run *runs, int64_t n_runs, const float *scores, int64_t hd,
                                       int64_t i, V inv, float *out) {
  V a0[NB], a1[NB];
  for (int b = 0; b < NB; b++) a0[b] = a1[b] = vzero();
  for (int64_t u = 0; u < n_runs; u++) {
    const T *vr = vc + runs[u].offset + i;
    const float *sc = scores + runs[u].pos;
    int64_t t = 0;
    for (; t + 2 <= runs[u].len; t += 2) {
      const V s0 = vset1(sc[t]), s1 = vset1(sc[t + 1]);
      for (int b = 0; b < NB; b++) a0[b] = vfma(s0, load_kv<T>(vr + t * hd + b * W), a0[b]);
      for (int b = 0; b < NB; b++) a1[b] = vfma(s1, load_kv<T>(vr + (t + 1) * hd + b * W), a1[b]);
    }
    for (; t < runs[u].len; t++) {
      const V s0 = vset1(sc[t]);
      for (int b = 0; b < NB; b++) a0[b] = vfma(s0, load_kv<T>(vr + t * hd + b * W), a0[b]);
    }
  }
  for (int b = 0; b < NB; b++) vstore(out + i + b * W, vmul(vadd(a0[b], a1[b]), inv));
}

// q . k / sqrt(hd) of one query head over cache positions 0..n-1 into scores[0..n) (runs: the cache's, filled
// in); returns the largest
template <class T>
static float head_scores(const struct Model *md, const struct Row *row, int64_t kv_head, const T *kc, const float *q,
                         int64_t n, float *scores, struct Run *runs, int64_t *n_runs_out) {
  const int64_t hd = md->head_dim, full = hd / W * W;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t n_runs = runs_of(md, row, kv_head, n, runs, MAX_RUNS);
  *n_runs_out = n_runs;
  float mx = -INFINITY;
  for (int64_t u = 0; u < n_runs; u++) {
    int64_t t = 0;
#if defined(HAVE_VHSUM4)
    if (full == hd)  // four positions at a time, their sums in one tree (each in vhsum's own order)
      for (; t + 4 <= runs[u].len; t += 4) {
        const T *kr = kc + runs[u].offset + t * hd;
        V a[4] = {vzero(), vzero(), vzero(), vzero()};
        for (int64_t i = 0; i < full; i += W) {
          V qv = vload(q + i);
          in_register(qv);
          for (int c = 0; c < 4; c++) a[c] = vfma(load_kv<T>(kr + c * hd + i), qv, a[c]);
        }
        float s4[4];
        vhsum4(a[0], a[1], a[2], a[3], s4);
        for (int c = 0; c < 4; c++) {
          const float s = s4[c] * scale;
          scores[runs[u].pos + t + c] = s;
          mx = s > mx ? s : mx;
        }
      }
#endif
    for (; t < runs[u].len; t++) {
      const T *kr = kc + runs[u].offset + t * hd;
      V a = vzero();
      int64_t i = 0;
      for (; i < full; i += W) a = vfma(load_kv<T>(kr + i), vload(q + i), a);
      if (i < hd) a = vfma(load_kvn<T>(kr + i, hd - i), vloadn(q + i, hd - i), a);
      const float s = vhsum(a) * scale;
      scores[runs[u].pos + t] = s;
      mx = s > mx ? s : mx;
    }
  }
  return mx;
}

// out (hd) = inv * sum_t scores[t] v[t] over the runs' positions
template <class T>
static void weigh_head(const struct Model *md, const T *vc, const struct Run *runs, int64_t n_runs, const float *scores,
                       float inv_total, float *out) {
  const int64_t hd = md->head_dim, full = hd / W * W;
  const V inv = vset1(inv_total);
  int64_t i0 = 0;  // the full column blocks, up to four side by side
  for (; i0 + 4 * W <= full; i0 += 4 * W) weigh_values<T, 4>(vc, runs, n_runs, scores, hd, i0, inv, out);
  switch ((full - i0) / W) {
    case 3: weigh_values<T, 3>(vc, runs, n_runs, scores, hd, i0, inv, out); break;
    case 2: weigh_values<T, 2>(vc, runs, n_runs, scores, hd, i0, inv, out); break;
    case 1: weigh_values<T, 1>(vc, runs, n_runs, scores, hd, i0, inv, out); break;
    default: break;
  }
  if (full < hd) {  // the last, partial block: one chain
    const int64_t w = hd - full;
    V a0 = vzero();
    for (int64_t u = 0; u < n_runs; u++) {
      const T *vr = vc + runs[u].offset + full;
      const float *sc = scores + runs[u].pos;
      for (int64_t t = 0; t < runs[u].len; t++) a0 = vfma(vset1(sc[t]), load_kvn<T>(vr + t * hd, w), a0);
    }
    vstoren(out + full, vmul(vadd(a0, vzero()), inv), w);
  }
}

// one query head over cache positions 0..n-1: softmax(q k / sqrt(hd)) v into out (hd), its scores in `scores`
// (one head's: they stay in L1/L2), normalised once at the end
template <class T>
static void attend_head(const struct Model *md, const struct Row *row, int64_t kv_head, const void *kc_, const void *vc_,
                        const float *q, int64_t n, float *scores, float *out, struct Run *runs) {
  int64_t n_runs;
  const float mx = head_scores<T>(md, row, kv_head, (const T *)kc_, q, n, scores, runs, &n_runs);
  const float total = exp_shifted(scores, n, mx);
  weigh_head<T>(md, (const T *)vc_, runs, n_runs, scores, 1.0f / total, out);
}

// Naive attention (the setting), as PyTorch's naive_attention runs it: the scores of every (row, query head)
// pair this thread takes written into a matrix in memory (`mat`, rows ld apart), then each row softmaxed in place
// (read, written as probabilities), then the values weighed by them (read): three passes over the matrix, where
// attend_head keeps one head's scores in L1. Each row's arithmetic is the same alone or among others.
template <class T>
static void attend_naive(const struct Model *md, const struct Row *rows, const struct Layer *ly, const float *qkv,
                         int64_t qkv_dim, const float *cos_t, const float *sin_t, int64_t r0, int64_t r1, float *mat,
                         int64_t ld, float *qh, float *att, int64_t q_dim, struct Run *runs) {
  const int64_t n_heads = md->n_heads, group = n_heads / md->n_kv, hd = md->head_dim;
  int64_t n_runs;
  for (int64_t item = r0; item < r1; item++) {  // q k^T into the matrix
    const int64_t t = item / n_heads, hh = item % n_heads, pos = rows[t].pos;
    qk_head(md, ly, qkv + t * qkv_dim, hh, cos_t + pos * hd, sin_t + pos * hd, qh);
    head_scores<T>(md, &rows[t], hh / group, (const T *)ly->k_cache, qh, pos + 1, mat + (item - r0) * ld, runs,
                   &n_runs);
  }
  for (int64_t item = r0; item < r1; item++) {  // softmax, row by row, in place
    float *p = mat + (item - r0) * ld;
    const int64_t n = rows[item / n_heads].pos + 1;
    V m = vset1(-INFINITY);
    int64_t i = 0;
    for (; i + W <= n; i += W) m = vmax(m, vload(p + i));
    float mx = vhmax(m);
    for (; i < n; i++) mx = p[i] > mx ? p[i] : mx;
    const V inv = vset1(1.0f / exp_shifted(p, n, mx));
    for (i = 0; i + W <= n; i += W) vstore(p + i, vmul(vload(p + i), inv));
    if (i < n) vstoren(p + i, vmul(vloadn(p + i, n - i), inv), n - i);
  }
  for (int64_t item = r0; item < r1; item++) {  // probabilities x V
    const int64_t t = item / n_heads, hh = item % n_heads;
    n_runs = runs_of(md, &rows[t], hh / group, rows[t].pos + 1, runs, MAX_RUNS);
    weigh_head<T>(md, (const T *)ly->v_cache, runs, n_runs, mat + (item - r0) * ld, 1.0f, att + t * q_dim + hh * hd);
  }
}

// ---- the step --------------------------------------------------------------------------------------
static int64_t widest(const struct Model *md) {
  int64_t q_dim = md->n_heads * md->head_dim, kv_dim = md->n_kv * md->head_dim;
  int64_t w = md->ffn_dim > md->dim ? md->ffn_dim : md->dim;
  w = q_dim + 2 * kv_dim > w ? q_dim + 2 * kv_dim : w;
  return (w + 63) / 64 * 64;
}

// Scratch, in floats: shared x, qkv, attention output, SiLU(gate) * up and products' outputs (m rows
// each); then per thread: the normed inputs and their bf16 / integer copies and group sums (m rows),
// the product's room (product_floats), the runs of a cache, attention scores and one head.
static int64_t shared_floats(const struct Model *md, int64_t m) {
  int64_t q_dim = md->n_heads * md->head_dim, kv_dim = md->n_kv * md->head_dim;
  int64_t out = 2 * md->ffn_dim > md->dim ? 2 * md->ffn_dim : md->dim;
  return m * (md->dim + (q_dim + 2 * kv_dim) + q_dim + md->ffn_dim + out) + 64;
}

// naive attention: a thread's (row, query head) pairs' scores, max_len apart (attend_naive)
static int64_t naive_floats(const struct Model *md, int64_t m, int64_t threads, int64_t naive) {
  return naive ? (m * md->n_heads + threads - 1) / threads * ((md->max_len + 15) / 16 * 16) : 0;
}
static int64_t thread_floats(const struct Model *md, int64_t m, int64_t threads, int64_t naive) {
  int64_t wide = widest(md);
  return m * (wide + wide / 2 + wide / 2 + 2 * sums_ld(wide)) + product_floats(wide) + RUN_FLOATS * MAX_RUNS +
         md->max_len + 2 * md->head_dim + 128 + naive_floats(md, m, threads, naive);
}

extern "C" int64_t membound_scratch_floats(const struct Model *md, int64_t m, int64_t threads, int64_t naive) {
  return shared_floats(md, m) + threads * thread_floats(md, m, threads, naive);
}

extern "C" int64_t membound_max_rows(void) { return MAX_ROWS; }

// Where a step's time goes, seen from thread 0 (profile != null): seconds per phase, added up
enum { P_EMBED, P_QKV, P_KV_WRITE, P_ATTENTION, P_WO, P_GATE_UP, P_DOWN, P_HEAD, P_WAIT, PHASES };
extern "C" int64_t membound_profile_phases(void) { return PHASES; }
#define MARK(phase)                     \
  if (prof) {                           \
    double now_ = omp_get_wtime();      \
    prof[phase] += now_ - last;         \
    last = now_;                        \
  }
#define BARRIER(phase) \
  MARK(phase);         \
  _Pragma("omp barrier") MARK(P_WAIT)

// m token rows (rows[0..m)); cos_t / sin_t: (max positions, head_dim) fp32 tables; logits:
// (n_logits, vocab) fp32 for rows logit_rows[0..n_logits); naive: attention as the naive setting runs it
// (attend_naive: the score matrix in memory); scratch: membound_scratch_floats(md, m, threads, naive) floats;
// profile: null, or PHASES doubles that thread 0's seconds are added to
extern "C" int membound_step(const struct Model *md, const struct Row *rows, int64_t m, const float *cos_t,
                             const float *sin_t, const int64_t *logit_rows, int64_t n_logits, float *logits,
                             float *scratch, int64_t threads, int64_t naive, double *profile) {
  if (m < 1 || m > MAX_ROWS || n_logits < 0 || n_logits > m) return 1;
  const int64_t dim = md->dim, hd = md->head_dim, n_heads = md->n_heads, n_kv = md->n_kv, ffn = md->ffn_dim;
  const int64_t q_dim = n_heads * hd, kv_dim = n_kv * hd, qkv_dim = q_dim + 2 * kv_dim, act = md->act;
  const int64_t group = n_heads / n_kv, wide = widest(md), per_thread = thread_floats(md, m, threads, naive);
  const int64_t out_ld = 2 * ffn > dim ? 2 * ffn : dim;
  float *x = scratch, *qkv = x + m * dim, *att = qkv + m * qkv_dim, *ffn_act = att + m * q_dim;
  float *tmp = ffn_act + m * ffn;
  float *thread_base = scratch + shared_floats(md, m);
#pragma omp parallel num_threads(threads)
  {
#if defined(ARCH_X86)
    // subnormals flushed in every thread of the region, as torch.set_flush_denormal does in the caller's:
    // a subnormal activation takes a microcode path that is tens of times slower
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
#endif
    double *prof = omp_get_thread_num() == 0 ? profile : NULL, last = prof ? omp_get_wtime() : 0;
    float *mine = thread_base + omp_get_thread_num() * per_thread;
    float *h = mine;
    uint16_t *xb = (uint16_t *)(h + m * wide);
    int16_t *xq = (int16_t *)(h + m * wide + m * wide / 2);
    float *xsum = h + m * (2 * wide), *xqs = xsum + m * sums_ld(wide);
    float *work = aligned64(xqs + m * sums_ld(wide));  // (product_floats has room for the shift)
    struct Run *runs = (struct Run *)(work + product_floats(wide) - 16);
    float *scores = (float *)(runs + MAX_RUNS), *qh = scores + md->max_len;
    float *naive_mat = aligned64(qh + 2 * md->head_dim);  // (thread_floats' 128 spare floats cover the shift)
    const int64_t naive_ld = (md->max_len + 15) / 16 * 16;
    struct In in = {h, m, dim, xb, xq, xsum, xqs};
    int64_t r0, r1;

    my_rows(dim, 16, &r0, &r1);
    for (int64_t t = 0; t < m; t++)
      for (int64_t i = r0; i < r1; i++) x[t * dim + i] = load_act(md->embed, rows[t].token * dim + i, act);
    BARRIER(P_EMBED);
    for (int64_t l = 0; l < md->n_layers; l++) {
      const struct Layer *ly = &md->layers[l];
      // attention: q, k, v
      for (int64_t t = 0; t < m; t++) rms_norm(x + t * dim, ly->attn_norm, act, md->eps, h + t * dim, dim);
      in.x = h, in.ld = dim;
      prepare(&in, &ly->wqkv);
      my_rows(qkv_dim, 16, &r0, &r1);
      gemm(&ly->wqkv, &in, qkv, qkv_dim, r0, r1, work);
      if (ly->bqkv)
        for (int64_t t = 0; t < m; t++)
          for (int64_t i = r0; i < r1; i++) qkv[t * qkv_dim + i] += load_act(ly->bqkv, i, act);
      BARRIER(P_QKV);
      // this step's k and v into the cache ((token row, KV head) pairs split over the threads)
      my_rows(m * n_kv, 1, &r0, &r1);
      for (int64_t item = r0; item < r1; item++) {
        const int64_t t = item / n_kv, j = item % n_kv, pos = rows[t].pos;
        qk_head(md, ly, qkv + t * qkv_dim, n_heads + j, cos_t + pos * hd, sin_t + pos * hd, qh);
        const float *vh = qkv + t * qkv_dim + q_dim + kv_dim + j * hd;
        const int64_t at = slot_offset(md, &rows[t], j, pos);
        for (int64_t i = 0; i < hd; i++) {
          store_act(ly->k_cache, at + i, qh[i], act);
          store_act(ly->v_cache, at + i, vh[i], act);
        }
      }
      BARRIER(P_KV_WRITE);
      // attention, (token row, query head) pairs split over the threads; each row over its own cache
      // up to its own position (rows of one sequence see the rows before them: their K/V are written)
      my_rows(m * n_heads, 1, &r0, &r1);
      if (naive && act == BF16)  // (the naive setting: the score matrix in memory)
        attend_naive<uint16_t>(md, rows, ly, qkv, qkv_dim, cos_t, sin_t, r0, r1, naive_mat, naive_ld, qh, att, q_dim,
                               runs);
      else if (naive)
        attend_naive<float>(md, rows, ly, qkv, qkv_dim, cos_t, sin_t, r0, r1, naive_mat, naive_ld, qh, att, q_dim,
                            runs);
      else
        for (int64_t item = r0; item < r1; item++) {
          const int64_t t = item / n_heads, hh = item % n_heads, pos = rows[t].pos;
          qk_head(md, ly, qkv + t * qkv_dim, hh, cos_t + pos * hd, sin_t + pos * hd, qh);
          if (act == BF16)
            attend_head<uint16_t>(md, &rows[t], hh / group, ly->k_cache, ly->v_cache, qh, pos + 1, scores,
                                  att + t * q_dim + hh * hd, runs);
          else
            attend_head<float>(md, &rows[t], hh / group, ly->k_cache, ly->v_cache, qh, pos + 1, scores,
                               att + t * q_dim + hh * hd, runs);
        }
      BARRIER(P_ATTENTION);
      // output projection and the residual
      in.x = att, in.ld = q_dim;
      prepare(&in, &ly->wo);
      my_rows(dim, 16, &r0, &r1);
      gemm(&ly->wo, &in, tmp, out_ld, r0, r1, work);
      for (int64_t t = 0; t < m; t++)
        for (int64_t i = r0; i < r1; i++) x[t * dim + i] += tmp[t * out_ld + i];
      BARRIER(P_WO);
      // feed-forward: gate and up rows side by side, SiLU(gate) * up fused
      for (int64_t t = 0; t < m; t++) rms_norm(x + t * dim, ly->ffn_norm, act, md->eps, h + t * dim, dim);
      in.x = h, in.ld = dim;
      prepare(&in, &ly->w_gate_up);
      my_rows(ffn, 16, &r0, &r1);
      gemm(&ly->w_gate_up, &in, tmp, out_ld, r0, r1, work);
      gemm(&ly->w_gate_up, &in, tmp, out_ld, ffn + r0, ffn + r1, work);  // row ffn + i of the product: up
      for (int64_t t = 0; t < m; t++)
        silu_times(tmp + t * out_ld + r0, tmp + t * out_ld + ffn + r0, ffn_act + t * ffn + r0, r1 - r0);
      BARRIER(P_GATE_UP);
      in.x = ffn_act, in.ld = ffn;
      prepare(&in, &ly->w_down);
      my_rows(dim, 16, &r0, &r1);
      gemm(&ly->w_down, &in, tmp, out_ld, r0, r1, work);
      for (int64_t t = 0; t < m; t++)
        for (int64_t i = r0; i < r1; i++) x[t * dim + i] += tmp[t * out_ld + i];
      BARRIER(P_DOWN);
    }
    if (n_logits > 0) {
      for (int64_t t = 0; t < n_logits; t++) rms_norm(x + logit_rows[t] * dim, md->norm, act, md->eps, h + t * dim, dim);
      in.x = h, in.m = n_logits, in.ld = dim;
      prepare(&in, &md->head);
      my_rows(md->vocab, 16, &r0, &r1);
      gemm(&md->head, &in, logits, md->vocab, r0, r1, work);
    }
    MARK(P_HEAD);
#if defined(ARCH_X86)
    _mm_setcsr(csr);
#endif
  }
  return 0;
}

// y = W x for m rows of x, the matrix's rows split over the threads (the step's own products, for the
// tests); x: (m, k) fp32, y: (m, n) fp32; scratch: membound_product_floats(k, m, threads) floats
extern "C" int64_t membound_product_floats(int64_t k, int64_t m, int64_t threads) {
  const int64_t wide = (k + 63) / 64 * 64;
  return threads * (m * (wide + wide / 2 + wide / 2 + 2 * sums_ld(wide)) + product_floats(wide) + 64);
}

extern "C" int membound_gemm(const struct Mat *mt, const float *x, int64_t m, float *y, float *scratch, int64_t threads) {
  if (m < 1 || m > MAX_ROWS) return 1;
  const int64_t wide = (mt->k + 63) / 64 * 64;
  const int64_t per_thread = m * (wide + wide / 2 + wide / 2 + 2 * sums_ld(wide)) + product_floats(wide) + 64;
#pragma omp parallel num_threads(threads)
  {
    float *mine = scratch + omp_get_thread_num() * per_thread;
    uint16_t *xb = (uint16_t *)(mine + m * wide);
    int16_t *xq = (int16_t *)(mine + m * wide + m * wide / 2);
    float *xsum = mine + m * 2 * wide, *xqs = xsum + m * sums_ld(wide), *work = aligned64(xqs + m * sums_ld(wide));
    for (int64_t t = 0; t < m; t++) memcpy(mine + t * wide, x + t * mt->k, mt->k * sizeof(float));
    struct In in = {mine, m, wide, xb, xq, xsum, xqs};
    int64_t r0, r1;
    prepare(&in, mt);
    my_rows(mt->n, 16, &r0, &r1);
    gemm(mt, &in, y, mt->n, r0, r1, work);
  }
  return 0;
}

// What this build runs: the vector level and its dot products, and the threads
extern "C" const char *membound_isa(void) {
#if defined(LEVEL_AVX512) && defined(HAVE_BF16_DOT) && defined(HAVE_VNNI)
  return "AVX-512 (bf16 and int8 dot products)";
#elif defined(LEVEL_AVX512) && defined(HAVE_BF16_DOT)
  return "AVX-512 (bf16 dot products)";
#elif defined(LEVEL_AVX512) && defined(HAVE_VNNI)
  return "AVX-512 (int8 dot products)";
#elif defined(LEVEL_AVX512)
  return "AVX-512";
#elif defined(LEVEL_AVX2)
  return "AVX2";
#elif defined(LEVEL_NEON) && defined(HAVE_BF16_DOT) && defined(HAVE_SDOT)
  return "NEON (BFDOT, SDOT)";
#elif defined(LEVEL_NEON) && defined(HAVE_BF16_DOT)
  return "NEON (BFDOT)";
#elif defined(LEVEL_NEON) && defined(HAVE_SDOT)
  return "NEON (SDOT)";
#elif defined(LEVEL_NEON)
  return "NEON";
#else
  return "scalar";
#endif
}

extern "C" int membound_openmp(void) {
#if defined(_OPENMP)
  return 1;
#else
  return 0;
#endif
}

extern "C" int membound_input_rounding(int64_t fmt) { return input_rounding(fmt); }
