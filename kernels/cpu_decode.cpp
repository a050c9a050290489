// One batch-1 decode step of a Llama-family transformer on a CPU, in one OpenMP parallel region.
// Contract: `membound_decode_step` computes the logits of one token at position `pos`, writing its
// K/V into the cache; kernels/cpu_decode.py builds the descriptors and checks it against PyTorch.
//
// Why one region: an eager PyTorch step is ~700 operators, each a parallel region (a wake-up and a
// barrier) plus Python between them; on a 2-core machine that overhead rivalled the memory time of
// the small formats. Here the threads stay in one region for the whole step and meet at ~6 barriers
// per layer. Every weight is read once, at its stored precision: no dequantised copy is written.
//
// Matrix formats (struct Mat): F32 and BF16 (N, K) row-major; INT8 codes (N, K) with one bf16 scale
// per row; INT4 codes in blocks of 32 along K, 16 bytes a block, byte j holding element j (low
// nibble) and j + 16 (high nibble) of the block (GGUF's Q4_0/Q4_1 order), with an fp16 scale and
// min per group of `group` elements: w = code * scale + min.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { F32 = 0, BF16 = 1, INT8 = 2, INT4 = 3 };

struct Mat {
  int64_t fmt, n, k, group;
  const void *w;      // codes or weights
  const void *scale;  // INT8: bf16 (n); INT4: fp16 (n, k / group)
  const void *min;    // INT4: fp16 (n, k / group)
};

struct Layer {
  const void *attn_norm, *ffn_norm;  // (dim), activation dtype
  const void *bqkv;                  // (q_dim + 2 kv_dim) or null
  const void *qk_norm;               // (n_heads + n_kv, head_dim) or null
  struct Mat wqkv, wo, w_gate_up, w_down;
  void *k_cache, *v_cache;           // (n_kv, max_len, head_dim), activation dtype
};

struct Model {
  int64_t dim, n_layers, n_heads, n_kv, head_dim, ffn_dim, vocab, max_len;
  int64_t act;  // F32 or BF16: the embedding, norm weights, biases and KV cache
  float eps;
  const void *embed;  // (vocab, dim)
  const void *norm;   // (dim)
  struct Mat head;
  const struct Layer *layers;
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
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
  if (exp == 0) {  // zero or subnormal
    float f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  u = exp == 31 ? sign | 0x7F800000 | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
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

// ---- the rows of this thread --------------------------------------------------------------------
static inline void my_rows(int64_t n, int64_t align, int64_t *r0, int64_t *r1) {
  int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  int64_t blocks = (n + align - 1) / align;
  int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
  *r0 = b0 * align < n ? b0 * align : n;
  *r1 = b1 * align < n ? b1 * align : n;
}

// ---- matrix-vector products over rows [r0, r1): y[r] = W[r] . x ------------------------------------
// x: fp32 (k); xb: the same rounded to bf16 (read by BF16 weights only)
// The hardware prefetchers lose track of four short rows read side by side (a row of the default
// model is 9 to 36 cache lines), so each product asks for the same line of the rows `AHEAD_ROWS`
// further on: one block of rows runs ahead in memory while this one computes.
#ifndef AHEAD_ROWS
#define AHEAD_ROWS 4
#endif
static inline void prefetch_rows(const void *row, int64_t row_bytes, int64_t offset) {
#if defined(__x86_64__)
  const char *p = (const char *)row + AHEAD_ROWS * row_bytes + offset;
  for (int i = 0; i < 4; i++) _mm_prefetch(p + i * row_bytes, _MM_HINT_T0);
#else
  (void)row, (void)row_bytes, (void)offset;
#endif
}

// A tile is one stream, and the prefetchers keep up with it better when asked this far ahead.
#define AHEAD_TILE_BYTES 2048

#if defined(__AVX512F__)
static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }
static inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }
#endif

