// lib/store/sqlite_db.hpp: the little of SQLite's C API the snapshot store
// needs, as RAII: a connection and prepared statements whose errors come back
// as Status. Internal (not installed). Every statement is prepared once from
// a constant string and fed through bind_*: no SQL text is ever built from
// input.
//
//   store_detail::SqliteDb db;
//   CLM_RETURN_IF_ERROR(db.open("/tmp/s/shard-00.db"));
//   store_detail::Statement get;
//   CLM_RETURN_IF_ERROR(db.prepare("SELECT snapshot FROM semantic_snapshots WHERE id = ?", get));
//   get.bind_int(1, id);
//   if (get.step() == SQLITE_ROW) use(get.column_blob(0));
//   get.reset();
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "clm/status.hpp"

namespace clm::store_detail {

class Statement {
 public:
  Statement() = default;
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  void adopt(sqlite3_stmt* stmt) {
    sqlite3_finalize(stmt_);
    stmt_ = stmt;
  }
  void bind_int(int i, std::int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void bind_double(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  // The bytes stay the caller's until reset() (SQLITE_STATIC: no copy).
  void bind_blob(int i, std::span<const std::uint8_t> b) {
    sqlite3_bind_blob64(stmt_, i, b.empty() ? "" : static_cast<const void*>(b.data()), b.size(), SQLITE_STATIC);
  }
  void bind_blob(int i, std::string_view b) {
    sqlite3_bind_blob64(stmt_, i, b.empty() ? "" : b.data(), b.size(), SQLITE_STATIC);
  }
  void bind_text(int i, std::string_view t) {
    sqlite3_bind_text64(stmt_, i, t.data(), t.size(), SQLITE_STATIC, SQLITE_UTF8);
  }

  int step() { return sqlite3_step(stmt_); }
  // Clears bindings too, so no pointer to the caller's bytes outlives the call.
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  std::int64_t column_int(int i) const { return sqlite3_column_int64(stmt_, i); }
  double column_double(int i) const { return sqlite3_column_double(stmt_, i); }
  std::span<const std::uint8_t> column_blob(int i) const {
    const void* p = sqlite3_column_blob(stmt_, i);
    const int n = sqlite3_column_bytes(stmt_, i);
    return {static_cast<const std::uint8_t*>(p), p ? static_cast<std::size_t>(n) : 0};
  }
  std::string_view column_text(int i) const {
    const unsigned char* p = sqlite3_column_text(stmt_, i);
    const int n = sqlite3_column_bytes(stmt_, i);
    return p ? std::string_view(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n)) : std::string_view();
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// Resets a statement when the scope ends, however it ends: an exception
// (bad_alloc while a row is decoded or handed to a callback) must not leave
// it in the middle of its rows and bound to bytes the caller has freed, where
// its next use would fail to bind and step on through the old rows.
class ResetOnExit {
 public:
  explicit ResetOnExit(Statement& stmt) : stmt_(stmt) {}
  ~ResetOnExit() { stmt_.reset(); }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  Statement& stmt_;
};

class SqliteDb {
 public:
  SqliteDb() = default;
  ~SqliteDb() { sqlite3_close_v2(db_); }
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // read_only: SQLITE_OPEN_READONLY (a WAL database is read beside its
  // writer; nothing is created).
  Status open(const std::string& path, bool read_only = false) {
    const int flags = (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) |
                      SQLITE_OPEN_NOMUTEX;  // the shard lock serialises
    const int rc = sqlite3_open_v2(path.c_str(), &db_, flags, nullptr);
    if (rc != SQLITE_OK) return error(rc, fmt::format("cannot open {}", path));
    sqlite3_extended_result_codes(db_, 1);
    return {};
  }
  sqlite3* handle() const { return db_; }

  Status prepare(const char* sql, Statement& out) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) return error(rc, fmt::format("cannot prepare \"{}\"", sql));
    out.adopt(stmt);
    return {};
  }
  // Runs constant SQL text (schema, pragmas, BEGIN/COMMIT): never input.
  Status exec(const char* sql) {
    const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return error(rc, fmt::format("\"{}\" failed", sql));
    return {};
  }

  // A Status for SQLite's result code rc, with the connection's message.
  Status error(int rc, std::string_view what) const {
    return {StatusCode::io_error, fmt::format("sqlite: {}: {} ({})", what,
                                              db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc), sqlite3_errstr(rc))};
  }
  bool is_busy(int rc) const { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace clm::store_detail
