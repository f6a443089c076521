// Causal multi-head self-attention over a fused qkv activation, through
// sgemm per (batch, head). Q, K and V of a head are strided views into qkv
// (row stride 3C), so no copies are made.
//
// Forward, per (b, h), with scale = 1/sqrt(HS):
//   att = softmax_causal(scale * Q K^T)    [T, T], upper triangle exactly 0
//   out = att V                             [T, HS]
// Backward, with dP the gradient of the pre-softmax scores:
//   dA = dout V^T;  dV += att^T dout
//   dP[t, j] = att[t, j] (dA[t, j] - sum_k att[t, k] dA[t, k]) * scale  (j <= t)
//   dQ += dP K;  dK += dP^T Q
//
// Causal blocking: rows are cut into blocks of kBlock. Query rows [r0, r1)
// only see keys [0, r1), so each product runs over that prefix and the
// upper-right blocks, all zero, are never computed: about 5/8 of the full
// T x T work at T = 4 blocks. Products over columns (dV, dK) use the transposed
// view: key rows [c0, c1) are only seen by queries [c0, T). Entries above the
// diagonal inside a diagonal block are computed by sgemm but zeroed before
// use, so they never reach a result.
//
// Every output element is one sgemm dot product or one fixed-order row
// reduction: deterministic.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gpt_ops.h"
#include "kernels/cpu/vec_math.h"

namespace braid::kernels::cpu {

namespace {

constexpr int kBlock = 64;

// Strided views of one (batch, head) inside qkv / out / att.
struct HeadView {
  std::size_t qkv_offset;  // first q element of the head; k at +C, v at +2C
  std::size_t out_offset;  // first element of the head in out / dout
  std::size_t att_offset;  // start of the head's [T, T] block
};

HeadView head_view(int b, int h, int T, int NH, int HS) {
  std::size_t C = std::size_t(NH) * HS;
  return {std::size_t(b) * T * 3 * C + std::size_t(h) * HS,
          std::size_t(b) * T * C + std::size_t(h) * HS,
          (std::size_t(b) * NH + h) * T * T};
}

// Row t of the scores holds t+1 visible entries: softmax them in place and
// zero the rest of the row.
void softmax_causal_row(float* row, int t, int T) {
  int visible = t + 1;
  float max = detail::max_lanes(row, visible);
  float inv = 1.f / detail::exp_store_sum(row, row, max, visible);
  for (int j = 0; j < visible; ++j) row[j] *= inv;
  std::fill(row + visible, row + T, 0.f);
}

// dA row -> dP row in place: dP = att * (dA - <att, dA>) * scale for j <= t,
// 0 for t < j < row_end (the rest of the diagonal block, which sgemm reads).
void softmax_causal_backward_row(float* drow, const float* arow, int t, int row_end,
                                 float scale) {
  int visible = t + 1;
  float s = detail::dot_lanes(arow, drow, visible);
  for (int j = 0; j < visible; ++j) drow[j] = arow[j] * (drow[j] - s) * scale;
  std::fill(drow + visible, drow + row_end, 0.f);
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) {
  const int C = NH * HS, C3 = 3 * C;
  const float scale = 1.f / std::sqrt(float(HS));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      HeadView view = head_view(b, h, T, NH, HS);
      const float* q = qkv + view.qkv_offset;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + view.att_offset;
      float* o = out + view.out_offset;
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        int r1 = std::min(r0 + kBlock, T), rows = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, HS,
                    scale, q + std::size_t(r0) * C3, C3, k, C3, 0.f, a + std::size_t(r0) * T, T);
        for (int t = r0; t < r1; ++t) softmax_causal_row(a + std::size_t(t) * T, t, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, r1,
                    1.f, a + std::size_t(r0) * T, T, v, C3, 0.f, o + std::size_t(r0) * C, C);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int B, int T, int NH, int HS) {
  const int C = NH * HS, C3 = 3 * C;
  const float scale = 1.f / std::sqrt(float(HS));
  std::vector<float> dscores(std::size_t(T) * T);  // dA, then dP in place
  float* dp = dscores.data();
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      HeadView view = head_view(b, h, T, NH, HS);
      const float* q = qkv + view.qkv_offset;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + view.qkv_offset;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + view.att_offset;
      const float* dout_h = dout + view.out_offset;
      // Row blocks: dA = dout V^T over the visible prefix, then dP in place.
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        int r1 = std::min(r0 + kBlock, T), rows = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, HS,
                    1.f, dout_h + std::size_t(r0) * C, C, v, C3, 0.f, dp + std::size_t(r0) * T, T);
        for (int t = r0; t < r1; ++t)
          softmax_causal_backward_row(dp + std::size_t(t) * T, a + std::size_t(t) * T, t, r1,
                                      scale);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, r1,
                    1.f, dp + std::size_t(r0) * T, T, k, C3, 1.f, dq + std::size_t(r0) * C3, C3);
      }
      // Column blocks: key rows [c0, c1) gather from queries [c0, T).
      for (int c0 = 0; c0 < T; c0 += kBlock) {
        int c1 = std::min(c0 + kBlock, T), cols = c1 - c0;
        std::size_t diag = std::size_t(c0) * T + c0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, HS, T - c0,
                    1.f, a + diag, T, dout_h + std::size_t(c0) * C, C, 1.f,
                    dv + std::size_t(c0) * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, HS, T - c0,
                    1.f, dp + diag, T, q + std::size_t(c0) * C3, C3, 1.f,
                    dk + std::size_t(c0) * C3, C3);
      }
    }
  }
}

}  // namespace braid::kernels::cpu