static void gemv_f32(const struct Mat *m, const float *x, float *y, int64_t r0, int64_t r1) {
  const float *w = (const float *)m->w;
  int64_t k = m->k, r = r0;
#if defined(__AVX512F__)
  for (; r + 4 <= r1; r += 4) {
    const float *w0 = w + r * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < k; j += 16) {
      __mmask16 mk = tail_mask(k - j);
      __m512 xv = _mm512_maskz_loadu_ps(mk, x + j);
      prefetch_rows(w0, 4 * k, 4 * j);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w0 + j), xv, a0);
      a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w1 + j), xv, a1);
      a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w2 + j), xv, a2);
      a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w3 + j), xv, a3);
    }
    y[r] = hsum(a0), y[r + 1] = hsum(a1), y[r + 2] = hsum(a2), y[r + 3] = hsum(a3);
  }
#endif
  for (; r < r1; r++) {
    const float *wr = w + r * k;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < k; j++) s += wr[j] * x[j];
    y[r] = s;
  }
}

static void gemv_bf16(const struct Mat *m, const float *x, const uint16_t *xb, float *y, int64_t r0, int64_t r1) {
  const uint16_t *w = (const uint16_t *)m->w;
  int64_t k = m->k, r = r0;
#if defined(__AVX512BF16__)
  // vdpbf16ps: 32 bf16 products a step, summed in pairs into 16 fp32 lanes
  for (; r + 4 <= r1; r += 4) {
    const uint16_t *w0 = w + r * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < k; j += 32) {
      __mmask32 mk = k - j >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (k - j)) - 1);
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mk, xb + j);
      prefetch_rows(w0, 2 * k, 2 * j);
      a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(mk, w0 + j), xv);
      a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_maskz_loadu_epi16(mk, w1 + j), xv);
      a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_maskz_loadu_epi16(mk, w2 + j), xv);
      a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_maskz_loadu_epi16(mk, w3 + j), xv);
    }
    y[r] = hsum(a0), y[r + 1] = hsum(a1), y[r + 2] = hsum(a2), y[r + 3] = hsum(a3);
  }
#elif defined(__AVX512F__)
  for (; r + 4 <= r1; r += 4) {
    const uint16_t *w0 = w + r * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < k; j += 16) {
      __mmask16 mk = tail_mask(k - j);
      __m512 xv = _mm512_maskz_loadu_ps(mk, x + j);
      if ((j & 31) == 0) prefetch_rows(w0, 2 * k, 2 * j);
#define BF16_ROW(wr) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, (wr) + j)), 16))
      a0 = _mm512_fmadd_ps(BF16_ROW(w0), xv, a0);
      a1 = _mm512_fmadd_ps(BF16_ROW(w1), xv, a1);
      a2 = _mm512_fmadd_ps(BF16_ROW(w2), xv, a2);
      a3 = _mm512_fmadd_ps(BF16_ROW(w3), xv, a3);
#undef BF16_ROW
    }
    y[r] = hsum(a0), y[r + 1] = hsum(a1), y[r + 2] = hsum(a2), y[r + 3] = hsum(a3);
  }
#endif
  for (; r < r1; r++) {
    const uint16_t *wr = w + r * k;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < k; j++) s += bf16_to_f32(wr[j]) * bf16_to_f32(xb[j]);
    y[r] = s;
  }
  (void)x;
}

static void gemv_int8(const struct Mat *m, const float *x, float *y, int64_t r0, int64_t r1) {
  const int8_t *q = (const int8_t *)m->w;
  const uint16_t *scale = (const uint16_t *)m->scale;
  int64_t k = m->k, r = r0;
#if defined(__AVX512F__)
  for (; r + 4 <= r1; r += 4) {
    const int8_t *q0 = q + r * k, *q1 = q0 + k, *q2 = q1 + k, *q3 = q2 + k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < k; j += 16) {
      __mmask16 mk = tail_mask(k - j);
      __m512 xv = _mm512_maskz_loadu_ps(mk, x + j);
      if ((j & 63) == 0) prefetch_rows(q0, k, j);
#define INT8_ROW(qr) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, (qr) + j)))
      a0 = _mm512_fmadd_ps(INT8_ROW(q0), xv, a0);
      a1 = _mm512_fmadd_ps(INT8_ROW(q1), xv, a1);
      a2 = _mm512_fmadd_ps(INT8_ROW(q2), xv, a2);
      a3 = _mm512_fmadd_ps(INT8_ROW(q3), xv, a3);
#undef INT8_ROW
    }
    y[r] = hsum(a0) * bf16_to_f32(scale[r]);
    y[r + 1] = hsum(a1) * bf16_to_f32(scale[r + 1]);
    y[r + 2] = hsum(a2) * bf16_to_f32(scale[r + 2]);
    y[r + 3] = hsum(a3) * bf16_to_f32(scale[r + 3]);
  }
