#include "trainer/strategy/compose.h"

#include "runtime/errors.h"
#include "trainer/strategy/ddp.h"
#include "trainer/strategy/dp.h"
#include "trainer/strategy/zero.h"

namespace braid::trainer {

StrategyKind default_strategy(int world_size) { return world_size > 1 ? StrategyKind::kDdp : StrategyKind::kNone; }

std::string strategy_or_default(const std::string& given, int dp_size) {
  return given.empty() ? std::string(strategy_name(default_strategy(dp_size))) : given;
}

std::unique_ptr<Strategy> make_strategy(StrategyKind kind, const StrategySetup& setup) {
  const int world = setup.comm != nullptr ? setup.comm->size() : 1;
  if (kind == StrategyKind::kNone) {
    if (world > 1) {
      throw InvalidUsage("--strategy none trains on one process, but this job has " + std::to_string(world) +
                         " ranks; choose dp, ddp, zero1, zero2 or zero3");
    }
    return std::make_unique<SingleStrategy>(setup);
  }
  if (setup.comm == nullptr) {
    throw InvalidUsage("--strategy " + std::string(strategy_name(kind)) + " needs a communicator");
  }
  switch (kind) {
    case StrategyKind::kDp: return std::make_unique<DpStrategy>(setup);
    case StrategyKind::kDdp: return std::make_unique<DdpStrategy>(setup);
    case StrategyKind::kZero1: return std::make_unique<ZeroStrategy>(setup, 1);
    case StrategyKind::kZero2: return std::make_unique<ZeroStrategy>(setup, 2);
    case StrategyKind::kZero3: return std::make_unique<ZeroStrategy>(setup, 3);
    case StrategyKind::kNone: break;
  }
  throw InvalidUsage("unknown strategy");
}

}  // namespace braid::trainer
