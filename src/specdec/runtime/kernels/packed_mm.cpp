// A small-row fp32 matrix product for verification passes: y (M, N) = x (M, K) @ W^T, W (N, K).
//
// A pass of a few tokens should cost what reading the weights once costs. W is packed once into column panels
// of 48 outputs, (ceil(N / 48), K, 48), so that each panel is one contiguous stream; a thread walks its panels,
// and for each panel keeps a tile of up to 8 rows x 48 outputs in 24 AVX-512 registers while k runs over K:
// per k it loads 48 weights and does 3 multiply-adds per row. Rows beyond 8 take further passes over the same
// panel, which is then in the L2 cache, so the weights come from memory once whatever M is.
//
// The loop prefetches the panel ahead of itself, FAR rows of k into L2 and NEAR rows into L1. Without it the
// hardware prefetcher falls behind once a tile does more than a few multiply-adds per weight: on a 2-core Xeon
// (AMX) the linears of a 5-row pass cost 1.44 one-row passes without, about 1.0 with (docs/performance.md).
// A build may set them (0: no prefetch) and the library's name, so that a probe loads two builds side by side.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <immintrin.h>

#ifndef SPECDEC_PREFETCH_FAR
#define SPECDEC_PREFETCH_FAR 32
#endif
#ifndef SPECDEC_PREFETCH_NEAR
#define SPECDEC_PREFETCH_NEAR 16
#endif
#ifndef SPECDEC_LIBRARY
#define SPECDEC_LIBRARY specdec
#endif

namespace {

constexpr int64_t PANEL = 48;  // outputs per panel: three 16-float AVX-512 registers
constexpr int64_t TILE = 8;    // rows per register tile: 8 x 3 accumulators
constexpr int64_t FAR = SPECDEC_PREFETCH_FAR, NEAR = SPECDEC_PREFETCH_NEAR;  // rows of k ahead: L2, L1

inline void prefetch_row(const float* row, int hint_l1) {  // the 3 cache lines of one row of a panel
  const char* p = reinterpret_cast<const char*>(row);
  for (int line = 0; line < 3; ++line)
    hint_l1 ? _mm_prefetch(p + 64 * line, _MM_HINT_T0) : _mm_prefetch(p + 64 * line, _MM_HINT_T1);
}

template <int M>
void tile(const float* x, int64_t K, const float* panel, float* y, int64_t ldy, __mmask16 masks[3]) {
  __m512 acc[M][3];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 3; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* w = panel + k * PANEL;
    if (FAR > 0) prefetch_row(w + FAR * PANEL, 0);  // past the panel's end: the next panel, or nothing that faults
    if (NEAR > 0) prefetch_row(w + NEAR * PANEL, 1);
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_set1_ps(x[m * K + k]);
      acc[m][0] = _mm512_fmadd_ps(a, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(a, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(a, w2, acc[m][2]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 3; ++j) _mm512_mask_storeu_ps(y + m * ldy + 16 * j, masks[j], acc[m][j]);
}

void rows_tile(int64_t rows, const float* x, int64_t K, const float* panel, float* y, int64_t ldy,
               __mmask16 masks[3]) {
  switch (rows) {
    case 1: return tile<1>(x, K, panel, y, ldy, masks);
    case 2: return tile<2>(x, K, panel, y, ldy, masks);
    case 3: return tile<3>(x, K, panel, y, ldy, masks);
    case 4: return tile<4>(x, K, panel, y, ldy, masks);
    case 5: return tile<5>(x, K, panel, y, ldy, masks);
    case 6: return tile<6>(x, K, panel, y, ldy, masks);
    case 7: return tile<7>(x, K, panel, y, ldy, masks);
    default: return tile<8>(x, K, panel, y, ldy, masks);
  }
}

__mmask16 lanes(int64_t count) {  // the first `count` of 16 lanes (0..16)
  return count >= 16 ? (__mmask16)0xFFFF : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1);
}

at::Tensor pack(const at::Tensor& weight) {  // (N, K) -> (ceil(N / 48), K, 48), zero-padded
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "pack takes a 2D float32 weight");
  const int64_t N = weight.size(0), K = weight.size(1), panels = (N + PANEL - 1) / PANEL;
  at::Tensor padded = at::zeros({panels * PANEL, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({panels, PANEL, K}).transpose(1, 2).contiguous();
}

at::Tensor packed_mm(const at::Tensor& input, const at::Tensor& packed, int64_t N) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat, "packed_mm takes a 2D float32 input");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == PANEL && packed.size(1) == input.size(1),
              "packed_mm: the packed weight must be pack(weight) of a weight with the input's width");
  TORCH_CHECK(N > (packed.size(0) - 1) * PANEL && N <= packed.size(0) * PANEL, "packed_mm: N does not match");
  const at::Tensor x = input.contiguous();
  const at::Tensor w = packed.contiguous();
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t left = N - p * PANEL;
      __mmask16 masks[3] = {lanes(left), lanes(left - 16), lanes(left - 32)};
      for (int64_t m0 = 0; m0 < M; m0 += TILE)
        rows_tile(std::min(TILE, M - m0), xp + m0 * K, K, wp + p * K * PANEL, yp + m0 * N + p * PANEL, N, masks);
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(SPECDEC_LIBRARY, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("packed_mm(Tensor input, Tensor packed, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(SPECDEC_LIBRARY, CPU, m) {
  m.impl("pack", &pack);
  m.impl("packed_mm", &packed_mm);
}
