// The RFC 4180 state machine that defines where CSV records end. The shard planner (boundary
// search) and the CSV reader (field parsing) both step this one machine, so a byte range the
// planner cuts always starts where the reader's record starts.
//
// Lenient by definition, strict by report: a quote inside an unquoted field, or anything but a
// delimiter/line end after a closing quote, is taken as data (so every byte sequence has one
// parse) and flagged as a violation (the reader reports the record as malformed).
#pragma once

#include <cstdint>

namespace qlora::data {

enum class CsvState : uint8_t {
  kFieldStart,     // at the first byte of a field (also of a record)
  kUnquoted,       // inside an unquoted field
  kQuoted,         // inside a quoted field
  kQuoteInQuoted,  // just read a '"' inside a quoted field: closing quote or first of '""'
  kClosedCr,       // read '\r' right after a closing quote (expects '\n')
};
constexpr int kCsvStateCount = 5;

// What one byte did.
struct CsvStep {
  CsvState next;
  bool append;      // the byte is field content (kQuoteInQuoted + '"' appends one '"')
  bool field_end;   // a field ended before this byte's successor
  bool record_end;  // this byte ('\n') ended a record
  bool violation;   // not RFC 4180 (taken as data)
};

inline CsvStep StepCsv(CsvState state, char c) {
  switch (state) {
    case CsvState::kFieldStart:
      if (c == '"') return {CsvState::kQuoted, false, false, false, false};
      if (c == ',') return {CsvState::kFieldStart, false, true, false, false};
      if (c == '\n') return {CsvState::kFieldStart, false, true, true, false};
      return {CsvState::kUnquoted, true, false, false, false};
    case CsvState::kUnquoted:
      if (c == ',') return {CsvState::kFieldStart, false, true, false, false};
      if (c == '\n') return {CsvState::kFieldStart, false, true, true, false};
      return {CsvState::kUnquoted, true, false, false, c == '"'};
    case CsvState::kQuoted:
      if (c == '"') return {CsvState::kQuoteInQuoted, false, false, false, false};
      return {CsvState::kQuoted, true, false, false, false};
    case CsvState::kQuoteInQuoted:
      if (c == '"') return {CsvState::kQuoted, true, false, false, false};
      if (c == ',') return {CsvState::kFieldStart, false, true, false, false};
      if (c == '\n') return {CsvState::kFieldStart, false, true, true, false};
      if (c == '\r') return {CsvState::kClosedCr, false, false, false, false};
      return {CsvState::kUnquoted, true, false, false, true};
    case CsvState::kClosedCr:
      if (c == '\n') return {CsvState::kFieldStart, false, true, true, false};
      return {CsvState::kUnquoted, true, false, false, true};
  }
  return {CsvState::kUnquoted, true, false, false, true};
}

}  // namespace qlora::data
