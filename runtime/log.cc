#include "runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

#include "runtime/config.h"

namespace braid::runtime {

void setup_logging(int rank) { setup_logging(rank, config().log_level); }

void setup_logging(int rank, const std::string& level) {
  static auto logger = spdlog::stderr_color_mt("braid");
  std::string tag = rank >= 0 ? "rank " + std::to_string(rank) : "braid";
  logger->set_pattern("[%H:%M:%S.%e] [" + tag + "] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

}  // namespace braid::runtime