#endif
  for (; r < r1; r++) {
    const int8_t *qr = q + r * k;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < k; j++) s += (float)qr[j] * x[j];
    y[r] = s * bf16_to_f32(scale[r]);
  }
}

// INT4 in tiles of 16 rows (the C++ format, made by engine/model/quant.py `Int4Linear.cpu_matrix`):
// tile t holds, for each octet of inputs k = 8j .. 8j + 7, 64 bytes: one little-endian 32-bit word per
// row i = 0..15 whose nibble at bit 4a + 16b is the code of input 8j + 2a + b; scales and mins are
// (tiles, groups, 16) fp16. The 16 rows of a tile are the 16 lanes of a vector, and each 16-bit half
// of a lane one input of a pair: one shift and one logic op turn a word into a bf16 pair, multiplied
// by a broadcast pair of inputs; no sum across lanes is needed.
// xb: x rounded to bf16; xsum: the sum of xb over each group (the mins' share)
static void gemv_int4(const struct Mat *m, const uint16_t *xb, const float *xsum, float *y, int64_t r0, int64_t r1) {
  const uint8_t *codes = (const uint8_t *)m->w;
  const uint16_t *scale = (const uint16_t *)m->scale, *mins = (const uint16_t *)m->min;
  const int64_t k = m->k, groups = k / m->group, octets = m->group / 8, tile_bytes = 16 * k / 2;
  for (int64_t t = r0 / 16; t * 16 < r1; t++) {
    const uint8_t *p = codes + t * tile_bytes;
    const uint16_t *st = scale + t * groups * 16, *mt = mins + t * groups * 16;
    // the rows of this tile to store: those in [r0, r1) (a range may start or end inside a tile)
    const int64_t first = r0 > t * 16 ? r0 - t * 16 : 0, end = r1 - t * 16 < 16 ? r1 - t * 16 : 16;
#if defined(__AVX512BF16__)
    // code c becomes the bf16 number 128 + c by setting the exponent bits (c | 0x4300): one logic op,
    // exact; the 128 * sum(x) it adds to each group's sum comes off with the mins' term below
    const __m512i low4 = _mm512_set1_epi32(0x000F000F), exponent = _mm512_set1_epi32(0x43004300);
    const __m512 offset = _mm512_set1_ps(128.0f);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
      __m512 s0 = _mm512_setzero_ps(), s1 = s0;  // two chains: the products of an octet do not wait on each other
      const uint32_t *xp = (const uint32_t *)(xb + g * m->group);  // input pairs (k, k + 1)
      for (int64_t j = 0; j < octets; j++, p += 64, xp += 4) {
        _mm_prefetch((const char *)p + AHEAD_TILE_BYTES, _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512(p);  // a dword per row: its 8 inputs, nibble 4a + 16b = input 2a + b
        __m512i c01 = _mm512_ternarylogic_epi32(v, low4, exponent, 0xEA);  // (v & mask) | 0x4300 per word
        __m512i c23 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 4), low4, exponent, 0xEA);
        __m512i c45 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 8), low4, exponent, 0xEA);
        __m512i c67 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 12), low4, exponent, 0xEA);
        s0 = _mm512_dpbf16_ps(s0, (__m512bh)c01, (__m512bh)_mm512_set1_epi32((int)xp[0]));
        s1 = _mm512_dpbf16_ps(s1, (__m512bh)c23, (__m512bh)_mm512_set1_epi32((int)xp[1]));
        s0 = _mm512_dpbf16_ps(s0, (__m512bh)c45, (__m512bh)_mm512_set1_epi32((int)xp[2]));
        s1 = _mm512_dpbf16_ps(s1, (__m512bh)c67, (__m512bh)_mm512_set1_epi32((int)xp[3]));
      }
      __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(st + g * 16)));
      __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mt + g * 16)));
      acc = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), d, acc);
      acc = _mm512_fmadd_ps(_mm512_fnmadd_ps(offset, d, mn), _mm512_set1_ps(xsum[g]), acc);  // (min - 128 d) sum(x)
    }
    _mm512_mask_storeu_ps(y + t * 16, (__mmask16)(((1u << end) - 1) & ~((1u << first) - 1)), acc);
