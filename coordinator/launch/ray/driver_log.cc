// The Ray launcher driver's log, line by line (see driver_log.h).
#include "coordinator/launch/ray/driver_log.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace qlora::coordinator {
namespace {

constexpr absl::string_view kLogMarker = "QLORA-LOG ";

// A QLORA-EXIT line's JSON as a RankEnd; rank -2 when it cannot be read.
RankEnd ParseEnd(absl::string_view text) {
  RankEnd end;
  end.rank = -2;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer()) return end;
  end.rank = j["rank"].get<int>();
  // Each field is read only when it has the expected type: a line is input, not a contract.
  auto string_field = [&](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  auto number = [&](const char* key) {
    return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : int64_t{0};
  };
  const std::string host = string_field("host");
  const int64_t pid = number("pid");
  if (!host.empty()) end.where = absl::StrCat("host ", host, pid > 0 ? absl::StrCat(", pid ", pid) : "");
  end.info.cause = string_field("cause");
  const int64_t signal = number("signal");
  end.info.signaled = signal > 0;
  end.info.code = static_cast<int>(signal > 0 ? signal : number("code"));
  return end;
}

}  // namespace

DriverLogReader::DriverLogReader(absl::string_view nonce) : exit_prefix_(absl::StrCat("QLORA-EXIT ", nonce, " ")) {}

DriverLogNews DriverLogReader::Feed(const std::string& whole) {
  DriverLogNews news;
  if (whole.size() < consumed_) consumed_ = 0;  // a different log: read it from its start
  while (consumed_ < whole.size()) {
    const size_t newline = whole.find('\n', consumed_);
    if (newline == std::string::npos) break;  // an incomplete line waits for the next call
    const absl::string_view line(whole.data() + consumed_, newline - consumed_);
    consumed_ = newline + 1;
    if (absl::StartsWith(line, exit_prefix_)) {
      RankEnd end = ParseEnd(line.substr(exit_prefix_.size()));
      if (end.rank >= -1) {
        news.ends.push_back(std::move(end));
        continue;
      }
    }
    if (const size_t at = line.find(kLogMarker); at != absl::string_view::npos) {
      absl::string_view rest = line.substr(at + kLogMarker.size());
      const size_t space = rest.find(' ');
      int rank = 0;
      if (space != absl::string_view::npos && absl::SimpleAtoi(rest.substr(0, space), &rank) && rank >= 0) {
        news.output.emplace_back(rank, absl::StrCat(rest.substr(space + 1), "\n"));
        continue;
      }
    }
    news.driver_lines.emplace_back(line);
  }
  return news;
}

}  // namespace qlora::coordinator
