// A thin layer over SQLite's C API for the job store: a prepared statement with typed binds and
// reads, and SQLite's errors as absl statuses an operator can act on. Not thread-safe.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct sqlite3;
struct sqlite3_stmt;

namespace qlora::coordinator::store_internal {

// "<what>: <SQLite's message> (SQLITE_FULL, ENOSPC: No space left on device)". UNAVAILABLE for
// conditions of the disk or the file that an operator can fix; INTERNAL for the rest.
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what);

// Runs `sql` (one or more statements, no results).
absl::Status Exec(sqlite3* db, const char* sql);

// The names of `table`'s columns (empty when there is no such table).
absl::StatusOr<std::set<std::string>> ColumnNames(sqlite3* db, absl::string_view table);

// Adds each of `columns` ("name TYPE DEFAULT ...") that `table` lacks (a store made before the
// column existed); an error reading the table's columns or adding one is returned, naming it.
absl::Status AddMissingColumns(sqlite3* db, absl::string_view table,
                               const std::vector<const char*>& columns);

// RAII prepared statement with 1-based binding helpers and 0-based column reads.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status() const;
  Statement& Bind(int i, const std::string& v);
  Statement& BindBlob(int i, const std::string& v);
  Statement& Bind(int i, double v);
  Statement& Bind(int i, int64_t v);
  Statement& Bind(int i, int v);
  // SQLITE_ROW -> true, SQLITE_DONE -> false.
  absl::StatusOr<bool> Step();
  std::string Text(int col) const;
  std::string Blob(int col) const;
  // SQLite stores a NaN as NULL: read it back as NaN (a diverged loss, no evaluation yet).
  double Real(int col) const;
  int64_t Int(int col) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

}  // namespace qlora::coordinator::store_internal