#else
    float acc[16] = {0};
    for (int64_t g = 0; g < groups; g++) {
      float sum[16] = {0};
      for (int64_t j = 0; j < octets; j++, p += 64) {
        const int64_t k0 = g * m->group + 8 * j;
        float xs[8];
        for (int a = 0; a < 8; a++) xs[a] = bf16_to_f32(xb[k0 + a]);
        for (int i = 0; i < 16; i++) {
          const uint32_t w = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                             (uint32_t)p[4 * i + 3] << 24;
          float r = 0;
          for (int a = 0; a < 4; a++)
            r += (float)((w >> (4 * a)) & 15) * xs[2 * a] + (float)((w >> (16 + 4 * a)) & 15) * xs[2 * a + 1];
          sum[i] += r;
        }
      }
      for (int i = 0; i < 16; i++)
        acc[i] += sum[i] * f16_to_f32(st[g * 16 + i]) + f16_to_f32(mt[g * 16 + i]) * xsum[g];
    }
    for (int64_t i = first; i < end; i++) y[t * 16 + i] = acc[i];
#endif
  }
}

// per-thread scratch for one product: x rounded to bf16 and the group sums of x
struct Input {
  const float *x;
  uint16_t *xb;
  float *xsum;
};

static void prepare(struct Input *in, const struct Mat *m, int64_t k) {
  if (m->fmt == BF16 || m->fmt == INT4)
    for (int64_t j = 0; j < k; j++) in->xb[j] = f32_to_bf16(in->x[j]);
  if (m->fmt == INT4)  // the sums of what the products multiply: x as rounded to bf16
    for (int64_t g = 0; g < k / m->group; g++) {
      float s = 0;
      for (int64_t j = g * m->group; j < (g + 1) * m->group; j++) s += bf16_to_f32(in->xb[j]);
      in->xsum[g] = s;
    }
}

static void gemv(const struct Mat *m, const struct Input *in, float *y, int64_t r0, int64_t r1) {
  switch (m->fmt) {
    case F32: gemv_f32(m, in->x, y, r0, r1); break;
    case BF16: gemv_bf16(m, in->x, in->xb, y, r0, r1); break;
    case INT8: gemv_int8(m, in->x, y, r0, r1); break;
    default: gemv_int4(m, in->xb, in->xsum, y, r0, r1); break;
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

// q/k head `head` of the step (0 .. n_heads + n_kv - 1), from qkv: bias added by the caller,
// per-head RMSNorm (Qwen3) and RoPE applied
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

// s[t] = exp(s[t] - shift) for t < n (every s[t] <= shift): at 4k positions a step takes a million
// of them, so they are vectorised: exp(x) = 2^k exp(r), k = round(x / ln 2), |r| <= ln 2 / 2, and
// exp(r) by its Taylor series to r^6 (relative error < 2e-7)
static void exp_shifted(float *s, int64_t n, float shift) {
  int64_t t = 0;
#if defined(__AVX512F__)
  const __m512 sh = _mm512_set1_ps(shift), lowest = _mm512_set1_ps(-104.0f);
  for (; t + 16 <= n; t += 16) {
    __m512 x = _mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t), sh), lowest);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);  // ln 2 in two parts: r stays exact
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    _mm512_storeu_ps(s + t, _mm512_scalef_ps(p, k));  // p * 2^k, flushing to 0 far below
  }
#endif
  for (; t < n; t++) s[t] = expf(s[t] - shift);
}

// one query head over cache positions 0..n-1: softmax(q k / sqrt(hd)) v into out (hd)
template <typename T>
static inline float dot_q(const float *q, const T *kr, int64_t hd);

