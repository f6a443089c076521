// A naive double-precision GPT forward, written from the definition and
// independently of kernels/ and trainer/model/gpt.cc: the oracle for the
// model's forward and, through central differences, its backward.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/model/gpt_config.h"
#include "trainer/model/param_table.h"

namespace braid::trainer::test {

// Mean cross-entropy over B*T targets. `params` holds the whole model's
// parameters (tp_size 1) at the table's offsets.
double reference_loss(const GptConfig& config, const ParamTable& table, const std::vector<double>& params,
                      const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets, int B,
                      int T);

}  // namespace braid::trainer::test
