// The one place that turns a strategy name into a data-parallel strategy.
// TP and PP compose with it in mesh.h, innermost first: TP, then PP, then
// DP/ZeRO over the DP group.
#pragma once

#include <memory>
#include <string>

#include "trainer/strategy/strategy.h"

namespace braid::trainer {

// Throws InvalidUsage when the kind does not fit the world (none with a
// communicator of more than one rank, a data-parallel kind without one).
std::unique_ptr<Strategy> make_strategy(StrategyKind kind, const StrategySetup& setup);

// The kind a run uses when --strategy is not given: none on one process,
// ddp on several.
StrategyKind default_strategy(int world_size);
// --strategy as given, or default_strategy's name for `dp_size` DP ranks
// where it is empty (the name is checked where it is parsed).
std::string strategy_or_default(const std::string& given, int dp_size);

}  // namespace braid::trainer
