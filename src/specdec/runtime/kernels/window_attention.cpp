// Attention of a few query rows over a window of the cache: out = softmax(q k^T * scale + mask) v, for the compiled
// runtime's decode steps and verification passes (n <= 16 rows a sequence) on a CPU with AVX-512.
//
//   query (B, H, n, d), key and value (B, H_kv, K, d) (views of the cache buffer: the window's K slots, any strides
//   but the last), mask (B or 1, 1 or H, n, K), boolean (true: attend) or additive float; float32 or bfloat16 (keys
//   and values widened to float32 exactly, half the bytes to read), or a float32 query over bfloat16 keys and values
//   (a draft's cache kept in bfloat16). Returns (B, n, H, d) in the query's dtype.
//
// Reading the cache once is the cost: after 2048 tokens SmolLM2-135M's float32 cache holds 94 MB, a third of its
// weights. Each group of H / H_kv query heads reads its key/value head in place (no copies per query head), and the
// work splits so that two threads share even a one-token step: the scores by chunks of CHUNK slots, the outputs by
// slices of SLICE of the d lanes.
//
// Batch-invariant, and invariant to where the attended slots lie: a row's output is a function of its query and of
// the keys and values its mask lets it attend to, in slot order, alone. Each score sums over d in one fixed order;
// the row's maximum is exact in any order; each probability is exp(score - maximum); the denominator and every
// output lane sum the attended slots one after another in slot order, skipping the others (adding no term at all).
// So a one-token step and a verification pass of any width give a position the same bits, and so do a tree's
// accepted path moved into place and a batch row whose slots were compacted: the same terms in the same order.
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

constexpr int64_t CHUNK = 256;  // window slots per unit of the scores' work: 64 KB of float32 keys at d = 64
constexpr int64_t SLICE = 32;   // output lanes per unit of the outputs' work: one 64-byte line of a bfloat16 value
constexpr float NONE = -std::numeric_limits<float>::infinity();  // a masked slot's score
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

