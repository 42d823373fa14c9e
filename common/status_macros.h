// Early-return helpers for absl::Status / absl::StatusOr (the system's Abseil predates
// ABSL_RETURN_IF_ERROR). Usage:
//   QLORA_RETURN_IF_ERROR(DoThing());
//   QLORA_ASSIGN_OR_RETURN(auto value, ComputeValue());
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define QLORA_STATUS_CONCAT_INNER(a, b) a##b
#define QLORA_STATUS_CONCAT(a, b) QLORA_STATUS_CONCAT_INNER(a, b)

#define QLORA_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status qlora_status_ = (expr);           \
    if (!qlora_status_.ok()) return qlora_status_;   \
  } while (0)

#define QLORA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(*tmp)

#define QLORA_ASSIGN_OR_RETURN(lhs, rexpr) \
  QLORA_ASSIGN_OR_RETURN_IMPL(QLORA_STATUS_CONCAT(qlora_statusor_, __LINE__), lhs, rexpr)
