#include "trainer/model/init.h"

#include <cmath>
#include <string_view>
#include <vector>

#include "trainer/model/rng.h"

namespace braid::trainer {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The standard deviation of a normal init, or a negative value for a constant.
double init_std(const GptConfig& c, std::string_view name) {
  if (ends_with(name, "c_proj.weight")) return 0.02 / std::sqrt(2.0 * c.n_layer);
  if (ends_with(name, ".bias")) return -1.0;
  if (name.find("ln_") != std::string_view::npos) return -1.0;
  return 0.02;
}

double init_constant(std::string_view name) {
  return name.find("ln_") != std::string_view::npos && ends_with(name, ".weight") ? 1.0 : 0.0;
}

}  // namespace

void init_view(const GptConfig& c, const ModelLayout& layout, const ParamView& v, std::uint64_t seed,
               float* local) {
  std::size_t full_count = 1;
  for (auto d : v.full_shape) full_count *= static_cast<std::size_t>(d);
  std::vector<float> full(full_count);
  const double std = init_std(c, v.name);
  if (std < 0) {
    std::fill(full.begin(), full.end(), static_cast<float>(init_constant(v.name)));
  } else {
    Rng rng(hash_words({seed, fnv1a(v.name)}));
    for (float& x : full) x = static_cast<float>(std * rng.normal());
  }
  copy_tp_part(v, layout, full.data(), local);
}

void init_parameters(const GptConfig& c, const ModelLayout& layout, const ParamTable& table,
                     std::span<float> params, std::uint64_t seed) {
  for (const ParamView& v : table.views()) init_view(c, layout, v, seed, params.data() + v.offset);
}

}  // namespace braid::trainer
