// A small-row matrix product for verification passes and draft steps: y (M, N) = x (M, K) @ W^T, W (N, K), x and
// y float32; W float32, bfloat16 (widened to float32 exactly, half the bytes to read), or int8 with one float32 scale
// per output (weight-only quantization: W = scale * q).
//
// Batch-invariant: row m of y is a function of row m of x and W alone. Each output sums over k in order, in one
// float32 register lane, whatever M is and whichever tile the row falls in, so a position's logits have the same bits
// in a one-token step and inside a verification pass of any width.
//
// A pass of a few tokens should cost what reading the weights once costs. W is packed once into column panels
// of 48 outputs, (ceil(N / 48), K, 48), so that each panel is one contiguous stream; a thread walks its panels,
// and for each panel keeps a tile of up to 8 rows x 48 outputs in 24 AVX-512 registers while k runs over K:
// per k it loads 48 weights (int8 ones widened to float32) and does 3 multiply-adds per row. Rows beyond 8 take
// further passes over the same panel, which is then in the L2 cache, so the weights come from memory once whatever
// M is. An int8 panel's products are scaled per output at the end: a quarter of float32's bytes to read.
//
// The loop prefetches the panel ahead of itself, FAR bytes into L2 and NEAR bytes into L1. Without it the
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
#define SPECDEC_PREFETCH_FAR 6144
#endif
#ifndef SPECDEC_PREFETCH_NEAR
#define SPECDEC_PREFETCH_NEAR 3072
#endif
#ifndef SPECDEC_LIBRARY
#define SPECDEC_LIBRARY specdec
#endif

namespace {

constexpr int64_t PANEL = 48;  // outputs per panel: three 16-float AVX-512 registers
constexpr int64_t TILE = 8;    // rows per register tile: 8 x 3 accumulators
constexpr int64_t FAR = SPECDEC_PREFETCH_FAR, NEAR = SPECDEC_PREFETCH_NEAR;  // bytes ahead: L2, L1

template <typename W>
inline void prefetch_row(const W* row, int hint_l1) {  // the cache lines of one row of a panel
  const char* p = reinterpret_cast<const char*>(row);
  for (int line = 0; line < int(PANEL * sizeof(W) + 63) / 64; ++line)
    hint_l1 ? _mm_prefetch(p + 64 * line, _MM_HINT_T0) : _mm_prefetch(p + 64 * line, _MM_HINT_T1);
}

inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
inline __m512 load16(const at::BFloat16* w) {  // 16 bfloat16 weights widened to float32: their bits, shifted up
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
inline __m512 load16(const int8_t* w) {  // 16 int8 weights widened to float32
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
}

template <typename W, int M>
void tile(const float* x, int64_t K, const W* panel, const float* scale, float* y, int64_t ldy,
          const __mmask16 masks[3]) {
  __m512 acc[M][3];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 3; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const W* w = panel + k * PANEL;
    constexpr int64_t row = PANEL * sizeof(W);  // past the panel's end: the next panel, or nothing that faults
    if (FAR > 0) prefetch_row(w + FAR / row * PANEL, 0);
    if (NEAR > 0) prefetch_row(w + NEAR / row * PANEL, 1);
    const __m512 w0 = load16(w), w1 = load16(w + 16), w2 = load16(w + 32);
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_set1_ps(x[m * K + k]);
      acc[m][0] = _mm512_fmadd_ps(a, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(a, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(a, w2, acc[m][2]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 3; ++j) {
      const __m512 out = scale ? _mm512_mul_ps(acc[m][j], _mm512_loadu_ps(scale + 16 * j)) : acc[m][j];
      _mm512_mask_storeu_ps(y + m * ldy + 16 * j, masks[j], out);
    }
}

template <typename W>
void rows_tile(int64_t rows, const float* x, int64_t K, const W* panel, const float* scale, float* y, int64_t ldy,
               const __mmask16 masks[3]) {
  switch (rows) {
    case 1: return tile<W, 1>(x, K, panel, scale, y, ldy, masks);
    case 2: return tile<W, 2>(x, K, panel, scale, y, ldy, masks);
    case 3: return tile<W, 3>(x, K, panel, scale, y, ldy, masks);
    case 4: return tile<W, 4>(x, K, panel, scale, y, ldy, masks);
    case 5: return tile<W, 5>(x, K, panel, scale, y, ldy, masks);
    case 6: return tile<W, 6>(x, K, panel, scale, y, ldy, masks);
    case 7: return tile<W, 7>(x, K, panel, scale, y, ldy, masks);
    default: return tile<W, 8>(x, K, panel, scale, y, ldy, masks);
  }
}

__mmask16 lanes(int64_t count) {  // the first `count` of 16 lanes (0..16)
  return count >= 16 ? (__mmask16)0xFFFF : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1);
}

at::Tensor panels_of(const at::Tensor& weight) {  // (N, K) -> (ceil(N / 48), K, 48), zero-padded
  const int64_t N = weight.size(0), K = weight.size(1), panels = (N + PANEL - 1) / PANEL;
  at::Tensor padded = at::zeros({panels * PANEL, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({panels, PANEL, K}).transpose(1, 2).contiguous();
}

at::Tensor pack(const at::Tensor& weight) {  // int8: pack_int8's rows laid out again (a fused linear's)
  const auto type = weight.scalar_type();
  TORCH_CHECK(weight.dim() == 2 && (type == at::kFloat || type == at::kBFloat16 || type == at::kChar),
              "pack takes a 2D float32, bfloat16 or int8 weight");
  return panels_of(weight);
}

std::tuple<at::Tensor, at::Tensor> pack_int8(const at::Tensor& weight) {  // symmetric, one scale per output
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "pack_int8 takes a 2D float32 weight");
  const at::Tensor scale = weight.abs().amax(1).div(127.0);
  const at::Tensor q = weight.div(scale.clamp_min(1e-30).unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
  const int64_t N = weight.size(0), padded = (N + PANEL - 1) / PANEL * PANEL;
  at::Tensor scales = at::zeros({padded}, weight.options());
  scales.narrow(0, 0, N).copy_(scale);
  return {panels_of(q), scales};
}

template <typename W>
at::Tensor product(const at::Tensor& input, const at::Tensor& packed, const float* scale, int64_t N) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat, "packed_mm takes a 2D float32 input");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == PANEL && packed.size(1) == input.size(1),
              "packed_mm: the packed weight must be pack(weight) of a weight with the input's width");
  TORCH_CHECK(N > (packed.size(0) - 1) * PANEL && N <= packed.size(0) * PANEL, "packed_mm: N does not match");
  const at::Tensor x = input.contiguous();
  const at::Tensor w = packed.contiguous();
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const W* wp = w.data_ptr<W>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t left = N - p * PANEL;
      const __mmask16 masks[3] = {lanes(left), lanes(left - 16), lanes(left - 32)};
      for (int64_t m0 = 0; m0 < M; m0 += TILE)
        rows_tile<W>(std::min(TILE, M - m0), xp + m0 * K, K, wp + p * K * PANEL, scale ? scale + p * PANEL : nullptr,
                     yp + m0 * N + p * PANEL, N, masks);
    }
  });
  return y;
}

