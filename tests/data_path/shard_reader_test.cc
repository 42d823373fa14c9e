// Sharding and record readers: every record exactly once for 1..4 ranks (CSV with quoted
// newlines, doubled quotes and CRLF; JSON Lines; text), cuts equal to a sequential parse at
// every offset, and malformed records reported with file, line and reason.
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/data_path/test_util.h"
#include "common/dataset/record_reader.h"
#include "common/dataset/shard_planner.h"

namespace qlora::data {
namespace {

using ::testing::HasSubstr;

// Tricky field text: commas, quotes, newlines (LF and CRLF), Unicode, long runs.
std::string RandomText(std::mt19937& rng, int id) {
  static const std::vector<std::string> parts = {
      "plain", "with, comma", "a \"quoted\" word", "line\nbreak", "crlf\r\nbreak", "\"",
      "ünïcødé 日本語 🙂", "  spaces  ", "", ",", "\n", "x\"\"y", "tab\there"};
  std::string out = absl::StrCat("r", id);
  int n = static_cast<int>(rng() % 5);
  for (int i = 0; i < n; ++i) out += parts[rng() % parts.size()];
  if (rng() % 50 == 0) out += std::string(3000, 'z');
  return out;
}

std::string CsvQuote(const std::string& s, bool force) {
  bool need = force || s.find_first_of(",\"\r\n") != std::string::npos;
  if (!need) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

struct Dataset {
  std::string path;
  std::map<std::string, std::pair<std::string, std::string>> rows;  // id -> (prompt, answer)
};

Dataset MakeCsv(const std::string& dir, int n, const char* eol, bool trailing_eol,
                unsigned seed) {
  std::mt19937 rng(seed);
  Dataset d{absl::StrCat(dir, "/data_", seed, ".csv"), {}};
  std::string text = absl::StrCat("id,instruction,output", eol);
  for (int i = 0; i < n; ++i) {
    std::string id = absl::StrCat("id", i);
    std::string a = RandomText(rng, i), b = RandomText(rng, i + 7);
    d.rows[id] = {a, b};
    text += absl::StrCat(CsvQuote(id, rng() % 3 == 0), ",", CsvQuote(a, rng() % 4 == 0), ",",
                         CsvQuote(b, false));
    if (i + 1 < n || trailing_eol) text += eol;
    if (rng() % 17 == 0) text += eol;  // blank lines are not records
  }
  WriteFile(d.path, text);
  return d;
}

Dataset MakeJsonl(const std::string& dir, int n, unsigned seed) {
  std::mt19937 rng(seed);
  Dataset d{absl::StrCat(dir, "/data_", seed, ".jsonl"), {}};
  std::string text;
  for (int i = 0; i < n; ++i) {
    std::string id = absl::StrCat("id", i);
    std::string a = RandomText(rng, i), b = RandomText(rng, i + 3);
    d.rows[id] = {a, b};
    nlohmann::ordered_json j = {{"id", id}, {"instruction", a}, {"output", b}};
    text += j.dump() + (rng() % 2 ? "\n" : "\r\n");
  }
  WriteFile(d.path, text);
  return d;
}

// The same kind of records as one JSON array (Alpaca's layout): pretty-printed or compact
// elements, text with brackets, braces, commas and escaped quotes, a BOM and whitespace first.
Dataset MakeJsonArray(const std::string& dir, int n, unsigned seed) {
  std::mt19937 rng(seed);
  Dataset d{absl::StrCat(dir, "/data_", seed, ".json"), {}};
  std::string text = "\xEF\xBB\xBF \n[";
  for (int i = 0; i < n; ++i) {
    std::string id = absl::StrCat("id", i);
    std::string a = RandomText(rng, i) + (rng() % 3 == 0 ? "}]{[\\\"," : "");
    std::string b = RandomText(rng, i + 3);
    d.rows[id] = {a, b};
    nlohmann::ordered_json j = {{"id", id}, {"instruction", a}, {"output", b}};
    text += (i > 0 ? (rng() % 2 ? ",\n  " : ",") : "\n  ") + j.dump(rng() % 2 ? 2 : -1);
  }
  WriteFile(d.path, text + "\n]\n");
  return d;
}

// Reads every shard of every rank and checks each row appears exactly once, intact, and that
// the ranks' counts differ by at most one per chunk (each chunk is interleaved on its own here).
void ExpectExactlyOnce(const Dataset& d, DataFormat format, int world, int chunks) {
  SCOPED_TRACE(absl::StrCat(d.path, " world=", world, " chunks=", chunks));
  auto plan = PlanShards({d.path}, world, ChunksOf(ReadFile(d.path).size(), chunks));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), static_cast<size_t>(world));
  std::map<std::string, int> seen;
  std::vector<int> per_rank;
  for (const auto& rank_shards : *plan) {
    per_rank.push_back(0);
    for (const ShardSpec& shard : rank_shards) {
      ReaderOptions options;
      options.format = format;
      auto reader = RecordReader::Open(shard, options);
      ASSERT_TRUE(reader.ok()) << reader.status();
      Record record;
      while (true) {
        auto more = (*reader)->Next(&record);
        ASSERT_TRUE(more.ok()) << more.status();
        if (!*more) break;
        const std::string* id = record.Find("id");
        ASSERT_NE(id, nullptr);
        ++seen[*id];
        ++per_rank.back();
        auto it = d.rows.find(*id);
        ASSERT_NE(it, d.rows.end()) << *id;
        EXPECT_EQ(*record.Find("instruction"), it->second.first) << *id;
        EXPECT_EQ(*record.Find("output"), it->second.second) << *id;
      }
    }
  }
  EXPECT_EQ(seen.size(), d.rows.size());
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << id;
  const int chunks_read = static_cast<int>((*plan)[0].size());
  EXPECT_LE(*std::max_element(per_rank.begin(), per_rank.end()) -
                *std::min_element(per_rank.begin(), per_rank.end()),
            chunks_read);
}

TEST(DataShardTest, CsvRecordsExactlyOnceForOneToFourRanks) {
  TempDir dir;
  for (const char* eol : {"\n", "\r\n"}) {
    for (bool trailing : {true, false}) {
      Dataset d = MakeCsv(dir.path(), 400, eol, trailing, eol[0] == '\r' ? 11u : 12u);
      for (int world = 1; world <= 4; ++world)
        for (int chunks : {1, 3, 8}) ExpectExactlyOnce(d, DataFormat::kCsv, world, chunks);
    }
  }
}

TEST(DataShardTest, JsonlRecordsExactlyOnceForOneToFourRanks) {
  TempDir dir;
  Dataset d = MakeJsonl(dir.path(), 500, 5);
  for (int world = 1; world <= 4; ++world)
    for (int chunks : {1, 2, 5}) ExpectExactlyOnce(d, DataFormat::kJsonl, world, chunks);
}

// A JSON array file (format jsonl, or auto with a .json name) is one record per element, cut
// into shards at element starts.
TEST(DataShardTest, JsonArrayElementsExactlyOnceForOneToFourRanks) {
  TempDir dir;
  Dataset d = MakeJsonArray(dir.path(), 300, 9);
  auto format = ResolveFormat("auto", d.path);
  ASSERT_TRUE(format.ok()) << format.status();
  for (int world = 1; world <= 4; ++world)
    for (int chunks : {1, 2, 5}) ExpectExactlyOnce(d, *format, world, chunks);
}

// The speculative CSV cut equals an exact sequential parse from the file start, at every byte.
TEST(DataShardTest, CsvCutAtEveryOffsetMatchesSequentialParse) {
  TempDir dir;
  Dataset d = MakeCsv(dir.path(), 60, "\r\n", true, 21);
  auto file = ByteRangeFile::Open(d.path);
  ASSERT_TRUE(file.ok());
  auto start = FindDataStart(**file, DataFormat::kCsv);
  ASSERT_TRUE(start.ok());
  // Oracle: record starts by a sequential parse.
  std::vector<int64_t> starts;
  {
    ReaderOptions options;
    options.format = DataFormat::kCsv;
    auto reader = RecordReader::Open({d.path, 0, (*file)->size(), 1}, options);
    ASSERT_TRUE(reader.ok());
    Record r;
    while (*(*reader)->Next(&r)) starts.push_back(r.offset);
  }
  ASSERT_EQ(starts.size(), d.rows.size());
  ShardPlanOptions options;
  options.max_record_bytes = 4096;  // keeps the quote-free fallback bound small
  for (int64_t offset = start->offset; offset <= (*file)->size(); ++offset) {
    auto cut = FindRecordStart(**file, DataFormat::kCsv, offset, start->offset,
                               start->header_fields, options);
    ASSERT_TRUE(cut.ok());
    auto next = std::lower_bound(starts.begin(), starts.end(), offset);
    int64_t expected = *cut;
    // A cut is either a record start or the end of the file; blank lines may precede a start.
    if (next != starts.end()) {
      ASSERT_LE(*cut, *next) << "offset " << offset;
      // Only blank-line bytes may lie between the cut and the next record.
      std::string between = ReadFile(d.path).substr(*cut, *next - *cut);
      for (char c : between) ASSERT_TRUE(c == '\r' || c == '\n') << "offset " << offset;
    } else {
      std::string rest = ReadFile(d.path).substr(expected);
      for (char c : rest) ASSERT_TRUE(c == '\r' || c == '\n') << "offset " << offset;
    }
    if (next != starts.begin()) ASSERT_GT(*cut, *(next - 1) - (offset == *(next - 1) ? 1 : 0));
  }
}

// The cut search reads only near each cut: on a well-formed CSV full of quoted newlines every
// cut is decided speculatively, and the bytes scanned stay a small fraction of the file.
TEST(DataShardTest, CsvCutsAreSpeculativeAndReadLittle) {
  TempDir dir;
  Dataset d = MakeCsv(dir.path(), 20000, "\r\n", true, 31);
  const int64_t size = static_cast<int64_t>(ReadFile(d.path).size());
  CutStats stats;
  ShardPlanOptions options;
  options.stats = &stats;
  auto shards = SplitFile(d.path, 16, options);
  ASSERT_TRUE(shards.ok());
  EXPECT_EQ(shards->size(), 16u);
  EXPECT_EQ(stats.speculative_cuts, 15);
  EXPECT_EQ(stats.sequential_cuts, 0);
  RecordProperty("bytes_scanned", std::to_string(stats.bytes_scanned));
  RecordProperty("file_bytes", std::to_string(size));
  EXPECT_LT(stats.bytes_scanned, size / 20) << stats.bytes_scanned << " of " << size;
}

TEST(DataShardTest, TextLinesExactlyOnce) {
  TempDir dir;
  std::string path = dir.path() + "/corpus.txt";
  std::string text;
  for (int i = 0; i < 300; ++i) text += absl::StrCat("line ", i, i % 7 ? "\n" : "\r\n\n");
  WriteFile(path, text);
  for (int world = 1; world <= 4; ++world) {
    auto plan = PlanShards({path}, world, ChunksOf(text.size(), 2));
    ASSERT_TRUE(plan.ok());
    std::map<std::string, int> seen;
    for (const auto& shards : *plan)
      for (const ShardSpec& shard : shards) {
        ReaderOptions options;
        options.format = DataFormat::kText;
        auto reader = RecordReader::Open(shard, options);
        ASSERT_TRUE(reader.ok());
        Record r;
        while (*(*reader)->Next(&r)) ++seen[*r.Find("text")];
      }
    ASSERT_EQ(seen.size(), 300u);
    for (const auto& [line, count] : seen) EXPECT_EQ(count, 1) << line;
  }
}

TEST(DataShardTest, ByteOrderMarksAreNotData) {
  TempDir dir;
  const std::string bom = "\xEF\xBB\xBF";
  WriteFile(dir.path() + "/bom.csv", bom + "id,text\r\n1,x\r\n");
  WriteFile(dir.path() + "/bom.jsonl", bom + "{\"id\": \"1\"}\n");
  WriteFile(dir.path() + "/bom.txt", bom + "first line\n");
  for (auto [name, format, column, value] :
       {std::make_tuple("bom.csv", DataFormat::kCsv, "id", "1"),
        std::make_tuple("bom.jsonl", DataFormat::kJsonl, "id", "1"),
        std::make_tuple("bom.txt", DataFormat::kText, "text", "first line")}) {
    auto shards = SplitFile(dir.path() + "/" + name, 1);
    ASSERT_TRUE(shards.ok());
    ReaderOptions options;
    options.format = format;
    auto reader = RecordReader::Open((*shards)[0], options);
    ASSERT_TRUE(reader.ok());
    Record r;
    auto more = (*reader)->Next(&r);
    ASSERT_TRUE(more.ok()) << name << ": " << more.status();
    ASSERT_TRUE(*more);
    ASSERT_NE(r.Find(column), nullptr) << name;
    EXPECT_EQ(*r.Find(column), value) << name;
  }
}

TEST(DataShardTest, EveryRankReadsEveryChunkWithItsOwnPhase) {
  TempDir dir;
  Dataset a = MakeJsonl(dir.path(), 200, 1);
  Dataset b = MakeJsonl(dir.path(), 50, 2);
  auto plan = PlanShards({a.path, b.path}, 3, ChunksOf(ReadFile(a.path).size(), 2));
  ASSERT_TRUE(plan.ok());
  for (int rank = 0; rank < 3; ++rank) {
    const std::vector<ShardSpec>& shards = (*plan)[rank];
    int64_t total = 0;
    for (const ShardSpec& s : shards) {
      total += s.end - s.begin;
      EXPECT_EQ(s.stride, 3);
      EXPECT_EQ(s.phase, rank);
    }
    EXPECT_EQ(total, static_cast<int64_t>(ReadFile(a.path).size() + ReadFile(b.path).size()));
    ASSERT_GE(shards.size(), 3u);  // a in two or three chunks, b in one
    EXPECT_EQ(shards.front().path, a.path);
    EXPECT_EQ(shards.back().path, b.path);
  }
}

// The skew of issue 16: one 20,000-character field among 213 short records. Byte-balanced
// shards gave one rank a handful of records; interleaving gives each rank its share of the
// records, counts differing by at most one, whatever their sizes. Malformed records are
// reported by exactly one rank.
TEST(DataShardTest, SkewedRecordSizesSplitEvenlyByRecords) {
  TempDir dir;
  const std::string path = dir.path() + "/skewed.jsonl";
  std::string text;
  for (int i = 0; i < 214; ++i) {
    const std::string input = i == 3 ? std::string(20000, 'x') : absl::StrCat("short ", i);
    text += nlohmann::json({{"id", absl::StrCat("id", i)}, {"instruction", input}, {"output", "y"}})
                .dump() + "\n";
  }
  text += "not json\n";  // one malformed record
  WriteFile(path, text);
  for (int world = 1; world <= 3; ++world) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    auto plan = PlanShards({path}, world);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::set<std::string> seen;
    std::vector<int64_t> counts;
    int64_t malformed = 0;
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_EQ((*plan)[rank].size(), 1u);  // a small file is one chunk
      ReaderOptions options;
      options.format = DataFormat::kJsonl;
      options.skip_malformed = true;
      auto reader = RecordReader::Open((*plan)[rank][0], options);
      ASSERT_TRUE(reader.ok()) << reader.status();
      Record r;
      int64_t n = 0;
      while (true) {
        auto more = (*reader)->Next(&r);
        ASSERT_TRUE(more.ok()) << more.status();
        if (!*more) break;
        EXPECT_TRUE(seen.insert(*r.Find("id")).second);
        ++n;
      }
      counts.push_back(n + (*reader)->malformed_count());
      malformed += (*reader)->malformed_count();
      EXPECT_EQ((*reader)->next_index(), 215);  // every rank counted every record
    }
    EXPECT_EQ(seen.size(), 214u);
    EXPECT_EQ(malformed, 1);
    for (int64_t n : counts) {
      EXPECT_GE(n, 215 / world);
      EXPECT_LE(n, (215 + world - 1) / world);
    }
  }
}