inline __m512 sums16(const __m512* v) {  // lane j: the sum of v[j]'s 16 lanes
  __m512 w[8], u[4];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// 16 vectors (16 slots' values at 16 lanes of d) to their transpose: out[c] holds lane c of each of the 16.
inline void transpose16(const __m512* r, __m512* out) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g)
    for (int h = 0; h < 2; ++h) {
      const __m512d a = _mm512_castps_pd(t[4 * g + h]), b = _mm512_castps_pd(t[4 * g + h + 2]);
      u[4 * g + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      u[4 * g + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  for (int c = 0; c < 4; ++c) {
    const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 b = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 a2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 b2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
    out[c] = _mm512_shuffle_f32x4(a, a2, _MM_SHUFFLE(2, 0, 2, 0));
    out[8 + c] = _mm512_shuffle_f32x4(a, a2, _MM_SHUFFLE(3, 1, 3, 1));
    out[4 + c] = _mm512_shuffle_f32x4(b, b2, _MM_SHUFFLE(2, 0, 2, 0));
    out[12 + c] = _mm512_shuffle_f32x4(b, b2, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// A block of 16 keys from slot j (past `width`, the last one again) transposed and widened to float32: kt (d rounded
// up to 16, 16), lane i of row e the key j + i's e-th value. Exact: a transposition moves values, it sums nothing.
template <typename T>
inline void transpose_keys(const T* key, int64_t ks, int64_t j, int64_t width, int64_t d, float* kt) {
  __m512 rows[16], out[16];
  for (int64_t e0 = 0; e0 < d; e0 += 16) {
    for (int i = 0; i < 16; ++i) rows[i] = load(key + (j + std::min<int64_t>(i, width - 1)) * ks + e0, lanes(d - e0));
    transpose16(rows, out);
    for (int c = 0; c < 16; ++c) _mm512_storeu_ps(kt + (e0 + c) * 16, out[c]);
  }
}

// A row's 16 scores of a block (the first `mk` lanes), scaled, its mask applied (masked slots NONE), stored.
template <typename M>
inline void store_scores(__m512 score, const M* mr, __mmask16 mk, float scale, float* scores) {
  score = _mm512_mul_ps(score, _mm512_set1_ps(scale));
  __mmask16 live;
  if constexpr (std::is_same_v<M, bool>) {
    live = _mm512_mask_cmpneq_epi32_mask(mk, _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mk, mr)), _mm512_setzero_si512());
  } else {
    score = _mm512_add_ps(score, _mm512_maskz_loadu_ps(mk, mr));
    live = mk;
  }
  live = _mm512_mask_cmp_ps_mask(live, score, _mm512_set1_ps(MASKED), _CMP_GT_OQ);
  _mm512_mask_storeu_ps(scores, mk, _mm512_mask_mov_ps(_mm512_set1_ps(NONE), live, score));
}

// The scores of R rows (from row r; q: rows of d) against a block of 16 transposed keys kt (d, 16), `width` of them
// real: each row sums over d in four chains (e mod 4), added in a fixed order, the same arithmetic whatever R; masked
// slots -inf (each row's mask read from mask_of[row] + j), stored at scores + row * stride.
template <int R, typename M>
inline void score_rows(const float* q, int64_t d, const float* kt, const M* const* mask_of, int64_t j, int64_t r,
                       int64_t width, float scale, float* scores, int64_t stride) {
  __m512 a[R][4];
  for (int t = 0; t < R; ++t) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm512_setzero_ps();
  const float* qr = q + r * d;
  int64_t e = 0;
  for (; e + 4 <= d; e += 4)
    for (int u = 0; u < 4; ++u) {
      const __m512 k = _mm512_loadu_ps(kt + (e + u) * 16);
      for (int t = 0; t < R; ++t) a[t][u] = _mm512_fmadd_ps(_mm512_set1_ps(qr[t * d + e + u]), k, a[t][u]);
    }
  for (; e < d; ++e) {
    const __m512 k = _mm512_loadu_ps(kt + e * 16);
    for (int t = 0; t < R; ++t) a[t][0] = _mm512_fmadd_ps(_mm512_set1_ps(qr[t * d + e]), k, a[t][0]);
  }
  for (int t = 0; t < R; ++t)
    store_scores<M>(_mm512_add_ps(_mm512_add_ps(a[t][0], a[t][1]), _mm512_add_ps(a[t][2], a[t][3])),
                    mask_of[r + t] + j, lanes(width), scale, scores + (r + t) * stride);
}

// The scores of one (sequence, key/value head, chunk of slots): each of the group's `rows` query rows (q: float32,
// rows of d) against the chunk's keys, 16 slots at a time (the keys transposed and widened once for all the rows),
// written to scores (rows, K); masked slots -inf.
template <typename T, typename M>
void chunk_scores(const float* q, const T* key, int64_t ks, const M* mask, int64_t mask_row_stride,
                  int64_t mask_head_stride, const Shape& s, int64_t c, float scale, float* scores, int64_t group) {
  const int64_t first = c * CHUNK, slots = std::min(CHUNK, s.K - first), rows = group * s.n;
  thread_local std::vector<float> transposed;
  transposed.resize((s.d + 15) / 16 * 16 * 16);
  float* kt = transposed.data();  // (d, 16): a block of 16 keys, transposed and widened to float32
  thread_local std::vector<const M*> masks;
  masks.resize(rows);
  const M** mask_of = masks.data();  // each row's mask (a thread_local is read through a call: once here)
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < s.n; ++i) mask_of[g * s.n + i] = mask + g * mask_head_stride + i * mask_row_stride;
  for (int64_t j0 = 0; j0 < slots; j0 += 16) {
    const int64_t width = std::min<int64_t>(16, slots - j0), j = first + j0;
    transpose_keys<T>(key, ks, j, width, s.d, kt);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) score_rows<4, M>(q, s.d, kt, mask_of, j, r, width, scale, scores + j, s.K);
    for (; r < rows; ++r) score_rows<1, M>(q, s.d, kt, mask_of, j, r, width, scale, scores + j, s.K);
  }
}

// A row of K scores to exp(score - their maximum) in place, masked slots exactly 0 (all of them when nothing is
// attended to); returns the maximum (NONE then).
inline float exponentiate(float* row, int64_t K) {
  __m512 top = _mm512_set1_ps(NONE);
  for (int64_t j = 0; j < K; j += 16) top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(NONE), lanes(K - j), row + j));
  const float m = _mm512_reduce_max_ps(top);  // a maximum is the same in any order
  if (m == NONE) {
    for (int64_t j = 0; j < K; ++j) row[j] = 0.0f;
    return m;
  }
  for (int64_t j = 0; j < K; j += 16) {
    const __mmask16 mk = lanes(K - j);
    const __m512 x = _mm512_maskz_loadu_ps(mk, row + j);
    const __mmask16 live = _mm512_mask_cmp_ps_mask(mk, x, _mm512_set1_ps(NONE), _CMP_NEQ_OQ);
    _mm512_mask_storeu_ps(row + j, mk, _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(x, _mm512_set1_ps(m)))));
  }
  return m;
}

