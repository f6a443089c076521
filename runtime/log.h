// Logging through spdlog. setup_logging() installs braid's default logger
// (stderr, level from BRAID_LOG_LEVEL, every line tagged with the rank);
// code logs with spdlog::info(...) etc. Calling it again updates the rank tag.
#pragma once

#include <string>

namespace braid::runtime {

void setup_logging(int rank);
// The same with an explicit level name (trace .. off) instead of BRAID_LOG_LEVEL.
void setup_logging(int rank, const std::string& level);

}  // namespace braid::runtime
