#include "reference_gpt.h"

#include <cmath>
#include <numbers>
#include <string>

namespace braid::trainer::test {

namespace {

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]

struct Model {
  const ParamTable& table;
  const std::vector<double>& p;
  const double* at(const std::string& name) const { return p.data() + table.find(name).offset; }
};

Matrix layernorm(const Matrix& x, const double* w, const double* b) {
  Matrix y = x;
  for (auto& row : y) {
    double mean = 0, var = 0;
    for (double v : row) mean += v;
    mean /= row.size();
    for (double v : row) var += (v - mean) * (v - mean);
    var /= row.size();
    for (std::size_t c = 0; c < row.size(); ++c) row[c] = (row[c] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c];
  }
  return y;
}

// y = x W^T + b with W [out, in].
Matrix linear(const Matrix& x, const double* W, const double* b, int out) {
  Matrix y(x.size(), std::vector<double>(out));
  const std::size_t in = x[0].size();
  for (std::size_t n = 0; n < x.size(); ++n) {
    for (int o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (std::size_t i = 0; i < in; ++i) s += x[n][i] * W[o * in + i];
      y[n][o] = s;
    }
  }
  return y;
}

// Causal attention of one sequence (rows t = 0..T-1) of a [T, 3C] qkv.
Matrix attention(const Matrix& qkv, int NH, int C) {
  const int T = static_cast<int>(qkv.size()), HS = C / NH;
  Matrix y(T, std::vector<double>(C, 0.0));
  for (int h = 0; h < NH; ++h) {
    for (int t = 0; t < T; ++t) {
      std::vector<double> score(t + 1);
      double top = -1e300, sum = 0;
      for (int s = 0; s <= t; ++s) {
        double d = 0;
        for (int i = 0; i < HS; ++i) d += qkv[t][h * HS + i] * qkv[s][C + h * HS + i];
        score[s] = d / std::sqrt(static_cast<double>(HS));
        top = std::max(top, score[s]);
      }
      for (int s = 0; s <= t; ++s) sum += score[s] = std::exp(score[s] - top);
      for (int s = 0; s <= t; ++s) {
        for (int i = 0; i < HS; ++i) y[t][h * HS + i] += score[s] / sum * qkv[s][2 * C + h * HS + i];
      }
    }
  }
  return y;
}

double gelu(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

void block(const Model& m, const GptConfig& c, int layer, Matrix& x) {
  const std::string h = "h." + std::to_string(layer) + ".";
  const int C = c.n_embd;
  Matrix qkv = linear(layernorm(x, m.at(h + "ln_1.weight"), m.at(h + "ln_1.bias")), m.at(h + "attn.c_attn.weight"),
                      m.at(h + "attn.c_attn.bias"), 3 * C);
  Matrix a = linear(attention(qkv, c.n_head, C), m.at(h + "attn.c_proj.weight"), m.at(h + "attn.c_proj.bias"), C);
  for (std::size_t t = 0; t < x.size(); ++t)
    for (int i = 0; i < C; ++i) x[t][i] += a[t][i];
  Matrix f = linear(layernorm(x, m.at(h + "ln_2.weight"), m.at(h + "ln_2.bias")), m.at(h + "mlp.c_fc.weight"),
                    m.at(h + "mlp.c_fc.bias"), 4 * C);
  for (auto& row : f)
    for (double& v : row) v = gelu(v);
  Matrix o = linear(f, m.at(h + "mlp.c_proj.weight"), m.at(h + "mlp.c_proj.bias"), C);
  for (std::size_t t = 0; t < x.size(); ++t)
    for (int i = 0; i < C; ++i) x[t][i] += o[t][i];
}

// Sum of the losses of one sequence.
double sequence_loss(const Model& m, const GptConfig& c, const std::int32_t* tokens, const std::int32_t* targets,
                     int T) {
  const int C = c.n_embd, V = c.vocab_size;
  const double *wte = m.at("wte.weight"), *wpe = m.at("wpe.weight");
  Matrix x(T, std::vector<double>(C));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < C; ++i) x[t][i] = wte[tokens[t] * C + i] + wpe[t * C + i];
  for (int l = 0; l < c.n_layer; ++l) block(m, c, l, x);
  Matrix logits = linear(layernorm(x, m.at("ln_f.weight"), m.at("ln_f.bias")), wte, nullptr, V);
  double loss = 0;
  for (int t = 0; t < T; ++t) {
    double top = -1e300, sum = 0;
    for (double v : logits[t]) top = std::max(top, v);
    for (double v : logits[t]) sum += std::exp(v - top);
    loss += top + std::log(sum) - logits[t][targets[t]];
  }
  return loss;
}

}  // namespace

double reference_loss(const GptConfig& config, const ParamTable& table, const std::vector<double>& params,
                      const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets, int B,
                      int T) {
  Model m{table, params};
  double sum = 0;
  for (int b = 0; b < B; ++b) sum += sequence_loss(m, config, tokens.data() + b * T, targets.data() + b * T, T);
  return sum / (static_cast<double>(B) * T);
}

}  // namespace braid::trainer::test