// One row's probabilities in place (exponentiate); returns their sum, the slots added one after another in order (0
// when nothing is attended to).
inline float probabilities(float* row, int64_t K) {
  exponentiate(row, K);
  float l = 0.0f;
  for (int64_t j = 0; j < K; ++j) l += row[j];  // zeros add nothing: the attended slots' sum, in order
  return l;
}

// The outputs of one (sequence, key/value head, slice of SLICE lanes): each row's sum_j p_j v_j over the slots in
// order, attended ones only, a tile of rows at a time while the slice of each value streams past; divided by l.
template <int R, typename T>
inline void tile_outputs(const float* p, const float* l, const T* value, int64_t vs, const Shape& s, int64_t e,
                         int64_t r0, float* out, int64_t out_row_stride) {
  const __mmask16 m0 = lanes(s.d - e), m1 = lanes(s.d - e - 16);
  __m512 a[R][2];
  for (int t = 0; t < R; ++t) a[t][0] = a[t][1] = _mm512_setzero_ps();
  for (int64_t j = 0; j < s.K; ++j) {
    const T* vj = value + j * vs + e;
    const __m512 v0 = load(vj, m0), v1 = load(vj + 16, m1);
    for (int t = 0; t < R; ++t) {
      const float pj = p[(r0 + t) * s.K + j];
      const __mmask16 term = pj != 0.0f ? __mmask16(0xFFFF) : __mmask16(0);  // not attended to (its value may be
      const __m512 w = _mm512_set1_ps(pj);                                    // anything): no term at all
      a[t][0] = _mm512_mask3_fmadd_ps(w, v0, a[t][0], term);
      a[t][1] = _mm512_mask3_fmadd_ps(w, v1, a[t][1], term);
    }
  }
  for (int t = 0; t < R; ++t) {
    const float lt = l[r0 + t];
    const __m512 inv = _mm512_set1_ps(lt > 0.0f ? 1.0f / lt : 0.0f);  // nothing attended to: zeros
    float* o = out + (r0 + t) * out_row_stride + e;
    _mm512_mask_storeu_ps(o, m0, _mm512_mul_ps(a[t][0], inv));
    _mm512_mask_storeu_ps(o + 16, m1, _mm512_mul_ps(a[t][1], inv));
  }
}

template <typename T>
void slice_outputs(const float* p, const float* l, const T* value, int64_t vs, const Shape& s, int64_t e,
                   int64_t rows, float* out, int64_t out_row_stride) {
  int64_t r = 0;
  for (; r + 12 <= rows; r += 12) tile_outputs<12, T>(p, l, value, vs, s, e, r, out, out_row_stride);
  for (; r + 3 <= rows; r += 3) tile_outputs<3, T>(p, l, value, vs, s, e, r, out, out_row_stride);
  for (; r < rows; ++r) tile_outputs<1, T>(p, l, value, vs, s, e, r, out, out_row_stride);
}