// The interleaving index runs on from one shard to the next (first_index), and a select
// filter applies before it: its rejects are neither counted nor kept.
TEST(DataShardTest, InterleavingRunsAcrossShardsAfterTheSelectFilter) {
  TempDir dir;
  Dataset d = MakeJsonl(dir.path(), 101, 9);
  auto split = SplitFile(d.path, 4);
  ASSERT_TRUE(split.ok());
  ASSERT_EQ(split->size(), 4u);
  std::vector<int64_t> counts(2, 0);
  std::set<std::string> seen;
  int64_t selected = 0;
  for (int phase = 0; phase < 2; ++phase) {
    int64_t index = 0;
    for (ShardSpec shard : *split) {
      shard.stride = 2;
      shard.phase = phase;
      ReaderOptions options;
      options.first_index = index;
      options.select = [](int64_t offset) { return offset % 3 != 0; };
      auto reader = RecordReader::Open(shard, options);
      ASSERT_TRUE(reader.ok());
      Record r;
      while (*(*reader)->Next(&r)) {
        EXPECT_NE(r.offset % 3, 0);
        EXPECT_TRUE(seen.insert(*r.Find("id")).second);
        ++counts[phase];
      }
      index = (*reader)->next_index();
    }
    selected = index;  // every phase counts every selected record
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), selected);
  EXPECT_LE(std::abs(counts[0] - counts[1]), 1);
  EXPECT_GT(counts[0] + counts[1], 50);
  EXPECT_LT(counts[0] + counts[1], 101);
}

