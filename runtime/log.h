// Logging through spdlog. setup_logging() installs braid's default logger
// (stderr, level from BRAID_LOG_LEVEL, every line tagged with the rank);
// code logs with spdlog::info(...) etc. Calling it again updates the rank tag.
#pragma once

namespace braid::runtime {

void setup_logging(int rank);

}  // namespace braid::runtime
