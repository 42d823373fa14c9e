// SQLite statements and errors for the job store (see sqlite_statement.h).
#include "coordinator/store/sqlite_statement.h"

#include <sqlite3.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace qlora::coordinator::store_internal {
namespace {

// The name of SQLite's primary result code, for messages an operator can search for.
const char* SqliteCodeName(int rc) {
  switch (rc & 0xff) {
    case SQLITE_FULL: return "SQLITE_FULL";
    case SQLITE_IOERR: return "SQLITE_IOERR";
    case SQLITE_BUSY: return "SQLITE_BUSY";
    case SQLITE_LOCKED: return "SQLITE_LOCKED";
    case SQLITE_READONLY: return "SQLITE_READONLY";
    case SQLITE_CANTOPEN: return "SQLITE_CANTOPEN";
    case SQLITE_NOMEM: return "SQLITE_NOMEM";
    case SQLITE_CORRUPT: return "SQLITE_CORRUPT";
    case SQLITE_CONSTRAINT: return "SQLITE_CONSTRAINT";
    default: return "SQLITE_ERROR";
  }
}

}  // namespace

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  // Only these come from the OS; otherwise the errno may be left from an earlier failure.
  const int primary = rc & 0xff;
  const bool from_os = primary == SQLITE_FULL || primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN;
  const int os_errno = from_os ? sqlite3_system_errno(db) : 0;
  const std::string os = os_errno == 0 ? "" : absl::StrCat(", ", strerrorname_np(os_errno), ": ",
                                                           strerror(os_errno));
  const std::string message =
      absl::StrCat(what, ": ", sqlite3_errmsg(db), " (", SqliteCodeName(rc), os, ")");
  switch (primary) {
    case SQLITE_FULL: case SQLITE_IOERR: case SQLITE_BUSY: case SQLITE_LOCKED:
    case SQLITE_READONLY: case SQLITE_CANTOPEN: case SQLITE_NOMEM:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status Exec(sqlite3* db, const char* sql) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? absl::OkStatus() : SqliteError(db, rc, "sqlite");
}

absl::StatusOr<std::set<std::string>> ColumnNames(sqlite3* db, absl::string_view table) {
  std::set<std::string> present;
  Statement info(db, absl::StrCat("PRAGMA table_info(", table, ")").c_str());
  if (absl::Status prepared = info.status(); !prepared.ok()) return prepared;
  for (;;) {
    absl::StatusOr<bool> row = info.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    present.insert(info.Text(1));  // the column's name
  }
  return present;
}

absl::Status AddMissingColumns(sqlite3* db, absl::string_view table,
                               const std::vector<const char*>& columns) {
  absl::StatusOr<std::set<std::string>> present = ColumnNames(db, table);
  if (!present.ok()) return present.status();
  for (const char* column : columns) {
    const absl::string_view definition(column);
    const std::string name(definition.substr(0, definition.find(' ')));
    if (present->count(name) > 0) continue;
    const absl::Status added =
        Exec(db, absl::StrCat("ALTER TABLE ", table, " ADD COLUMN ", column).c_str());
    if (!added.ok()) {
      return absl::Status(added.code(), absl::StrCat("adding the column ", table, ".", name,
                                                     ": ", added.message()));
    }
  }
  return absl::OkStatus();
}

Statement::Statement(sqlite3* db, const char* sql) : db_(db) {
  rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

absl::Status Statement::status() const {
  return rc_ == SQLITE_OK ? absl::OkStatus() : SqliteError(db_, rc_, "sqlite prepare");
}

Statement& Statement::Bind(int i, const std::string& v) {
  sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

Statement& Statement::BindBlob(int i, const std::string& v) {
  sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

Statement& Statement::Bind(int i, double v) {
  sqlite3_bind_double(stmt_, i, v);
  return *this;
}

Statement& Statement::Bind(int i, int64_t v) {
  sqlite3_bind_int64(stmt_, i, v);
  return *this;
}

Statement& Statement::Bind(int i, int v) {
  sqlite3_bind_int64(stmt_, i, v);
  return *this;
}

absl::StatusOr<bool> Statement::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqliteError(db_, rc, "sqlite step");
}

std::string Statement::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : "";
}

std::string Statement::Blob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : "";
}

double Statement::Real(int col) const {
  return sqlite3_column_type(stmt_, col) == SQLITE_NULL ? std::nan("") : sqlite3_column_double(stmt_, col);
}

int64_t Statement::Int(int col) const { return sqlite3_column_int64(stmt_, col); }

}  // namespace qlora::coordinator::store_internal