template <>
inline float dot_q<float>(const float *q, const float *kr, int64_t hd) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < hd; i++) s += q[i] * kr[i];
  return s;
}

template <>
inline float dot_q<uint16_t>(const float *q, const uint16_t *kr, int64_t hd) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < hd; i++) s += q[i] * bf16_to_f32(kr[i]);
  return s;
}

template <typename T>
static void attend_head_t(const float *q, const T *kc, const T *vc, int64_t n, int64_t hd, float *scores,
                          float *out) {
  const float scale = 1.0f / sqrtf((float)hd);
  float mx = -INFINITY, total = 0;
  for (int64_t t = 0; t < n; t++) {
    scores[t] = dot_q<T>(q, kc + t * hd, hd) * scale;
    mx = scores[t] > mx ? scores[t] : mx;
  }
  exp_shifted(scores, n, mx);
#pragma omp simd reduction(+ : total)
  for (int64_t t = 0; t < n; t++) total += scores[t];
  for (int64_t i = 0; i < hd; i++) out[i] = 0;
  const float inv = 1.0f / total;
  for (int64_t t = 0; t < n; t++) {
    const float p = scores[t] * inv;
    const T *vr = vc + t * hd;
#pragma omp simd
    for (int64_t i = 0; i < hd; i++) out[i] += p * (sizeof(T) == 2 ? bf16_to_f32((uint16_t)vr[i]) : (float)vr[i]);
  }
}

#if defined(__AVX512F__)
// r[j] = the sum of v[j]'s 16 lanes, for 16 vectors at once (45 shuffles and adds, not 16 full reductions)
static inline __m512 sum16(const __m512 *v) {
  __m512 p[8], q[4];
  for (int i = 0; i < 8; i++)
    p[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; i++) {
    __m512d a = _mm512_castps_pd(p[2 * i]), b = _mm512_castps_pd(p[2 * i + 1]);
    q[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(q[0], q[1], 0x88), _mm512_shuffle_f32x4(q[0], q[1], 0xDD));
  __m512 d = _mm512_add_ps(_mm512_shuffle_f32x4(q[2], q[3], 0x88), _mm512_shuffle_f32x4(q[2], q[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x88), _mm512_shuffle_f32x4(c, d, 0xDD));
}

static inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

// attention of one query head with head_dim a multiple of 16: scores 16 positions at a time, the
// weighted values one 16-wide column block at a time (each cache line of V read once)
template <typename T>
static void attend_head_avx512(const float *q, const T *kc, const T *vc, int64_t n, int64_t hd, float *scores,
                               float *out) {
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t blocks = hd / 16;
  int64_t t = 0;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (; t + 16 <= n; t += 16) {
    __m512 acc[16];
    for (int j = 0; j < 16; j++) {
      const T *kr = kc + (t + j) * hd;
      __m512 a = _mm512_mul_ps(load16(kr), _mm512_loadu_ps(q));
      for (int64_t b = 1; b < blocks; b++) a = _mm512_fmadd_ps(load16(kr + 16 * b), _mm512_loadu_ps(q + 16 * b), a);
      acc[j] = a;
    }
    __m512 s = _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale));
    _mm512_storeu_ps(scores + t, s);
    mx = _mm512_max_ps(mx, s);
  }
  float m = _mm512_reduce_max_ps(mx);
  for (; t < n; t++) {
    const T *kr = kc + t * hd;
    __m512 a = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) a = _mm512_fmadd_ps(load16(kr + 16 * b), _mm512_loadu_ps(q + 16 * b), a);
    scores[t] = _mm512_reduce_add_ps(a) * scale;
    m = scores[t] > m ? scores[t] : m;
  }
  exp_shifted(scores, n, m);
  float total = 0;
  for (int64_t i = 0; i < n; i++) total += scores[i];
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int64_t b = 0; b < blocks; b++) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;  // two chains over the positions
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(scores[i]), load16(vc + i * hd + 16 * b), a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(scores[i + 1]), load16(vc + (i + 1) * hd + 16 * b), a1);
    }
    if (i < n) a0 = _mm512_fmadd_ps(_mm512_set1_ps(scores[i]), load16(vc + i * hd + 16 * b), a0);
    _mm512_storeu_ps(out + 16 * b, _mm512_mul_ps(_mm512_add_ps(a0, a1), inv));
  }
}
#endif