template <typename T, typename M>
void attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
            double scale, at::Tensor& out) {
  const Shape s{query.size(0), query.size(1), key.size(1), query.size(2), query.size(3), key.size(2),
                (key.size(2) + CHUNK - 1) / CHUNK};
  const int64_t group = s.H / s.Hkv, rows = group * s.n, slices = (s.d + SLICE - 1) / SLICE;
  at::Tensor q = query.to(at::kFloat).contiguous();  // (B, H, n, d): each group's rows are contiguous
  at::Tensor p = at::empty({s.B, s.H, s.n, s.K}, query.options().dtype(at::kFloat));  // scores, then probabilities
  at::Tensor l = at::empty({s.B, s.H, s.n}, query.options().dtype(at::kFloat));
  at::Tensor result = at::empty({s.B, s.H, s.n, s.d}, query.options().dtype(at::kFloat));
  const float* qp = q.data_ptr<float>();
  float* pp = p.data_ptr<float>();
  float* lp = l.data_ptr<float>();
  float* rp = result.data_ptr<float>();
  const T* kp = key.data_ptr<T>();
  const T* vp = value.data_ptr<T>();
  const M* mp = mask.data_ptr<M>();
  const int64_t mh = mask.size(1) == 1 ? 0 : mask.stride(1), mb = mask.size(0) == 1 ? 0 : mask.stride(0);  // broadcast
  at::parallel_for(0, s.B * s.Hkv * s.chunks, 1, [&](int64_t begin, int64_t end) {  // the scores
    for (int64_t u = begin; u < end; ++u) {
      const int64_t c = u % s.chunks, h = (u / s.chunks) % s.Hkv, b = u / (s.chunks * s.Hkv);
      chunk_scores<T, M>(qp + (b * s.H + h * group) * s.n * s.d, kp + b * key.stride(0) + h * key.stride(1),
                         key.stride(2), mp + b * mb + h * group * mh, mask.stride(2), mh, s, c, float(scale),
                         pp + (b * s.H + h * group) * s.n * s.K, group);
    }
  });
  at::parallel_for(0, s.B * s.H * s.n, 1, [&](int64_t begin, int64_t end) {  // each row's probabilities and sum
    for (int64_t r = begin; r < end; ++r) lp[r] = probabilities(pp + r * s.K, s.K);
  });
  at::parallel_for(0, s.B * s.Hkv * slices, 1, [&](int64_t begin, int64_t end) {  // the outputs
    for (int64_t u = begin; u < end; ++u) {
      const int64_t e = (u % slices) * SLICE, h = (u / slices) % s.Hkv, b = u / (slices * s.Hkv);
      const int64_t first = (b * s.H + h * group) * s.n;  // the group's first row
      slice_outputs<T>(pp + first * s.K, lp + first, vp + b * value.stride(0) + h * value.stride(1), value.stride(2),
                       s, e, rows, rp + first * s.d, s.d);
    }
  });
  at::Tensor bnhd = result.transpose(1, 2);  // (B, n, H, d)
  out = bnhd.to(query.scalar_type()).contiguous();
}

// ---- Chunked attention: the window read once, by chunks of SPLIT slots, the chunks combined by log-sum-exp ----
// The default float32 runtime's attention in compiled passes. A decode step's few rows (SmolLM2: 3 a key/value
// head) cannot keep two threads busy row by row, and the cost is reading the cache once, so each (sequence,
// key/value head, chunk) is one unit of work, its keys and values read once for all the group's rows: scores, the
// chunk's maximum m_c, l_c = sum_j exp(s_j - m_c) and o_c = sum_j exp(s_j - m_c) v_j; then each row combines its
// chunks: m = max_c m_c, out = sum_c e^(m_c - m) o_c / sum_c e^(m_c - m) l_c (Flash-Decoding, Dao et al. 2023).
// Deterministic, and a wider window's masked slots add nothing; but a row's sums group its slots by chunk and lane,
// and a step's few rows sum a score in another order than a pass's many (split_scores), so it is not batch-invariant
// (window_attention above is).
constexpr int64_t SPLIT = 256;  // slots per chunk: 64 KB of float32 keys at d = 64

