// A standalone driver of kernels/cpu_decode.cpp for builds this machine cannot load (aarch64 under
// qemu-aarch64): tests/kernels/test_cpu_decode_builds.py compiles it per target and reads its output.
//
// `products`: every format's product on awkward shapes and 1..9 token rows against an fp64 reference
// (the inputs rounded as the level takes them), and each row's bits alone against the same row among
// others; prints "product FORMAT N K M ERROR" and "bits FORMAT SAME(0/1)" lines, then "isa NAME".
// `steps`: a small random model per weight format, steps of one row, of two rows of two sequences
// and of three consecutive rows of one sequence (a verify step), the logits printed for the test to
// hold against another build's ("logits FORMAT STEP v0 v1 ...").
// `sample`: rows of logits of awkward lengths (masked tokens, ties), their tempered probabilities and
// top-p tokens at several settings ("row R v...", "probs R T K v...", "token R T K P U TOKEN") for the
// test to hold against PyTorch's softmax and numpy's draw (engine/model/sampling.py).
#include "../../kernels/cpu_decode.cpp"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

static uint64_t rng_state = 12345;
static float uniform(void) {  // in [-1, 1)
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng_state >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static uint16_t f32_to_f16(float f) {  // positive normal values only (scales) or zero, or small signed
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xFF, man = (u >> 13) & 0x3FF;
  if (exp < 113) return (uint16_t)sign;
  return (uint16_t)(sign | ((exp - 112) << 10) | man);
}

// one matrix of a format, and its dequantised weights (fp64) for the reference
struct Made {
  struct Mat mat;
  std::vector<float> f32;
  std::vector<uint16_t> h16, scale, mins;
  std::vector<int8_t> q;
  std::vector<uint8_t> tiles;
  std::vector<double> deq;  // (n, k)
};

static void make(Made *m, int64_t fmt, int64_t n, int64_t k) {
  m->deq.assign(n * k, 0.0);
  m->mat.fmt = fmt, m->mat.n = n, m->mat.k = k, m->mat.group = 32;
  if (fmt == F32 || fmt == BF16) {
    m->f32.resize(n * k), m->h16.resize(n * k);
    for (int64_t i = 0; i < n * k; i++) {
      m->h16[i] = f32_to_bf16(uniform() * 0.5f);
      m->f32[i] = bf16_to_f32(m->h16[i]);
      m->deq[i] = m->f32[i];
    }
    m->mat.w = fmt == F32 ? (const void *)m->f32.data() : (const void *)m->h16.data();
    m->mat.scale = m->mat.min = NULL;
  } else if (fmt == INT8) {
    m->q.resize(n * k), m->scale.resize(n);
    for (int64_t r = 0; r < n; r++) {
      m->scale[r] = f32_to_bf16(0.01f + 0.005f * (uniform() + 1));
      for (int64_t j = 0; j < k; j++) {
        m->q[r * k + j] = (int8_t)lrintf(uniform() * 127);
        m->deq[r * k + j] = (double)m->q[r * k + j] * bf16_to_f32(m->scale[r]);
      }
    }
    m->mat.w = m->q.data(), m->mat.scale = m->scale.data(), m->mat.min = NULL;
  } else {
    const int64_t tiles = (n + 15) / 16, groups = k / 32;
    m->tiles.assign(tiles * 16 * k / 2, 0), m->scale.assign(tiles * groups * 16, 0), m->mins.assign(tiles * groups * 16, 0);
    for (int64_t r = 0; r < n; r++)
      for (int64_t g = 0; g < groups; g++) {
        const int64_t at = ((r / 16) * groups + g) * 16 + r % 16;
        m->scale[at] = f32_to_f16(0.02f + 0.01f * (uniform() + 1));
        m->mins[at] = f32_to_f16(-0.15f + 0.05f * uniform());
      }
    for (int64_t r = 0; r < n; r++)
      for (int64_t j = 0; j < k; j++) {
        const uint32_t code = (uint32_t)((uniform() + 1) * 8) & 15;
        const int64_t t = r / 16, i = r % 16, o = j / 8, e = j % 8, shift = 4 * (e / 2) + 16 * (e % 2);
        uint8_t *word = &m->tiles[t * 16 * k / 2 + o * 64 + 4 * i];
        uint32_t w = load_u32(word) | code << shift;
        memcpy(word, &w, 4);
        const int64_t at = (t * groups + j / 32) * 16 + i;
        m->deq[r * k + j] = code * (double)f16_to_f32(m->scale[at]) + f16_to_f32(m->mins[at]);
      }
    m->mat.w = m->tiles.data(), m->mat.scale = m->scale.data(), m->mat.min = m->mins.data();
  }
}

static const char *NAMES[] = {"fp32", "bf16", "int8", "int4"};

static int products(void) {
  const int64_t shapes[][2] = {{40, 96}, {37, 224}, {3, 160}, {250, 64}, {19, 32}};
  for (int64_t fmt = 0; fmt < 4; fmt++)
    for (const auto &s : shapes) {
      const int64_t n = s[0], k = s[1];
      Made made;
      make(&made, fmt, n, k);
      for (int64_t m : {1, 3, 7, 9}) {
        std::vector<float> x(m * k), y(m * n), alone(n);
        for (auto &v : x) v = uniform() * 3 + 1;
        std::vector<float> scratch(membound_product_floats(k, m, 2) + 64);
        membound_gemm(&made.mat, x.data(), m, y.data(), scratch.data(), 2);
        double worst = 0, top = 0;
        const int rounding = input_rounding(fmt);
        for (int64_t t = 0; t < m; t++)
          for (int64_t r = 0; r < n; r++) {
            double want = 0;
            for (int64_t j = 0; j < k; j++) {
              const float xv = rounding == X_BF16 ? bf16_to_f32(f32_to_bf16(x[t * k + j])) : x[t * k + j];
              want += made.deq[r * k + j] * xv;
            }
            worst = fabs(y[t * n + r] - want) > worst ? fabs(y[t * n + r] - want) : worst;
            top = fabs(want) > top ? fabs(want) : top;
          }
        printf("product %s %lld %lld %lld %.3e\n", NAMES[fmt], (long long)n, (long long)k, (long long)m, worst / top);
        if (m == 9) {  // each row alone, one thread: the same bits
          int same = 1;
          for (int64_t t = 0; t < m; t++) {
            membound_gemm(&made.mat, x.data() + t * k, 1, alone.data(), scratch.data(), 1);
            same &= memcmp(alone.data(), y.data() + t * n, n * sizeof(float)) == 0;
          }
          printf("bits %s %lld %lld %d\n", NAMES[fmt], (long long)n, (long long)k, same);
        }
      }
    }
  printf("isa %s\n", membound_isa());
  return 0;
}

// a random model: dim 64, 2 layers, 4 heads over 2 KV heads of 16, ffn 96, vocab 203, fp32 activations
static int steps(void) {
  const int64_t dim = 64, layers = 2, heads = 4, kv = 2, hd = 16, ffn = 96, vocab = 203, max_len = 16, seqs = 2;
  for (int64_t fmt = 0; fmt < 4; fmt++) {
    rng_state = 777;
    std::vector<Made> mats(layers * 4 + 1);
    std::vector<std::vector<float>> norms(2 * layers + 1, std::vector<float>(dim));
    for (auto &nv : norms)
      for (auto &v : nv) v = 1.0f + 0.1f * uniform();
    std::vector<float> embed(vocab * dim);
    for (auto &v : embed) v = uniform();
    std::vector<struct Layer> ly(layers);
    std::vector<float> kc(layers * seqs * kv * max_len * hd), vc(kc.size());
    for (int64_t l = 0; l < layers; l++) {
      make(&mats[4 * l], fmt, heads * hd + 2 * kv * hd, dim);
      make(&mats[4 * l + 1], fmt, dim, heads * hd);
      make(&mats[4 * l + 2], fmt, 2 * ffn, dim);
      make(&mats[4 * l + 3], fmt, dim, ffn);
      ly[l] = {norms[2 * l].data(), norms[2 * l + 1].data(), NULL, NULL, mats[4 * l].mat, mats[4 * l + 1].mat,
               mats[4 * l + 2].mat, mats[4 * l + 3].mat, kc.data() + l * seqs * kv * max_len * hd,
               vc.data() + l * seqs * kv * max_len * hd};
    }
    make(&mats[4 * layers], fmt == INT4 ? (int64_t)INT8 : fmt, vocab, dim);
    struct Model md = {dim, layers, heads, kv, hd, ffn, vocab, max_len, F32, 1e-5f, embed.data(), norms[2 * layers].data(),
                       mats[4 * layers].mat, ly.data(), max_len * hd, 0};
    std::vector<float> cos_t(max_len * hd), sin_t(max_len * hd);
    for (int64_t p = 0; p < max_len; p++)
      for (int64_t i = 0; i < hd; i++) {
        const double angle = p * pow(10000.0, -(double)(2 * (i % (hd / 2))) / hd);
        cos_t[p * hd + i] = (float)cos(angle), sin_t[p * hd + i] = (float)sin(angle);
      }
    std::vector<float> scratch(membound_scratch_floats(&md, 3, 2, 1)), logits(3 * vocab);
    const int64_t seq_stride = kv * max_len * hd;
    int step = 0;
    // sequence 0: positions 0..4 one row a step, sequence 1 alongside from step 2 (two rows a step)
    for (int64_t p = 0; p < 5; p++, step++) {
      struct Row rows[2] = {{(p * 37 + 5) % vocab, p, 0, NULL}, {(p * 11 + 3) % vocab, p - 2, seq_stride, NULL}};
      const int64_t n = p >= 2 ? 2 : 1, wanted[2] = {0, 1};
      membound_step(&md, rows, n, cos_t.data(), sin_t.data(), wanted, n, logits.data(), scratch.data(), 2, 0, NULL);
      for (int64_t r = 0; r < n; r++) {
        printf("logits %s %d.%lld", NAMES[fmt], step, (long long)r);
        for (int64_t i = 0; i < vocab; i++) printf(" %.6e", logits[r * vocab + i]);
        printf("\n");
      }
    }
    // a verify step: three consecutive rows of sequence 0 (positions 5, 6, 7), causal among them
    struct Row rows[3] = {{9, 5, 0, NULL}, {17, 6, 0, NULL}, {33, 7, 0, NULL}};
    const int64_t wanted[3] = {0, 1, 2};
    membound_step(&md, rows, 3, cos_t.data(), sin_t.data(), wanted, 3, logits.data(), scratch.data(), 2, 0, NULL);
    for (int64_t r = 0; r < 3; r++) {
      printf("logits %s %d.%lld", NAMES[fmt], step, (long long)r);
      for (int64_t i = 0; i < vocab; i++) printf(" %.6e", logits[r * vocab + i]);
      printf("\n");
    }
    // the same rows again under naive attention (its score matrix in memory: attend_naive)
    membound_step(&md, rows, 3, cos_t.data(), sin_t.data(), wanted, 3, logits.data(), scratch.data(), 2, 1, NULL);
    for (int64_t r = 0; r < 3; r++) {
      printf("logits %s naive.%lld", NAMES[fmt], (long long)r);
      for (int64_t i = 0; i < vocab; i++) printf(" %.6e", logits[r * vocab + i]);
      printf("\n");
    }
  }
  printf("isa %s\n", membound_isa());
  return 0;
}

static int sample(void) {
  const int64_t lengths[] = {1, 5, 37, 203, 1000};
  const float temperatures[] = {0.7f, 1.3f};
  const int64_t top_ks[] = {0, 3};
  const double top_ps[] = {0.5, 0.95, 1.0}, us[] = {0.0, 0.37, 0.999999};
  for (int r = 0; r < 5; r++) {
    const int64_t n = lengths[r];
    std::vector<float> logits(n), probs(n), scratch(3 * n + 2);
    for (int64_t i = 0; i < n; i++) logits[i] = r % 2 ? 4.0f * uniform() : roundf(3.0f * uniform());  // (ties)
    if (n > 4) logits[1] = logits[3] = -INFINITY;  // masked
    printf("row %d", r);
    for (int64_t i = 0; i < n; i++) printf(" %.9e", logits[i]);
    printf("\n");
    for (float t : temperatures)
      for (int64_t k : top_ks) {
        if (membound_tempered(logits.data(), n, t, k, probs.data(), scratch.data())) return 1;
        printf("probs %d %g %lld", r, t, (long long)k);
        for (int64_t i = 0; i < n; i++) printf(" %.9e", probs[i]);
        printf("\n");
        for (double p : top_ps)
          for (double u : us)
            printf("token %d %g %lld %g %.17g %lld\n", r, t, (long long)k, p, u,
                   (long long)membound_sample_top_p(logits.data(), n, t, k, p, 1e-5, 1.0 / 4096, u, scratch.data()));
      }
  }
  printf("isa %s\n", membound_isa());
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "steps") == 0) return steps();
  if (argc > 1 && strcmp(argv[1], "sample") == 0) return sample();
  return products();
}