TEST(DataShardTest, APhaseOutsideTheStrideIsRefused) {
  TempDir dir;
  Dataset d = MakeJsonl(dir.path(), 3, 4);
  ShardSpec shard{d.path, 0, static_cast<int64_t>(ReadFile(d.path).size()), 1, 2, 2};
  EXPECT_EQ(RecordReader::Open(shard, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Collects every record of one whole file under a policy.
absl::StatusOr<std::vector<Record>> ReadAll(const std::string& path, DataFormat format,
                                            bool skip, int64_t* malformed,
                                            std::vector<std::string>* messages,
                                            int shards = 1) {
  auto split = SplitFile(path, shards);
  if (!split.ok()) return split.status();
  std::vector<Record> out;
  *malformed = 0;
  for (const ShardSpec& shard : *split) {
    ReaderOptions options;
    options.format = format;
    options.skip_malformed = skip;
    auto reader = RecordReader::Open(shard, options);
    if (!reader.ok()) return reader.status();
    Record r;
    while (true) {
      auto more = (*reader)->Next(&r);
      if (!more.ok()) return more.status();
      if (!*more) break;
      out.push_back(r);
    }
    *malformed += (*reader)->malformed_count();
    for (const auto& m : (*reader)->malformed_messages()) messages->push_back(m);
  }
  return out;
}

TEST(DataMalformedTest, JsonlFailNamesFileLineAndReason) {
  TempDir dir;
  std::string path = dir.path() + "/bad.jsonl";
  WriteFile(path, "{\"a\": \"1\"}\n\n{\"a\": \"2\"}\n{\"a\": oops}\n[1,2]\n{\"a\": \"3\"}\n");
  int64_t malformed = 0;
  std::vector<std::string> messages;
  auto fail = ReadAll(path, DataFormat::kJsonl, false, &malformed, &messages);
  ASSERT_FALSE(fail.ok());
  EXPECT_EQ(fail.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fail.status().message()), HasSubstr(path + ":4: malformed jsonl"));
  EXPECT_THAT(std::string(fail.status().message()), HasSubstr("invalid JSON"));

  auto skip = ReadAll(path, DataFormat::kJsonl, true, &malformed, &messages);
  ASSERT_TRUE(skip.ok()) << skip.status();
  EXPECT_EQ(skip->size(), 3u);
  EXPECT_EQ(malformed, 2);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_THAT(messages[0], HasSubstr(":4: "));
  EXPECT_THAT(messages[1], HasSubstr(":5: "));
  EXPECT_THAT(messages[1], HasSubstr("must be an object"));
}

TEST(DataMalformedTest, JsonArrayElementsNameTheirLine) {
  TempDir dir;
  std::string path = dir.path() + "/bad.json";
  WriteFile(path, "[\n  {\"a\": \"1\"},\n  \"loose\",\n  {\"a\":\n    oops},\n  {\"a\": \"[,]\"}\n]\n");
  int64_t malformed = 0;
  std::vector<std::string> messages;
  auto fail = ReadAll(path, DataFormat::kJsonl, false, &malformed, &messages);
  ASSERT_FALSE(fail.ok());
  EXPECT_THAT(std::string(fail.status().message()),
              HasSubstr(path + ":3: malformed jsonl record: a JSON array element must be an object, got string"));
  auto skip = ReadAll(path, DataFormat::kJsonl, true, &malformed, &messages);
  ASSERT_TRUE(skip.ok()) << skip.status();
  ASSERT_EQ(skip->size(), 2u);
  EXPECT_EQ(*(*skip)[1].Find("a"), "[,]");
  EXPECT_EQ(malformed, 2);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_THAT(messages[1], HasSubstr(":4: "));
  EXPECT_THAT(messages[1], HasSubstr("invalid JSON"));
}

TEST(DataMalformedTest, CsvErrorsCarryFileLinesEvenInLaterShards) {
  TempDir dir;
  std::string path = dir.path() + "/bad.csv";
  std::string text = "a,b\r\n";
  for (int i = 0; i < 200; ++i) text += absl::StrCat("\"multi\nline ", i, "\",x\r\n");
  text += "only_one_field\r\n";             // line 2 + 400 = 402
  text += "1,2\r\n";
  text += "bad \"quote,z\r\n";              // line 404
  text += "\"unterminated,q\r\n";           // line 405, runs to the end
  WriteFile(path, text);
  int64_t malformed = 0;
  std::vector<std::string> messages;
  auto fail = ReadAll(path, DataFormat::kCsv, false, &malformed, &messages, 4);
  ASSERT_FALSE(fail.ok());
  EXPECT_THAT(std::string(fail.status().message()), HasSubstr(path + ":402: "));
  EXPECT_THAT(std::string(fail.status().message()), HasSubstr("has 1 fields, the header has 2"));

  auto skip = ReadAll(path, DataFormat::kCsv, true, &malformed, &messages, 4);
  ASSERT_TRUE(skip.ok()) << skip.status();
  EXPECT_EQ(skip->size(), 201u);
  EXPECT_EQ(malformed, 3);
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_THAT(messages[1], HasSubstr(":404: "));
  EXPECT_THAT(messages[1], HasSubstr("misplaced"));
  EXPECT_THAT(messages[2], HasSubstr(":405: "));
  EXPECT_THAT(messages[2], HasSubstr("unterminated"));
}

// Both found while fuzzing the readers (tests/fuzz/record_reader_fuzzer): a deeply nested JSON
// value overflowed the stack when kept as JSON text, and a CSV record of empty fields grew its
// field list past max_record_bytes.
TEST(DataMalformedTest, DeepJsonAndManyEmptyCsvFieldsAreMalformedNotFatal) {
  TempDir dir;
  const std::string jsonl = dir.path() + "/deep.jsonl";
  const int depth = 200000;
  WriteFile(jsonl, absl::StrCat("{\"a\": \"1\"}\n{\"a\": ", std::string(depth, '['),
                                std::string(depth, ']'), "}\n{\"a\": [[[1]]]}\n"));
  int64_t malformed = 0;
  std::vector<std::string> messages;
  auto records = ReadAll(jsonl, DataFormat::kJsonl, true, &malformed, &messages);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ(*(*records)[1].Find("a"), "[[[1]]]");
  EXPECT_EQ(malformed, 1);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_THAT(messages[0], HasSubstr(":2: malformed jsonl record: JSON nested more than 128"));

  const std::string csv = dir.path() + "/commas.csv";
  WriteFile(csv, absl::StrCat("a,b\n1,2\n", std::string((1 << 20) + 10, ','), "\n3,4\n\"",
                              std::string((1 << 20) + 10, 'x'), "\"\n5,6\n"));
  messages.clear();
  auto rows = ReadAll(csv, DataFormat::kCsv, true, &malformed, &messages);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->size(), 3u);
  EXPECT_EQ(malformed, 2);  // the second: one over-long field, none kept, is not a blank line
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_THAT(messages[0], HasSubstr(":3: malformed csv record: record longer than"));
  EXPECT_THAT(messages[1], HasSubstr(":5: malformed csv record: record longer than"));
}

}  // namespace
}  // namespace qlora::data
