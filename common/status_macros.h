// Status propagation macros. Abseil 2022-06-23 ships none of these.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PS_CONCAT_INNER_(a, b) a##b
#define PS_CONCAT_(a, b) PS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define PS_RETURN_IF_ERROR(expr)                         \
  do {                                                   \
    ::absl::Status ps_status_ = (expr);                  \
    if (!ps_status_.ok()) return ps_status_;             \
  } while (0)

// `PS_ASSIGN_OR_RETURN(auto x, StatusOrExpr());`
#define PS_ASSIGN_OR_RETURN(lhs, expr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_CONCAT_(ps_statusor_, __LINE__), lhs, expr)
#define PS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