// One chunk's scores for `rows` query rows (q: float32 rows of d <= 16 V; vm: the lanes of d in each of the V
// vectors) over `slots` keys from slot `first`, 16 keys at a time (past the chunk's end, its last key again, dropped
// by the mask); masked slots NONE. scores: (rows, SPLIT). A few rows (a step's group: up to WIDE - 1) sum each key's
// products lane-wise, 16 keys together (sums16); more rows share the block's keys transposed once (transpose16).
constexpr int64_t WIDE = 6;  // rows from which the transposed keys pay (a /tmp probe on the Xeon: 1.14x the time at 3 rows, 0.85x at 15)
template <int V, typename T, typename M>
void split_scores(const float* q, int64_t d, const __mmask16* vm, const T* key, int64_t ks, const M* const* mask_of,
                  int64_t first, int64_t slots, int64_t rows, float scale, float* scores) {
  __m512 v[16];
  float kt[16 * V * 16];  // the block's keys transposed: (16 V, 16)
  constexpr int line = 64 / (16 * sizeof(T));  // 16-lane vectors a cache line holds
  for (int64_t j0 = 0; j0 < slots; j0 += 16) {
    const int64_t width = std::min<int64_t>(16, slots - j0);
    const __mmask16 mk = lanes(width);
    for (int64_t i = 0; i < 16 && j0 + 32 + i < slots; ++i)  // the keys two blocks ahead, on their way
      for (int e = 0; e < V; e += line)
        _mm_prefetch(reinterpret_cast<const char*>(key + (first + j0 + 32 + i) * ks + 16 * e), _MM_HINT_T0);
    if (rows >= WIDE) {
      transpose_keys<T>(key, ks, first + j0, width, d, kt);
      int64_t r = 0;
      for (; r + 4 <= rows; r += 4) score_rows<4, M>(q, d, kt, mask_of, first + j0, r, width, scale, scores + j0, SPLIT);
      for (; r < rows; ++r) score_rows<1, M>(q, d, kt, mask_of, first + j0, r, width, scale, scores + j0, SPLIT);
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * d;
      for (int i = 0; i < 16; ++i) {
        const T* ki = key + (first + j0 + std::min<int64_t>(i, width - 1)) * ks;
        __m512 a = _mm512_mul_ps(load(qr, vm[0]), load(ki, vm[0]));
        for (int e = 1; e < V; ++e) a = _mm512_fmadd_ps(load(qr + 16 * e, vm[e]), load(ki + 16 * e, vm[e]), a);
        v[i] = a;
      }
      store_scores<M>(sums16(v), mask_of[r] + first + j0, mk, scale, scores + r * SPLIT + j0);
    }
  }
}

// o_c of R rows (from row r0), lanes e .. e + 63 (of d), over the chunk: sum_j p_j v_j, masked slots (p_j = 0)
// skipped.
template <int R, typename T>
inline void split_outputs(const float* p, const T* value, int64_t vs, int64_t d, int64_t first, int64_t slots,
                          int64_t r0, int64_t e, float* acc, int64_t acc_row_stride) {
  const __mmask16 m[4] = {lanes(d - e), lanes(d - e - 16), lanes(d - e - 32), lanes(d - e - 48)};
  __m512 a[R][4];
  for (int t = 0; t < R; ++t) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm512_setzero_ps();
  for (int64_t j = 0; j < slots; ++j) {
    const T* vj = value + (first + j) * vs + e;
    for (int u = 0; u < 4; u += 64 / (16 * sizeof(T)))  // the value 16 slots ahead, on its way
      _mm_prefetch(reinterpret_cast<const char*>(vj + 16 * vs + 16 * u), _MM_HINT_T0);
    const __m512 v0 = load(vj, m[0]), v1 = load(vj + 16, m[1]), v2 = load(vj + 32, m[2]), v3 = load(vj + 48, m[3]);
    for (int t = 0; t < R; ++t) {
      const float pj = p[(r0 + t) * SPLIT + j];
      if (pj == 0.0f) continue;  // not attended to (its value may be anything): no term
      const __m512 w = _mm512_set1_ps(pj);
      a[t][0] = _mm512_fmadd_ps(w, v0, a[t][0]);
      a[t][1] = _mm512_fmadd_ps(w, v1, a[t][1]);
      a[t][2] = _mm512_fmadd_ps(w, v2, a[t][2]);
      a[t][3] = _mm512_fmadd_ps(w, v3, a[t][3]);
    }
  }
  for (int t = 0; t < R; ++t)
    for (int u = 0; u < 4; ++u) _mm512_mask_storeu_ps(acc + (r0 + t) * acc_row_stride + e + 16 * u, m[u], a[t][u]);
}

