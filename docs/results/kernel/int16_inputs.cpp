// A probe, not the runtime's kernel: the int8 copy's products with each input row rounded to 16-bit integers, so that
// AVX512-VNNI's vpdpwssd multiplies pairs of int16 (the int8 weights widened) into int32 sums: 32 multiply-adds an
// instruction against 16 for packed_mm.cpp's widen-to-float32 FMAs. The weights are laid out in pairs along k,
// (panels, K / 2, 48, 2). A row's scale is its largest |x| over A, A chosen so that no int32 sum can overflow.
// Run by int16_inputs.py.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <immintrin.h>
#include <cmath>
namespace {
constexpr int64_t PANEL = 48, TILE = 8, FAR = 6144, NEAR = 3072;
inline void prefetch_pair(const int8_t* p, int l1) {  // 96 bytes: two lines
  l1 ? (_mm_prefetch((const char*)p, _MM_HINT_T0), _mm_prefetch((const char*)p + 64, _MM_HINT_T0))
     : (_mm_prefetch((const char*)p, _MM_HINT_T1), _mm_prefetch((const char*)p + 64, _MM_HINT_T1));
}
inline __m512i widen32(const int8_t* w) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)w)); }
template <int M>
void tile(const int32_t* x, int64_t K2, const int8_t* panel, const float* scale, const float* xs, float* y,
          int64_t ldy, const __mmask16 masks[3]) {
  __m512i acc[M][3];
  for (int m = 0; m < M; ++m) for (int j = 0; j < 3; ++j) acc[m][j] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K2; ++k) {
    const int8_t* w = panel + k * 2 * PANEL;
    prefetch_pair(w + FAR, 0); prefetch_pair(w + NEAR, 1);
    const __m512i w0 = widen32(w), w1 = widen32(w + 32), w2 = widen32(w + 64);
    for (int m = 0; m < M; ++m) {
      const __m512i a = _mm512_set1_epi32(x[m * K2 + k]);
      acc[m][0] = _mm512_dpwssd_epi32(acc[m][0], a, w0);
      acc[m][1] = _mm512_dpwssd_epi32(acc[m][1], a, w1);
      acc[m][2] = _mm512_dpwssd_epi32(acc[m][2], a, w2);
    }
  }
  for (int m = 0; m < M; ++m) {
    const __m512 s = _mm512_set1_ps(xs[m]);
    for (int j = 0; j < 3; ++j) {
      __m512 out = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[m][j]), _mm512_loadu_ps(scale + 16 * j)), s);
      _mm512_mask_storeu_ps(y + m * ldy + 16 * j, masks[j], out);
    }
  }
}
void rows_tile(int64_t r, const int32_t* x, int64_t K2, const int8_t* p, const float* s, const float* xs, float* y, int64_t ldy, const __mmask16 mk[3]) {
  switch (r) { case 1: return tile<1>(x,K2,p,s,xs,y,ldy,mk); case 2: return tile<2>(x,K2,p,s,xs,y,ldy,mk);
    case 3: return tile<3>(x,K2,p,s,xs,y,ldy,mk); case 4: return tile<4>(x,K2,p,s,xs,y,ldy,mk);
    case 5: return tile<5>(x,K2,p,s,xs,y,ldy,mk); case 6: return tile<6>(x,K2,p,s,xs,y,ldy,mk);
    case 7: return tile<7>(x,K2,p,s,xs,y,ldy,mk); default: return tile<8>(x,K2,p,s,xs,y,ldy,mk); }
}
__mmask16 lanes(int64_t c) { return c >= 16 ? (__mmask16)0xFFFF : c <= 0 ? (__mmask16)0 : (__mmask16)((1u << c) - 1); }
// (panels, K, 48) int8 -> (panels, ceil(K/2), 48, 2)
at::Tensor pairs(const at::Tensor& packed) {
  const int64_t P = packed.size(0), K = packed.size(1), K2 = (K + 1) / 2;
  at::Tensor padded = at::zeros({P, 2 * K2, PANEL}, packed.options());
  padded.narrow(1, 0, K).copy_(packed);
  return padded.view({P, K2, 2, PANEL}).transpose(2, 3).contiguous();
}
at::Tensor i16_mm(const at::Tensor& input, const at::Tensor& packed, const at::Tensor& scales, int64_t N) {
  const at::Tensor x = input.contiguous();
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0), K2 = packed.size(1);
  const double A = std::min(32767.0, std::floor(2147483647.0 / (127.0 * 2 * K2)));
  at::Tensor xq = at::zeros({M, 2 * K2}, x.options().dtype(at::kShort));
  at::Tensor xs = at::empty({M}, x.options());
  const float* xp = x.data_ptr<float>(); int16_t* qp = xq.data_ptr<int16_t>(); float* sp = xs.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    float amax = 0; for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(xp[m * K + k]));
    const float s = amax > 0 ? amax / A : 1.0f, inv = 1.0f / s; sp[m] = s;
    for (int64_t k = 0; k < K; ++k) qp[m * 2 * K2 + k] = (int16_t)std::nearbyint(xp[m * K + k] * inv);
  }
  at::Tensor y = at::empty({M, N}, x.options());
  const int32_t* xi = reinterpret_cast<const int32_t*>(qp); const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sc = scales.data_ptr<float>(); float* yp = y.data_ptr<float>();
  at::parallel_for(0, P, 1, [&](int64_t a, int64_t b) {
    for (int64_t p = a; p < b; ++p) {
      const int64_t left = N - p * PANEL;
      const __mmask16 masks[3] = {lanes(left), lanes(left - 16), lanes(left - 32)};
      for (int64_t m0 = 0; m0 < M; m0 += TILE)
        rows_tile(std::min(TILE, M - m0), xi + m0 * K2, K2, wp + p * K2 * 2 * PANEL, sc + p * PANEL, sp + m0, yp + m0 * N + p * PANEL, N, masks);
    }
  });
  return y;
}
}
TORCH_LIBRARY(specdec_int16, m) { m.def("pairs(Tensor p) -> Tensor"); m.def("i16_mm(Tensor x, Tensor p, Tensor s, int n) -> Tensor"); }
TORCH_LIBRARY_IMPL(specdec_int16, CPU, m) { m.impl("pairs", &pairs); m.impl("i16_mm", &i16_mm); }
