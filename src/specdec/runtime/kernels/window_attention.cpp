// Attention of a few query rows over a window of the cache: out = softmax(q k^T * scale + mask) v, for the compiled
// runtime's decode steps and verification passes (n <= 16 rows a sequence) on a CPU with AVX-512.
//
//   query (B, H, n, d), key and value (B, H_kv, K, d) (views of the cache buffer: the window's K slots, any strides
//   but the last), mask (B, 1 or H, n, K), boolean (true: attend) or additive float; float32 or bfloat16 (keys and
//   values widened to float32 exactly, half the bytes to read). Returns (B, n, H, d) in the query's dtype.
//
// Reading the cache once is the cost: after 2048 tokens SmolLM2-135M's float32 cache holds 94 MB, a third of its
// weights. Each group of H / H_kv query heads reads its key/value head in place (no copies per query head), and the
// window is split into chunks of CHUNK slots, so that two threads share even a one-token step: phase 1 computes, for
// each (sequence, key/value head, chunk), every query row's partial softmax over the chunk (its maximum m, its sum
// l = sum exp(s - m) and its output acc = sum exp(s - m) v); phase 2 combines a row's chunks in order.
//
// Batch-invariant: a row's output is a function of its own query, mask row and the window alone. Every score sums
// over d in one fixed order (16 float32 lanes, then the lanes in a fixed tree), every chunk sums its slots in order,
// and the chunks combine in order, whatever n, B or the number of threads. Slots the mask leaves out contribute exact
// zeros (and a chunk with none is skipped), so a wider window, as a wider pass's, leaves a row's bits unchanged: a
// position's logits are the same in a one-token step and inside a verification pass of any width.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <limits>
#include <vector>