// Chunked attention for d <= 16 V (V = 1, 2, 4, 8 or 16: d up to 256); out (B, n, H, d) in the query's dtype.
template <int V, typename T, typename M>
void split_attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
                  double scale, at::Tensor& out) {
  const int64_t d = query.size(3);
  const Shape s{query.size(0), query.size(1), key.size(1), query.size(2), d, key.size(2),
                (key.size(2) + SPLIT - 1) / SPLIT};
  __mmask16 vm[V];
  for (int e = 0; e < V; ++e) vm[e] = lanes(d - 16 * e);
  const int64_t group = s.H / s.Hkv, rows = group * s.n;
  at::Tensor q = query.to(at::kFloat).contiguous();
  at::Tensor parts = at::empty({s.B * s.H * s.n, s.chunks, d + 2}, query.options().dtype(at::kFloat));  // o_c, m_c, l_c
  const float* qp = q.data_ptr<float>();
  float* pp = parts.data_ptr<float>();
  const int64_t stride = s.chunks * (d + 2);  // a row's parts
  const T* kp = key.data_ptr<T>();
  const T* vp = value.data_ptr<T>();
  const M* mp = mask.data_ptr<M>();
  const int64_t mh = mask.size(1) == 1 ? 0 : mask.stride(1), mb = mask.size(0) == 1 ? 0 : mask.stride(0);
  at::parallel_for(0, s.B * s.Hkv * s.chunks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> buffer;
    buffer.resize(rows * SPLIT);
    float* p = buffer.data();
    thread_local std::vector<const M*> masks;
    masks.resize(rows);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t c = u % s.chunks, h = (u / s.chunks) % s.Hkv, b = u / (s.chunks * s.Hkv);
      const int64_t first = c * SPLIT, slots = std::min(SPLIT, s.K - first), row0 = (b * s.H + h * group) * s.n;
      const M* mbase = mp + b * mb + h * group * mh;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = 0; i < s.n; ++i) masks[g * s.n + i] = mbase + g * mh + i * mask.stride(2);
      const T* kh = kp + b * key.stride(0) + h * key.stride(1);
      const T* vh = vp + b * value.stride(0) + h * value.stride(1);
      split_scores<V, T, M>(qp + row0 * d, d, vm, kh, key.stride(2), masks.data(), first, slots, rows, float(scale), p);
      float* part = pp + row0 * stride + c * (d + 2);
      for (int64_t r = 0; r < rows; ++r) {  // the chunk's maximum, probabilities and their sum
        float* row = p + r * SPLIT;
        part[r * stride + d] = exponentiate(row, slots);
        __m512 total = _mm512_setzero_ps();
        for (int64_t j = 0; j < slots; j += 16) total = _mm512_add_ps(total, _mm512_maskz_loadu_ps(lanes(slots - j), row + j));
        part[r * stride + d + 1] = _mm512_reduce_add_ps(total);
      }
      for (int64_t e = 0; e < d; e += 64) {
        int64_t r = 0;
        for (; r + 6 <= rows; r += 6) split_outputs<6, T>(p, vh, value.stride(2), d, first, slots, r, e, part, stride);
        for (; r + 3 <= rows; r += 3) split_outputs<3, T>(p, vh, value.stride(2), d, first, slots, r, e, part, stride);
        for (; r < rows; ++r) split_outputs<1, T>(p, vh, value.stride(2), d, first, slots, r, e, part, stride);
      }
    }
  });
  at::Tensor result = at::empty({s.B, s.n, s.H, d}, query.options().dtype(at::kFloat));
  float* rp = result.data_ptr<float>();
  at::parallel_for(0, s.B * s.H * s.n, 64, [&](int64_t begin, int64_t end) {  // each row: its chunks combined
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % s.n, h = (r / s.n) % s.H, b = r / (s.n * s.H);
      const float* part = pp + r * stride;
      float top = NONE;
      for (int64_t c = 0; c < s.chunks; ++c) top = std::max(top, part[c * (d + 2) + d]);
      __m512 o[V];
      for (int u = 0; u < V; ++u) o[u] = _mm512_setzero_ps();
      float l = 0.0f;
      for (int64_t c = 0; top != NONE && c < s.chunks; ++c) {
        const float* pc = part + c * (d + 2);
        if (pc[d] == NONE) continue;  // nothing attended to in this chunk
        const float w = std::exp(pc[d] - top);
        l += w * pc[d + 1];
        for (int u = 0; u < V; ++u) o[u] = _mm512_fmadd_ps(_mm512_set1_ps(w), load(pc + 16 * u, vm[u]), o[u]);
      }
      const __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);  // nothing attended to: zeros
      float* dst = rp + ((b * s.n + i) * s.H + h) * d;
      for (int u = 0; u < V; ++u) _mm512_mask_storeu_ps(dst + 16 * u, vm[u], _mm512_mul_ps(o[u], inv));
    }
  });
  out = query.scalar_type() == at::kFloat ? result : result.to(query.scalar_type());
}