static void attend_head(const float *q, const void *kc, const void *vc, int64_t n, int64_t hd, int64_t act,
                        float *scores, float *out) {
#if defined(__AVX512F__)
  if (hd % 16 == 0) {
    if (act == BF16)
      attend_head_avx512(q, (const uint16_t *)kc, (const uint16_t *)vc, n, hd, scores, out);
    else
      attend_head_avx512(q, (const float *)kc, (const float *)vc, n, hd, scores, out);
    return;
  }
#endif
  if (act == BF16)
    attend_head_t(q, (const uint16_t *)kc, (const uint16_t *)vc, n, hd, scores, out);
  else
    attend_head_t(q, (const float *)kc, (const float *)vc, n, hd, scores, out);
}

static inline float silu(float g) { return g / (1.0f + expf(-g)); }

// ---- the step --------------------------------------------------------------------------------------
// Scratch, in floats: shared x, qkv, attention output and SiLU(gate) * up; then per thread: the
// normed input, its bf16 copy and group sums, attention scores, one head, and a product's output.
static int64_t widest(const struct Model *md) {
  int64_t q_dim = md->n_heads * md->head_dim, w = md->ffn_dim > md->dim ? md->ffn_dim : md->dim;
  return q_dim > w ? q_dim : w;
}

static int64_t shared_floats(const struct Model *md) {
  int64_t q_dim = md->n_heads * md->head_dim, kv_dim = md->n_kv * md->head_dim;
  return md->dim + (q_dim + 2 * kv_dim) + q_dim + md->ffn_dim;
}

static int64_t thread_floats(const struct Model *md) {
  int64_t wide = widest(md);
  return wide + (wide / 32 + 16) + wide + md->max_len + 2 * md->head_dim + 2 * wide + 64;
}

extern "C" int64_t membound_scratch_floats(const struct Model *md, int64_t threads) {
  return shared_floats(md) + threads * thread_floats(md);
}

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