namespace {

constexpr int64_t CHUNK = 256;  // window slots per unit of work: 64 KB of float32 keys at d = 64, within L2
constexpr float MASKED = -1e30f;  // a score at or below this (an additive mask's large negative) counts as masked

inline __mmask16 lanes(int64_t left) {  // the first `left` of 16 lanes (none for left <= 0)
  return left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
}

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const at::BFloat16* p, __mmask16 m) {  // bfloat16 widened to float32: its bits, shifted up
  const __m256i half = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

inline __m512 exp16(__m512 x) {  // e^x for x <= 0, float32 (relative error about 2e-7): 2^n e^r, |r| <= ln 2 / 2
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

struct Shape {
  int64_t B, H, Hkv, n, d, K, chunks;
};

// Phase 1 for one (sequence b, key/value head h_kv, chunk c): each of the group's `rows` query rows (q: float32,
// rows of d) against the chunk's slots; writes its m, l and acc (d) into part[row][c]. Each slot's key is read
// (and widened) once for all the rows; each value once for a tile of TILE rows. A row's sums run in the same order
// whichever rows share its tile.
constexpr int64_t TILE = 6;  // rows whose 64 outputs stay in registers while the values stream: 6 x 4 accumulators

template <typename T, typename M>
void chunk_partials(const float* q, const T* key, const T* value, int64_t ks, int64_t vs, const M* mask,
                    int64_t mask_row_stride, int64_t mask_head_stride, const Shape& s, int64_t c, float scale,
                    float* part, int64_t part_row_stride, int64_t group) {
  constexpr float NONE = -std::numeric_limits<float>::infinity();
  const int64_t first = c * CHUNK, slots = std::min(CHUNK, s.K - first), rows = group * s.n;
  thread_local std::vector<float> buffer;
  buffer.resize(rows * CHUNK);
  float* scores = buffer.data();  // (rows, CHUNK): scores, then probabilities
  thread_local std::vector<float> transposed;
  transposed.resize(s.d * 16);
  float* kt = transposed.data();  // (d, 16): a block of 16 keys, transposed and widened to float32
  thread_local std::vector<const M*> masks;
  masks.resize(rows);
  const M** row_mask = masks.data();  // each row's mask from the chunk's first slot (a thread_local: read once)
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < s.n; ++i) row_mask[g * s.n + i] = mask + g * mask_head_stride + i * mask_row_stride + first;
  for (int64_t j0 = 0; j0 < slots; j0 += 16) {  // scores, 16 slots at a time: each sums over d in order
    const int64_t width = std::min<int64_t>(16, slots - j0);
    for (int64_t i = 0; i < width; ++i) {
      const T* ki = key + (first + j0 + i) * ks;
      for (int64_t e = 0; e < s.d; ++e) kt[e * 16 + i] = float(ki[e]);
    }
    for (int64_t i = width; i < 16; ++i)
      for (int64_t e = 0; e < s.d; ++e) kt[e * 16 + i] = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * s.d;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;  // four chains over d, added in a fixed order
      int64_t e = 0;
      for (; e + 4 <= s.d; e += 4) {
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(qr[e]), _mm512_loadu_ps(kt + e * 16), a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(qr[e + 1]), _mm512_loadu_ps(kt + (e + 1) * 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(qr[e + 2]), _mm512_loadu_ps(kt + (e + 2) * 16), a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(qr[e + 3]), _mm512_loadu_ps(kt + (e + 3) * 16), a3);
      }
      for (; e < s.d; ++e) a0 = _mm512_fmadd_ps(_mm512_set1_ps(qr[e]), _mm512_loadu_ps(kt + e * 16), a0);
      __m512 score = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), _mm512_set1_ps(scale));
      const M* mr = row_mask[r] + j0;
      const __mmask16 mk = lanes(width);
      __mmask16 live;
      if constexpr (std::is_same_v<M, bool>) {  // true: attend
        live = _mm512_mask_cmpneq_epi32_mask(mk, _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mk, mr)), _mm512_setzero_si512());
      } else {
        score = _mm512_add_ps(score, _mm512_maskz_loadu_ps(mk, mr));
        live = mk;
      }
      live = _mm512_mask_cmp_ps_mask(live, score, _mm512_set1_ps(MASKED), _CMP_GT_OQ);
      _mm512_mask_storeu_ps(scores + r * CHUNK + j0, mk, _mm512_mask_mov_ps(_mm512_set1_ps(NONE), live, score));
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // each row: its maximum, probabilities (masked: exactly 0), their sum
    float* sr = scores + r * CHUNK;
    __m512 top = _mm512_set1_ps(NONE);
    for (int64_t j = 0; j < slots; j += 16) top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(NONE), lanes(slots - j), sr + j));
    const float m = _mm512_reduce_max_ps(top);  // a maximum is the same in any order
    float* out = part + r * part_row_stride + c * (s.d + 2);
    out[0] = m;
    out[1] = 0.0f;
    if (m == NONE) continue;  // nothing to attend to in this chunk
    __m512 sum = _mm512_setzero_ps();  // lane i sums the slots i mod 16, in order; then the lanes in a fixed tree
    for (int64_t j = 0; j < slots; j += 16) {
      const __mmask16 mk = lanes(slots - j);
      const __m512 x = _mm512_maskz_loadu_ps(mk, sr + j);
      const __mmask16 live = _mm512_mask_cmp_ps_mask(mk, x, _mm512_set1_ps(NONE), _CMP_NEQ_OQ);
      const __m512 p = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(x, _mm512_set1_ps(m))));
      _mm512_mask_storeu_ps(sr + j, mk, p);
      sum = _mm512_add_ps(sum, p);
    }
    out[1] = _mm512_reduce_add_ps(sum);
  }
  for (int64_t e = 0; e < s.d; e += 64)  // acc = sum_j p_j v_j, slots in order: 64 of d and TILE rows at a time
    for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
      const int64_t tile = std::min(TILE, rows - r0);
      const __mmask16 m0 = lanes(s.d - e), m1 = lanes(s.d - e - 16), m2 = lanes(s.d - e - 32), m3 = lanes(s.d - e - 48);
      __m512 a[TILE][4];
      for (int64_t t = 0; t < TILE; ++t)
        for (int u = 0; u < 4; ++u) a[t][u] = _mm512_setzero_ps();
      for (int64_t j = 0; j < slots; ++j) {
        const T* vj = value + (first + j) * vs + e;
        const __m512 v0 = load(vj, m0), v1 = load(vj + 16, m1), v2 = load(vj + 32, m2), v3 = load(vj + 48, m3);
        for (int64_t t = 0; t < tile; ++t) {
          const float pj = scores[(r0 + t) * CHUNK + j];
          if (pj == 0.0f) continue;  // a masked slot (its value may be anything): no term at all
          const __m512 p = _mm512_set1_ps(pj);
          a[t][0] = _mm512_fmadd_ps(p, v0, a[t][0]);
          a[t][1] = _mm512_fmadd_ps(p, v1, a[t][1]);
          a[t][2] = _mm512_fmadd_ps(p, v2, a[t][2]);
          a[t][3] = _mm512_fmadd_ps(p, v3, a[t][3]);
        }
      }
      for (int64_t t = 0; t < tile; ++t) {
        float* out = part + (r0 + t) * part_row_stride + c * (s.d + 2) + 2 + e;
        _mm512_mask_storeu_ps(out, m0, a[t][0]);
        _mm512_mask_storeu_ps(out + 16, m1, a[t][1]);
        _mm512_mask_storeu_ps(out + 32, m2, a[t][2]);
        _mm512_mask_storeu_ps(out + 48, m3, a[t][3]);
      }
    }
}

