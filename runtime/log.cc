#include "runtime/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <string>
#include <utility>

#include "runtime/config.h"
#include "runtime/rank_info.h"

namespace braid::runtime {
namespace {

// Formats as the logger's pattern says and hands the line on (log_through).
class LineSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit LineSink(std::function<void(std::string_view)> write_line) : write_line_(std::move(write_line)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    write_line_(std::string_view(line.data(), line.size()));
  }
  void flush_() override {}

 private:
  std::function<void(std::string_view)> write_line_;
};

// "[12:00:00.000] [rank 1] [warning] ...", or without the rank's tag where
// the launcher puts it before the line already (braid-launch relaying the
// output: "[rank 1] [rank 1]" was the rank twice).
std::string pattern(int rank) {
  std::string tag = rank >= 0 ? "rank " + std::to_string(rank) : "braid";
  if (rank >= 0 && launcher_line_prefix() == "[" + tag + "] ") return "[%H:%M:%S.%e] [%^%l%$] %v";
  return "[%H:%M:%S.%e] [" + tag + "] [%^%l%$] %v";
}

int logged_rank = -1;  // the tag setup_logging last set

}  // namespace

void setup_logging(int rank) { setup_logging(rank, config().log_level); }

void setup_logging(int rank, const std::string& level) {
  static auto logger = spdlog::stderr_color_mt("braid");
  logged_rank = rank;
  logger->set_pattern(pattern(rank));
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

void log_through(std::function<void(std::string_view line)> write_line) {
  auto logger = std::make_shared<spdlog::logger>("braid-lines", std::make_shared<LineSink>(std::move(write_line)));
  logger->set_pattern(pattern(logged_rank));
  logger->set_level(spdlog::default_logger()->level());
  spdlog::set_default_logger(logger);
}

}  // namespace braid::runtime
