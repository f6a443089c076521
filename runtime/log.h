// Logging through spdlog. setup_logging() installs braid's default logger
// (stderr, level from BRAID_LOG_LEVEL, every line tagged with the rank,
// unless the launcher prefixes the rank's lines with it already:
// launcher_line_prefix in runtime/rank_info.h);
// code logs with spdlog::info(...) etc. Calling it again updates the rank tag.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace braid::runtime {

void setup_logging(int rank);
// The same with an explicit level name (trace .. off) instead of BRAID_LOG_LEVEL.
void setup_logging(int rank, const std::string& level);
// From now on the default logger hands each formatted line (ending in a
// newline) to `write_line` instead of writing to stderr itself: for a
// process that must never block on a stalled stderr (braid-launch), which
// then writes the lines its own way. Any thread may log; calls to
// write_line do not overlap.
void log_through(std::function<void(std::string_view line)> write_line);

}  // namespace braid::runtime
