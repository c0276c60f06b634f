// RETURN_IF_ERROR / ASSIGN_OR_RETURN: Debian's Abseil (20220623) has no status
// macros of its own.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HYM_CONCAT_INNER_(a, b) a##b
#define HYM_CONCAT_(a, b) HYM_CONCAT_INNER_(a, b)

// Returns from the enclosing function with `expr`'s status if it is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status hym_status_ = (expr);         \
    if (!hym_status_.ok()) return hym_status_;   \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on
// error returns its status, else assigns (moves) the value into `lhs`, which
// may be a declaration: ASSIGN_OR_RETURN(auto x, Foo());
#define ASSIGN_OR_RETURN(lhs, expr) \
  HYM_ASSIGN_OR_RETURN_IMPL_(HYM_CONCAT_(hym_statusor_, __LINE__), lhs, expr)

#define HYM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
