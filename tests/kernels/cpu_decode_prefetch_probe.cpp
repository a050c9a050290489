// The C++ step's multi-row product blocks behind extern "C" entry points, every argument a run-time value,
// so their compiled code can be read (tests/kernels/test_cpu_decode_prefetch.py: each must ask for the
// next block's lines; GCC 12 once compiled the prefetches of these blocks away)
#include "../../kernels/cpu_decode.cpp"

#define PROBE(name, G, ROWS, T)                                                                               \
  extern "C" void name(const T *const *w, const float *x, int64_t ldx, int64_t k, float *out, const char *ahead, \
                       int64_t row_bytes, int every, int first) {                                             \
    ROWS rows;                                                                                                \
    for (int i = 0; i < R; i++) rows.p[i] = w[i];                                                             \
    block_fma<G, R>(rows, x, ldx, k, out, Ahead{ahead, row_bytes, ROWS::BYTES, every, first});                \
  }
PROBE(probe_f32_g2, 2, F32Rows, float)
PROBE(probe_bf16_g2, 2, BF16Rows, uint16_t)
PROBE(probe_i8_g2, 2, I8Rows, int8_t)
#if G_MAX >= 6
PROBE(probe_f32_g4, 4, F32Rows, float)
PROBE(probe_f32_g6, 6, F32Rows, float)
#endif

#if defined(HAVE_BF16_DOT)
extern "C" void probe_bf16dot_g2(const uint16_t *const *w, const uint16_t *xb, int64_t ldx, int64_t k, float *out,
                                 const char *ahead, int64_t row_bytes, int every, int first) {
  block_bf16dot<2, R>(w, xb, ldx, k, out, Ahead{ahead, row_bytes, 2, every, first});
}
#endif
