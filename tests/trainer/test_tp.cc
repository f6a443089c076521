// Tensor parallelism on forked ranks: Megatron's f and g first on one
// linear layer (and the column-then-row pair of an MLP), then a whole tiny
// GPT with tp 2 and tp 4 against the same weights on one rank.
#include <catch2/catch.hpp>

#include "kernels/cpu/gpt_ops.h"
#include "parallel_fixtures.h"
#include "trainer/strategy/tp_comm.h"

namespace braid::trainer {
namespace {

namespace k = braid::kernels::cpu;
using braid::test::expect;
using test::expect_close;
using test::random_floats;

// Rows [r * rows, (r + 1) * rows) of a row-major [*, cols] matrix.
std::vector<float> rows_of(const std::vector<float>& m, int cols, int first, int rows) {
  return {m.begin() + static_cast<std::ptrdiff_t>(first) * cols,
          m.begin() + static_cast<std::ptrdiff_t>(first + rows) * cols};
}

// Columns [first, first + count) of a row-major [rows, cols] matrix.
std::vector<float> columns_of(const std::vector<float>& m, int rows, int cols, int first, int count) {
  std::vector<float> out;
  for (int i = 0; i < rows; ++i) out.insert(out.end(), m.begin() + i * cols + first, m.begin() + i * cols + first + count);
  return out;
}

// Y = X W^T + b with W = [W0; W1; ...] cut by output features (rows of the
// [OC, C] weight, columns of Y): f in front, outputs all-gathered.
void column_parallel_linear(comm::Communicator& tp) {
  const int N = 6, C = 8, OC = 12, R = tp.size(), r = tp.rank(), OCl = OC / R;
  const auto X = random_floats(N * C, 1), W = random_floats(OC * C, 2), b = random_floats(OC, 3);
  const auto dY = random_floats(N * OC, 4);
  // The unsplit layer.
  std::vector<float> Y(N * OC), dX(N * C, 0.0f), dW(OC * C, 0.0f), db(OC, 0.0f);
  k::matmul_forward(Y.data(), X.data(), W.data(), b.data(), N, C, OC);
  k::matmul_backward(dX.data(), dW.data(), db.data(), dY.data(), X.data(), W.data(), N, C, OC);
  // This rank's slice.
  const auto Wr = rows_of(W, C, r * OCl, OCl), br = rows_of(b, 1, r * OCl, OCl);
  std::vector<float> x = X, Yr(N * OCl), Yfull(N * OC), dXr(N * C, 0.0f), dWr(OCl * C, 0.0f), dbr(OCl, 0.0f);
  tp_f_forward(tp, x.data(), x.size());
  k::matmul_forward(Yr.data(), x.data(), Wr.data(), br.data(), N, C, OCl);
  tp_gather_columns(tp, Yr.data(), Yfull.data(), N, OCl);
  expect_close("Y", Yfull.data(), Y.data(), Y.size());
  const auto dYr = columns_of(dY, N, OC, r * OCl, OCl);
  k::matmul_backward(dXr.data(), dWr.data(), dbr.data(), dYr.data(), x.data(), Wr.data(), N, C, OCl);
  tp_f_backward(tp, dXr.data(), dXr.size());
  expect_close("dX", dXr.data(), dX.data(), dX.size());
  expect_close("dW rows of this rank", dWr.data(), rows_of(dW, C, r * OCl, OCl).data(), dWr.size());
  expect_close("db of this rank", dbr.data(), rows_of(db, 1, r * OCl, OCl).data(), dbr.size());
}

// Y = (X A^T) B^T: A [K, C] column parallel, B [C, K] row parallel (cut by
// input features); f in front of A, g behind B, nothing in between.
void column_then_row_parallel(comm::Communicator& tp) {
  const int N = 5, C = 8, K = 16, R = tp.size(), r = tp.rank(), Kl = K / R;
  const auto X = random_floats(N * C, 5), A = random_floats(K * C, 6), B = random_floats(C * K, 7);
  const auto dY = random_floats(N * C, 8);
  std::vector<float> H(N * K), Y(N * C), dH(N * K, 0.0f), dX(N * C, 0.0f), dA(K * C, 0.0f), dB(C * K, 0.0f);
  k::matmul_forward(H.data(), X.data(), A.data(), nullptr, N, C, K);
  k::matmul_forward(Y.data(), H.data(), B.data(), nullptr, N, K, C);
  k::matmul_backward(dH.data(), dB.data(), nullptr, dY.data(), H.data(), B.data(), N, K, C);
  k::matmul_backward(dX.data(), dA.data(), nullptr, dH.data(), X.data(), A.data(), N, C, K);

  const auto Ar = rows_of(A, C, r * Kl, Kl), Br = columns_of(B, C, K, r * Kl, Kl);
  std::vector<float> x = X, Hr(N * Kl), Yr(N * C), dHr(N * Kl, 0.0f), dXr(N * C, 0.0f), dAr(Kl * C, 0.0f),
      dBr(C * Kl, 0.0f), dy = dY;
  tp_f_forward(tp, x.data(), x.size());
  k::matmul_forward(Hr.data(), x.data(), Ar.data(), nullptr, N, C, Kl);
  k::matmul_forward(Yr.data(), Hr.data(), Br.data(), nullptr, N, Kl, C);  // a partial sum of Y
  tp_g_forward(tp, Yr.data(), Yr.size());
  expect_close("Y", Yr.data(), Y.data(), Y.size());
  tp_g_backward(tp, dy.data(), dy.size());
  k::matmul_backward(dHr.data(), dBr.data(), nullptr, dy.data(), Hr.data(), Br.data(), N, Kl, C);
  k::matmul_backward(dXr.data(), dAr.data(), nullptr, dHr.data(), x.data(), Ar.data(), N, C, Kl);
  tp_f_backward(tp, dXr.data(), dXr.size());
  expect_close("dX", dXr.data(), dX.data(), dX.size());
  expect_close("dA rows of this rank", dAr.data(), rows_of(dA, C, r * Kl, Kl).data(), dAr.size());
  expect_close("dB columns of this rank", dBr.data(), columns_of(dB, C, K, r * Kl, Kl).data(), dBr.size());
}

TEST_CASE("tp: a linear layer split by columns matches the unsplit layer", "[tp]") {
  const int ranks = GENERATE(2, 4);
  const auto result = braid::test::run_ranks(ranks, [](comm::Communicator& world) {
    column_parallel_linear(world);
    column_then_row_parallel(world);
  }, test::rendezvous_run_options());
  INFO(ranks << " TP ranks:\n" << result.summary());
  REQUIRE(result.all_ok());
}

// A GPT cut over the TP group against the whole model on the same weights
// and tokens: loss and every gradient, gathered back to full shape.
void tp_gpt_matches_whole(comm::Communicator& tp) {
  const GptConfig config{2, 4, 32, 16, 256};
  const int B = 2, T = 16, N = B * T;
  const auto tokens = test::random_ints(N, 11), targets = test::random_ints(N, 12);
  Gpt whole(config, ModelLayout::whole(config), nullptr);
  test::randomize(whole, 7);
  Activations whole_acts = whole.make_activations(B, T);
  const float whole_loss = whole.forward(whole_acts, tokens.data(), targets.data());
  whole.backward(whole_acts, 1.0f / N);

  ModelLayout layout = ModelLayout::whole(config);
  layout.tp_rank = tp.rank();
  layout.tp_size = tp.size();
  Gpt model(config, layout, nullptr);
  test::copy_from_whole(whole, model);
  TpHooks hooks(tp);
  model.set_hooks(&hooks);
  Activations acts = model.make_activations(B, T);
  const float loss = model.forward(acts, tokens.data(), targets.data());
  model.backward(acts, 1.0f / N);

  expect_close("loss", loss, whole_loss);
  for (const ParamView& v : model.table().views()) {
    const std::vector<float> grad = tp_gather_tensor(tp, v, model.grads().data() + v.offset);
    const ParamView& w = whole.table().find(v.name);
    expect(grad.size() == w.count(), v.name + ": gathered " + std::to_string(grad.size()) + " elements");
    expect_close(v.name + " gradient", grad.data(), whole.grads().data() + w.offset, w.count());
  }
  // 4 all-reduces of [N, C] per block: 2 in forward (g), 2 in backward (f).
  const std::size_t per_pass = 2u * config.n_layer * N * config.n_embd;
  expect(hooks.forward_count() == per_pass && hooks.backward_count() == per_pass,
         "g and f all-reduced " + std::to_string(hooks.forward_count()) + " and " +
             std::to_string(hooks.backward_count()) + " floats, expected " + std::to_string(per_pass) + " each");
}

TEST_CASE("tp: a GPT over tp 2 and tp 4 gives the whole model's loss and gradients", "[tp]") {
  const int ranks = GENERATE(2, 4);
  const auto result = braid::test::run_ranks(ranks, tp_gpt_matches_whole, test::rendezvous_run_options());
  INFO(ranks << " TP ranks:\n" << result.summary());
  REQUIRE(result.all_ok());
}

}  // namespace
}  // namespace braid::trainer
