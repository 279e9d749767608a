#include "common/logging.h"

#include "spdlog/sinks/stdout_color_sinks.h"

namespace ps {

void InitLogging(const std::string& node_name, const std::string& level) {
  auto logger = spdlog::get("ps");
  if (!logger) logger = spdlog::stderr_color_mt("ps");
  logger->set_pattern("%H:%M:%S.%e " + node_name + " %^%L%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace ps
