// The one logging wrapper: everything logs through these macros so the
// backend (spdlog today) stays replaceable. Each process sets its node name
// once (`S[0]`, `W[1]`, `H` for the scheduler) and it prefixes every line.
#pragma once

#include <string>

#include "spdlog/spdlog.h"

namespace ps {

// Sets the process-wide log prefix and level ("debug", "info", "warn",
// "error"). Safe to call more than once; not thread-safe against logging.
void InitLogging(const std::string& node_name, const std::string& level = "info");

}  // namespace ps

#define PS_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define PS_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define PS_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define PS_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