template <typename T, typename M>
void attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
            double scale, at::Tensor& out) {
  const Shape s{query.size(0), query.size(1), key.size(1), query.size(2), query.size(3), key.size(2),
                (key.size(2) + CHUNK - 1) / CHUNK};
  const int64_t group = s.H / s.Hkv;
  at::Tensor q = query.to(at::kFloat).contiguous();  // (B, H, n, d): each group's rows are contiguous
  at::Tensor part = at::empty({s.B, s.H, s.n, s.chunks, s.d + 2}, query.options().dtype(at::kFloat));
  const float* qp = q.data_ptr<float>();
  float* pp = part.data_ptr<float>();
  const T* kp = key.data_ptr<T>();
  const T* vp = value.data_ptr<T>();
  const M* mp = mask.data_ptr<M>();
  const int64_t mh = mask.size(1) == 1 ? 0 : mask.stride(1), mb = mask.size(0) == 1 ? 0 : mask.stride(0);  // broadcast
  at::parallel_for(0, s.B * s.Hkv * s.chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t c = u % s.chunks, h = (u / s.chunks) % s.Hkv, b = u / (s.chunks * s.Hkv);
      chunk_partials<T, M>(qp + (b * s.H + h * group) * s.n * s.d, kp + b * key.stride(0) + h * key.stride(1),
                           vp + b * value.stride(0) + h * value.stride(1), key.stride(2), value.stride(2),
                           mp + b * mb + (mh ? h * group * mh : 0), mask.stride(2), mh, s, c, float(scale),
                           pp + (b * s.H + h * group) * s.n * s.chunks * (s.d + 2), s.chunks * (s.d + 2), group);
    }
  });
  at::Tensor result = at::empty({s.B, s.n, s.H, s.d}, query.options().dtype(at::kFloat));
  float* rp = result.data_ptr<float>();
  at::parallel_for(0, s.B * s.H * s.n, 1, [&](int64_t begin, int64_t end) {  // phase 2: a row's chunks, in order
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % s.n, h = (r / s.n) % s.H, b = r / (s.n * s.H);
      const float* rows = pp + r * s.chunks * (s.d + 2);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < s.chunks; ++c) m = std::max(m, rows[c * (s.d + 2)]);
      float* o = rp + ((b * s.n + i) * s.H + h) * s.d;
      for (int64_t e = 0; e < s.d; ++e) o[e] = 0.0f;
      float l = 0.0f;
      for (int64_t c = 0; c < s.chunks; ++c) {
        const float* p = rows + c * (s.d + 2);
        if (p[0] == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp(p[0] - m);
        l += w * p[1];
        for (int64_t e = 0; e < s.d; ++e) o[e] += w * p[2 + e];
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a row with nothing to attend to: zeros
      for (int64_t e = 0; e < s.d; ++e) o[e] *= inv;
    }
  });
  out = result.scalar_type() == query.scalar_type() ? result : result.to(query.scalar_type());
}

at::Tensor window_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && mask.dim() == 4, "4-D tensors expected");
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1, "keys and values need contiguous rows");
  TORCH_CHECK(key.scalar_type() == query.scalar_type() && value.scalar_type() == query.scalar_type(), "one dtype");
  TORCH_CHECK(query.size(1) % key.size(1) == 0, "query heads must be a multiple of key/value heads");
  TORCH_CHECK(mask.size(3) == key.size(2) && mask.size(2) == query.size(2), "the mask must be (B or 1, 1 or H, n, K)");
  TORCH_CHECK(mask.size(0) == 1 || mask.size(0) == query.size(0), "the mask must be (B or 1, 1 or H, n, K)");
  at::Tensor out;
  const bool boolean = mask.scalar_type() == at::kBool;
  at::Tensor m = boolean ? mask : mask.to(at::kFloat);
  if (m.stride(3) != 1) m = m.contiguous();
  if (query.scalar_type() == at::kFloat) {
    boolean ? attend<float, bool>(query, key, value, m, scale, out) : attend<float, float>(query, key, value, m, scale, out);
  } else {
    TORCH_CHECK(query.scalar_type() == at::kBFloat16, "float32 or bfloat16 expected");
    boolean ? attend<at::BFloat16, bool>(query, key, value, m, scale, out)
            : attend<at::BFloat16, float>(query, key, value, m, scale, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdec, m) {
  m.def("window_attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("window_attention", &window_attention); }