at::Tensor packed_mm(const at::Tensor& input, const at::Tensor& packed, int64_t N) {
  if (packed.scalar_type() == at::kBFloat16) return product<at::BFloat16>(input, packed, nullptr, N);
  TORCH_CHECK(packed.scalar_type() == at::kFloat, "packed_mm takes a float32 or bfloat16 packed weight (pack)");
  return product<float>(input, packed, nullptr, N);
}

at::Tensor packed_int8_mm(const at::Tensor& input, const at::Tensor& packed, const at::Tensor& scales, int64_t N) {
  TORCH_CHECK(packed.scalar_type() == at::kChar, "packed_int8_mm takes an int8 packed weight (pack_int8)");
  TORCH_CHECK(scales.dim() == 1 && scales.scalar_type() == at::kFloat && scales.size(0) == packed.size(0) * PANEL,
              "packed_int8_mm: scales must be pack_int8's, one float32 per padded output");
  const at::Tensor s = scales.contiguous();
  return product<int8_t>(input, packed, s.data_ptr<float>(), N);
}

}  // namespace

TORCH_LIBRARY(SPECDEC_LIBRARY, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("packed_mm(Tensor input, Tensor packed, int n) -> Tensor");
  m.def("pack_int8(Tensor weight) -> (Tensor, Tensor)");
  m.def("packed_int8_mm(Tensor input, Tensor packed, Tensor scales, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(SPECDEC_LIBRARY, CPU, m) {
  m.impl("pack", &pack);
  m.impl("packed_mm", &packed_mm);
  m.impl("pack_int8", &pack_int8);
  m.impl("packed_int8_mm", &packed_int8_mm);
}