// logits: (vocab) fp32; scratch: membound_scratch_floats(md, threads) floats; profile: null, or
// PHASES doubles that thread 0's seconds are added to
extern "C" void membound_decode_step(const struct Model *md, int64_t token, int64_t pos, const float *cos_row,
                                     const float *sin_row, float *logits, float *scratch, int64_t threads,
                                     double *profile) {
  const int64_t dim = md->dim, hd = md->head_dim, n_heads = md->n_heads, n_kv = md->n_kv, ffn = md->ffn_dim;
  const int64_t q_dim = n_heads * hd, kv_dim = n_kv * hd, act = md->act, group = n_heads / n_kv;
  const int64_t wide = widest(md), per_thread = thread_floats(md);
  float *x = scratch, *qkv = x + dim, *att = qkv + q_dim + 2 * kv_dim, *ffn_act = att + q_dim;
  float *thread_base = scratch + shared_floats(md);
#pragma omp parallel num_threads(threads)
  {
#if defined(__x86_64__)
    // subnormals flushed in every thread of the region, as torch.set_flush_denormal does in the caller's:
    // a subnormal activation takes a microcode path that is tens of times slower
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
#endif
    double *prof = omp_get_thread_num() == 0 ? profile : NULL, last = prof ? omp_get_wtime() : 0;
    float *mine = thread_base + omp_get_thread_num() * per_thread;
    float *h = mine, *xsum = h + wide;
    uint16_t *xb = (uint16_t *)(xsum + wide / 32 + 16);  // wide bf16 values, in wide floats (room to spare)
    float *scores = (float *)(xb + 2 * wide), *qh = scores + md->max_len, *tmp = qh + 2 * hd;
    struct Input in = {h, xb, xsum};
    int64_t r0, r1;

    my_rows(dim, 16, &r0, &r1);
    for (int64_t i = r0; i < r1; i++) x[i] = load_act(md->embed, token * dim + i, act);
    BARRIER(P_EMBED);
    for (int64_t l = 0; l < md->n_layers; l++) {
      const struct Layer *ly = &md->layers[l];
      // attention: q, k, v
      rms_norm(x, ly->attn_norm, act, md->eps, h, dim);
      prepare(&in, &ly->wqkv, dim);
      my_rows(q_dim + 2 * kv_dim, 16, &r0, &r1);
      gemv(&ly->wqkv, &in, qkv, r0, r1);
      if (ly->bqkv)
        for (int64_t i = r0; i < r1; i++) qkv[i] += load_act(ly->bqkv, i, act);
      BARRIER(P_QKV);
      // this step's k and v into the cache (KV heads split over the threads)
      my_rows(n_kv, 1, &r0, &r1);
      for (int64_t j = r0; j < r1; j++) {
        qk_head(md, ly, qkv, n_heads + j, cos_row, sin_row, qh);
        const float *vh = qkv + q_dim + kv_dim + j * hd;
        for (int64_t i = 0; i < hd; i++) {
          store_act(ly->k_cache, (j * md->max_len + pos) * hd + i, qh[i], act);
          store_act(ly->v_cache, (j * md->max_len + pos) * hd + i, vh[i], act);
        }
      }
      BARRIER(P_KV_WRITE);
      // attention, query heads split over the threads
      my_rows(n_heads, 1, &r0, &r1);
      for (int64_t hh = r0; hh < r1; hh++) {
        int64_t j = hh / group;
        const char *kc = (const char *)ly->k_cache, *vc = (const char *)ly->v_cache;
        int64_t offset = j * md->max_len * hd * (act == BF16 ? 2 : 4);
        qk_head(md, ly, qkv, hh, cos_row, sin_row, qh);
        attend_head(qh, kc + offset, vc + offset, pos + 1, hd, act, scores, att + hh * hd);
      }
      BARRIER(P_ATTENTION);
      // output projection and the residual
      in.x = att;
      prepare(&in, &ly->wo, q_dim);
      my_rows(dim, 16, &r0, &r1);
      gemv(&ly->wo, &in, tmp, r0, r1);
      for (int64_t i = r0; i < r1; i++) x[i] += tmp[i];
      in.x = h;
      BARRIER(P_WO);
      // feed-forward: gate and up rows side by side, SiLU(gate) * up fused
      rms_norm(x, ly->ffn_norm, act, md->eps, h, dim);
      prepare(&in, &ly->w_gate_up, dim);
      my_rows(ffn, 16, &r0, &r1);
      gemv(&ly->w_gate_up, &in, tmp, r0, r1);
      gemv(&ly->w_gate_up, &in, tmp, ffn + r0, ffn + r1);  // row ffn + i of the product: up
      for (int64_t i = r0; i < r1; i++) ffn_act[i] = silu(tmp[i]) * tmp[ffn + i];
      BARRIER(P_GATE_UP);
      in.x = ffn_act;
      prepare(&in, &ly->w_down, ffn);
      my_rows(dim, 16, &r0, &r1);
      gemv(&ly->w_down, &in, tmp, r0, r1);
      for (int64_t i = r0; i < r1; i++) x[i] += tmp[i];
      in.x = h;
      BARRIER(P_DOWN);
    }
    rms_norm(x, md->norm, act, md->eps, h, dim);
    prepare(&in, &md->head, dim);
    my_rows(md->vocab, 16, &r0, &r1);
    gemv(&md->head, &in, logits, r0, r1);
    MARK(P_HEAD);
#if defined(__x86_64__)
    _mm_setcsr(csr);
#endif
  }
}

// y = W x for one matrix, its rows split over the threads (the step's own products, for the tests
// and for a single product outside a step); x: (k) fp32, y: (n) fp32
extern "C" void membound_gemv(const struct Mat *m, const float *x, float *y, int64_t threads) {
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<uint16_t> xb;
    thread_local std::vector<float> xsum;
    xb.resize(m->k), xsum.resize(m->k / 8 + 1);
    struct Input in = {x, xb.data(), xsum.data()};
    int64_t r0, r1;
    prepare(&in, m, m->k);
    my_rows(m->n, 16, &r0, &r1);
    gemv(m, &in, y, r0, r1);
  }
}