// The chunked kernel for d up to 256 (in 1, 2, 4, 8 or 16 vectors of 16 lanes), else window_attention's (one order
// a row); out (B, n, H, d).
template <typename T, typename M>
void split_or_window(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
                     double scale, at::Tensor& out) {
  const int64_t d = query.size(3);
  if (d <= 16) return split_attend<1, T, M>(query, key, value, mask, scale, out);
  if (d <= 32) return split_attend<2, T, M>(query, key, value, mask, scale, out);
  if (d <= 64) return split_attend<4, T, M>(query, key, value, mask, scale, out);
  if (d <= 128) return split_attend<8, T, M>(query, key, value, mask, scale, out);
  if (d <= 256) return split_attend<16, T, M>(query, key, value, mask, scale, out);
  return attend<T, M>(query, key, value, mask, scale, out);
}

// Checks the arguments, then runs attend (one order a row: window_attention) or split_attend (split_attention).
at::Tensor run(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
               double scale, bool split) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && mask.dim() == 4, "4-D tensors expected");
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1, "keys and values need contiguous rows");
  TORCH_CHECK(value.scalar_type() == key.scalar_type(), "keys and values of one dtype");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() || query.scalar_type() == at::kFloat,
              "a float32 query, or a query of the keys' dtype");
  TORCH_CHECK(query.size(1) % key.size(1) == 0, "query heads must be a multiple of key/value heads");
  TORCH_CHECK(mask.size(3) == key.size(2) && mask.size(2) == query.size(2), "the mask must be (B or 1, 1 or H, n, K)");
  TORCH_CHECK(mask.size(0) == 1 || mask.size(0) == query.size(0), "the mask must be (B or 1, 1 or H, n, K)");
  at::Tensor out;
  const bool boolean = mask.scalar_type() == at::kBool;
  at::Tensor m = boolean ? mask : mask.to(at::kFloat);
  if (m.stride(3) != 1) m = m.contiguous();
  if (key.scalar_type() == at::kFloat) {
    if (split) boolean ? split_or_window<float, bool>(query, key, value, m, scale, out) : split_or_window<float, float>(query, key, value, m, scale, out);
    else boolean ? attend<float, bool>(query, key, value, m, scale, out) : attend<float, float>(query, key, value, m, scale, out);
  } else {
    TORCH_CHECK(key.scalar_type() == at::kBFloat16, "float32 or bfloat16 expected");
    if (split) boolean ? split_or_window<at::BFloat16, bool>(query, key, value, m, scale, out)
                       : split_or_window<at::BFloat16, float>(query, key, value, m, scale, out);
    else boolean ? attend<at::BFloat16, bool>(query, key, value, m, scale, out)
                 : attend<at::BFloat16, float>(query, key, value, m, scale, out);
  }
  return out;
}

at::Tensor window_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& mask, double scale) {
  return run(query, key, value, mask, scale, false);
}

at::Tensor split_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const at::Tensor& mask, double scale) {
  return run(query, key, value, mask, scale, true);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdec, m) {
  m.def("window_attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor");
  m.def("split_attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("window_attention", &window_attention);
  m.impl("split_attention", &split_attention);
}
