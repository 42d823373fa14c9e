// Parquet datasets: files written by pyarrow (make_parquet.py) read back record by record as
// pyarrow reads them, row-group shards over 1-3 ranks that tile every row exactly once (also
// inside one row group), corrupt, truncated and column-less files named in the error, the
// malformed-record policy, and the loader giving the same micro-batches from Parquet as from the
// same rows as JSON Lines.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "absl/strings/str_split.h"
#include "common/config/hf_dataset_folder.h"
#include "common/dataset/arrow_ipc_reader.h"
#include "common/dataset/parquet_reader.h"
#include "common/dataset/shard_planner.h"
#include "tests/data_path/test_util.h"
#include "worker/data/data_loader.h"

namespace qlora::data {
namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

class ParquetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string python = ReferencePython();
    if (python.empty()) GTEST_SKIP() << "no reference Python (QLORA_PYTHON) to write Parquet";
    const char* source = std::getenv("QLORA_SOURCE_DIR");
    ASSERT_NE(source, nullptr);
    const std::string command = python + " " + source + "/tests/data_path/make_parquet.py " +
                                dir_.path();
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    for (const auto& row : nlohmann::json::parse(ReadFile(Path("expected.json")))) {
      Fields fields;
      for (const auto& pair : row) fields.emplace_back(pair[0], pair[1]);
      expected_.push_back(std::move(fields));
    }
    ASSERT_EQ(expected_.size(), 50u);
  }

  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }

  static ReaderOptions Parquet(bool skip = false) {
    ReaderOptions options;
    options.format = DataFormat::kParquet;
    options.skip_malformed = skip;
    return options;
  }

  // Every record of `shard`; fails the test on an error.
  static std::vector<Record> ReadShard(const ShardSpec& shard, const ReaderOptions& options) {
    std::vector<Record> records;
    auto reader = RecordReader::Open(shard, options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return records;
    Record record;
    while (true) {
      auto more = (*reader)->Next(&record);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      records.push_back(record);
    }
    return records;
  }

  TempDir dir_;
  std::vector<Fields> expected_;
};

// A folder that Hugging Face `datasets` saved (save_to_disk: Arrow IPC streams listed in
// state.json) reads row for row as pyarrow reads the same rows from Parquet, through shards over
// 1-3 ranks that tile every row exactly once; a DatasetDict's train split is the same files.
TEST_F(ParquetTest, AFolderSavedByDatasetsReadsAsPyarrowReadsIt) {
  absl::StatusOr<std::string> files = HfDatasetFolderFiles(Path("saved"), DatasetRoleSplit::kTrain);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, Path("saved/data-00000-of-00002.arrow") + "," + Path("saved/data-00001-of-00002.arrow"));
  absl::StatusOr<std::string> split = HfDatasetFolderFiles(Path("dict"), DatasetRoleSplit::kTrain);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(*split, Path("dict/train/data-00000-of-00002.arrow") + "," + Path("dict/train/data-00001-of-00002.arrow"));
  EXPECT_EQ(HfDatasetFolderFiles(Path("dict"), DatasetRoleSplit::kValidation).status().code(),
            absl::StatusCode::kNotFound);
  ReaderOptions arrow;
  arrow.format = DataFormat::kArrow;
  for (int shards = 1; shards <= 3; ++shards) {
    std::vector<Fields> read;
    for (const std::string& file : std::vector<std::string>(absl::StrSplit(*files, ','))) {
      auto planned = SplitFile(file, shards);
      ASSERT_TRUE(planned.ok()) << planned.status();
      for (const ShardSpec& shard : *planned) {
        for (const Record& record : ReadShard(shard, arrow)) read.push_back(record.fields);
      }
    }
    EXPECT_EQ(read, expected_) << shards << " shard(s) per file";
  }
  // Only the job's columns, and a missing one named with the file's.
  arrow.columns = {"instruction", "output"};
  auto first = SplitFile(Path("saved/data-00001-of-00002.arrow"), 1);
  ASSERT_TRUE(first.ok());
  const std::vector<Record> two = ReadShard((*first)[0], arrow);
  ASSERT_EQ(two.size(), 25u);
  EXPECT_EQ(two[0].fields, (Fields{expected_[25][1], expected_[25][2]}));
  EXPECT_EQ(two[0].line, 1);
  arrow.columns = {"instrucion"};
  auto missing = RecordReader::Open((*first)[0], arrow);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "no column 'instrucion' (the file has: id, instruction"))
      << missing.status();
  // A file that is not Arrow is named.
  auto not_arrow = ReadArrowLayout(Path("rows.jsonl"));
  EXPECT_EQ(not_arrow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(not_arrow.status().message(), Path("rows.jsonl") + ": not a readable Arrow IPC file"))
      << not_arrow.status();
}

// The coordinator reads a footer through /proc/self/fd/N of a file it opened O_PATH beneath its
// read roots (coordinator/admission/confined_open.h): the same layout as by its path.
TEST_F(ParquetTest, TheFooterReadsThroughAnOpenDescriptorsProcPath) {
  const int fd = open(Path("rows.parquet").c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto layout = ReadParquetLayout("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->rows, 50);
  EXPECT_EQ(layout->row_group_rows, (std::vector<int64_t>{8, 8, 8, 8, 8, 8, 2}));
}

TEST_F(ParquetTest, RecordsEqualWhatPyarrowReads) {
  auto layout = ReadParquetLayout(Path("rows.parquet"));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->rows, 50);
  EXPECT_EQ(layout->row_group_rows, (std::vector<int64_t>{8, 8, 8, 8, 8, 8, 2}));
  std::vector<Record> records = ReadShard({Path("rows.parquet"), 0, 50, 1}, Parquet());
  ASSERT_EQ(records.size(), 50u);
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].fields, expected_[i]) << "row " << i;
    EXPECT_EQ(records[i].offset, static_cast<int64_t>(i));
    EXPECT_EQ(records[i].line, static_cast<int64_t>(i) + 1);
  }
  // A few values spelled out, so that the rules do not rest on the Python side alone.
  EXPECT_EQ(*records[3].Find("instruction"), "");  // null
  EXPECT_EQ(*records[1].Find("instruction"), "q1 ünïcødé 日本語 🙂 x");
  EXPECT_EQ(*records[2].Find("score"), "0.5");
  EXPECT_EQ(*records[2].Find("ok"), "true");
  EXPECT_EQ(*records[3].Find("tags"), "[\"a\",null,\"c\"]");
  EXPECT_EQ(*records[4].Find("messages"), "");
  EXPECT_EQ(*records[0].Find("messages"),
            "[{\"role\":\"user\",\"content\":\"hi 0 ☃ \\\"quoted\\\"\"},"
            "{\"role\":\"assistant\",\"content\":\" yo 0\\n\"}]");
}

TEST_F(ParquetTest, ColumnsAreProjectedAndAMissingOneNamesTheFile) {
  ReaderOptions options = Parquet();
  options.columns = {"output", "id"};
  options.optional_columns = {"absent"};
  std::vector<Record> records = ReadShard({Path("rows.parquet"), 10, 12, 11}, options);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].fields, (Fields{{"id", "10"}, {"output", "a10 ✓"}}));  // file order

  options.columns = {"instruction", "answer"};
  auto reader = RecordReader::Open({Path("rows.parquet"), 0, 50, 1}, options);
  ASSERT_FALSE(reader.ok());
  EXPECT_TRUE(absl::StrContains(reader.status().message(), Path("rows.parquet")))
      << reader.status();
  EXPECT_TRUE(absl::StrContains(reader.status().message(), "no column 'answer'"))
      << reader.status();
}

// Every row exactly once over the ranks, each record equal to pyarrow's.
void ExpectTiles(const std::vector<std::vector<ShardSpec>>& plan, int64_t rows,
                 const std::vector<Fields>* expected) {
  std::map<int64_t, int> seen;
  for (const auto& shards : plan) {
    EXPECT_FALSE(shards.empty());
    for (const ShardSpec& shard : shards) {
      auto reader = RecordReader::Open(shard, [] {
        ReaderOptions options;
        options.format = DataFormat::kParquet;
        return options;
      }());
      ASSERT_TRUE(reader.ok()) << reader.status();
      Record record;
      while (true) {
        auto more = (*reader)->Next(&record);
        ASSERT_TRUE(more.ok()) << more.status();
        if (!*more) break;
        ++seen[record.offset];
        EXPECT_GE(record.offset, shard.begin);
        EXPECT_LT(record.offset, shard.end);
        if (expected) EXPECT_EQ(record.fields, (*expected)[record.offset]);
      }
    }
  }
  ASSERT_EQ(static_cast<int64_t>(seen.size()), rows);
  for (const auto& [row, count] : seen) EXPECT_EQ(count, 1) << "row " << row;
}

TEST_F(ParquetTest, ShardsOverOneToThreeRanksTileEveryRowOnce) {
  const int64_t size = static_cast<int64_t>(ReadFile(Path("rows.parquet")).size());
  for (int world = 1; world <= 3; ++world) {
    for (int chunks : {1, 2, 5}) {
      SCOPED_TRACE(::testing::Message() << "world " << world << ", " << chunks << " chunks");
      auto plan = PlanShards({Path("rows.parquet")}, world, ChunksOf(size, chunks));
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->size(), static_cast<size_t>(world));
      // 7 row groups >= chunks: cuts on row-group boundaries; every rank reads every chunk
      // and keeps its phase of the rows.
      for (int rank = 0; rank < world; ++rank)
        for (const ShardSpec& shard : (*plan)[rank]) {
          EXPECT_EQ(shard.begin % 8, 0) << shard.begin;
          EXPECT_TRUE(shard.end % 8 == 0 || shard.end == 50) << shard.end;
          EXPECT_EQ(shard.first_line, shard.begin + 1);
          EXPECT_EQ(shard.stride, world);
          EXPECT_EQ(shard.phase, rank);
        }
      ExpectTiles(*plan, 50, &expected_);
    }
  }
}

TEST_F(ParquetTest, FewerRowGroupsThanShardsCutsInsideTheRowGroup) {
  for (int n = 1; n <= 3; ++n) {
    SCOPED_TRACE(::testing::Message() << n << " chunks");
    auto split = SplitFile(Path("one_group.parquet"), n);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_EQ(split->size(), static_cast<size_t>(n));
    int64_t fewest = 10, most = 0, next = 0;
    for (const ShardSpec& shard : *split) {
      EXPECT_EQ(shard.begin, next);  // they tile the rows
      next = shard.end;
      fewest = std::min(fewest, shard.end - shard.begin);
      most = std::max(most, shard.end - shard.begin);
    }
    EXPECT_EQ(next, 10);
    EXPECT_LE(most - fewest, 1);  // balanced by rows, not by row groups
  }
  for (int world = 1; world <= 3; ++world) {
    auto plan = PlanShards({Path("one_group.parquet")}, world);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectTiles(*plan, 10, nullptr);
  }
  // Several files of several formats in one plan: every rank reads all 60 rows' chunks.
  auto plan = PlanShards({Path("rows.parquet"), Path("one_group.parquet")}, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const auto& shards : *plan) {
    int64_t rows = 0;
    for (const ShardSpec& shard : shards) rows += shard.end - shard.begin;
    EXPECT_EQ(rows, 60);
  }
}

// An error from the planner, the footer reader, opening or reading: it names the file.
void ExpectFileError(const std::string& path) {
  SCOPED_TRACE(path);
  auto layout = ReadParquetLayout(path);
  ASSERT_FALSE(layout.ok());
  EXPECT_TRUE(absl::StrContains(layout.status().message(), path)) << layout.status();
  auto plan = PlanShards({path}, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), path)) << plan.status();
  ReaderOptions options;
  options.format = DataFormat::kParquet;
  auto reader = RecordReader::Open({path, 0, 50, 1}, options);
  ASSERT_FALSE(reader.ok());
  EXPECT_TRUE(absl::StrContains(reader.status().message(), path)) << reader.status();
}

TEST_F(ParquetTest, CorruptAndTruncatedFilesAreErrorsNamingTheFile) {
  const std::string good = ReadFile(Path("rows.parquet"));
  WriteFile(Path("truncated.parquet"), good.substr(0, good.size() / 2));
  ExpectFileError(Path("truncated.parquet"));
  WriteFile(Path("tail_cut.parquet"), good.substr(0, good.size() - 3));
  ExpectFileError(Path("tail_cut.parquet"));
  WriteFile(Path("text.parquet"), "{\"not\": \"parquet\"}\n");
  ExpectFileError(Path("text.parquet"));
  WriteFile(Path("empty.parquet"), "");
  ExpectFileError(Path("empty.parquet"));

  // The footer intact, the data pages overwritten: the footer reads, the rows do not.
  std::string damaged = good;
  for (size_t i = 4; i < good.size() / 4; ++i) damaged[i] = static_cast<char>(0xA5 ^ (i * 31));
  const std::string path = Path("damaged.parquet");
  WriteFile(path, damaged);
  auto plan = PlanShards({path}, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto reader = RecordReader::Open((*plan)[0][0], Parquet(/*skip=*/true));
  absl::Status status = reader.status();
  if (reader.ok()) {
    Record record;
    while (status.ok()) {
      auto more = (*reader)->Next(&record);
      status = more.status();
      if (more.ok() && !*more) break;
    }
  }
  ASSERT_FALSE(status.ok()) << "a damaged file read without an error";
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
}

TEST_F(ParquetTest, OverLongRecordsFollowTheMalformedPolicy) {
  int64_t shortest = 1 << 20, longest = 0;
  for (const Fields& row : expected_) {
    int64_t bytes = 0;
    for (const auto& [column, value] : row) bytes += static_cast<int64_t>(value.size());
    shortest = std::min(shortest, bytes);
    longest = std::max(longest, bytes);
  }
  ASSERT_LT(shortest, longest);
  ReaderOptions options = Parquet();
  options.max_record_bytes = (shortest + longest) / 2;  // the longer rows exceed it
  auto reader = RecordReader::Open({Path("rows.parquet"), 0, 50, 1}, options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Record record;
  absl::Status status;
  while (status.ok()) {
    auto more = (*reader)->Next(&record);
    status = more.status();
    if (more.ok() && !*more) break;
  }
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), Path("rows.parquet") + ":")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "malformed parquet record")) << status;

  options.skip_malformed = true;
  std::vector<Record> kept = ReadShard({Path("rows.parquet"), 0, 50, 1}, options);
  auto again = RecordReader::Open({Path("rows.parquet"), 0, 50, 1}, options);
  ASSERT_TRUE(again.ok());
  while (*(*again)->Next(&record)) {
  }
  EXPECT_GT((*again)->malformed_count(), 0);
  EXPECT_EQ(static_cast<int64_t>(kept.size()) + (*again)->malformed_count(), 50);
  for (const Record& r : kept) EXPECT_EQ(r.fields, expected_[r.offset]);
}

// Every micro-batch of one epoch, unshuffled.
std::vector<MicroBatch> Batches(const std::string& path, DataFormat format,
                                const std::vector<std::string>& inputs,
                                const std::vector<std::string>& outputs,
                                const Tokenizer* tokenizer, LoaderStats* stats, bool pairs = false) {
  auto shards = SplitFile(path, 1);
  EXPECT_TRUE(shards.ok()) << shards.status();
  LoaderOptions options;
  options.reader.format = format;
  options.reader.skip_malformed = true;
  options.example = pairs ? *PreferenceLayout(format, inputs, outputs, 96)
                          : *ExampleBuilder::OptionsFor(format, inputs, outputs, "", 96);
  options.batch = {3, 96, /*packing=*/!pairs, kByteEos, pairs};
  options.shuffle = false;
  auto loader = DataLoader::Create(*shards, tokenizer, options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  std::vector<MicroBatch> batches;
  if (!loader.ok()) return batches;
  while (true) {
    auto batch = (*loader)->Next();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok() || !*batch) break;
    batches.push_back(std::move(**batch));
  }
  *stats = (*loader)->stats();
  return batches;
}

TEST_F(ParquetTest, LoaderGivesTheSameExamplesAsTheSameRowsInJsonLines) {
  WriteByteTokenizer(dir_.path());
  auto tokenizer = LoadTokenizer(dir_.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  struct Layout {
    std::vector<std::string> inputs, outputs;
    bool pairs = false;
  };
  for (const Layout& layout : {Layout{{"instruction", "tags"}, {"output"}},  // instruction
                               Layout{{"messages"}, {}},                      // chat
                               Layout{{"instruction"}, {}},                  // text
                               Layout{{"instruction"}, {"output", "tags"}, true}}) {  // preference
    SCOPED_TRACE(layout.pairs ? "preference" : layout.inputs[0]);
    LoaderStats from_parquet, from_jsonl;
    std::vector<MicroBatch> a = Batches(Path("rows.parquet"), DataFormat::kParquet, layout.inputs,
                                        layout.outputs, tokenizer->get(), &from_parquet, layout.pairs);
    std::vector<MicroBatch> b = Batches(Path("rows.jsonl"), DataFormat::kJsonl, layout.inputs,
                                        layout.outputs, tokenizer->get(), &from_jsonl, layout.pairs);
    ASSERT_FALSE(a.empty());
    ASSERT_EQ(a.size(), b.size());
    if (layout.pairs) EXPECT_EQ(a[0].pairs, 3);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].input_ids, b[i].input_ids) << "micro-batch " << i;
      EXPECT_EQ(a[i].labels, b[i].labels) << "micro-batch " << i;
      EXPECT_EQ(a[i].position_ids, b[i].position_ids) << "micro-batch " << i;
      EXPECT_EQ(a[i].sequence_lengths, b[i].sequence_lengths) << "micro-batch " << i;
    }
    EXPECT_EQ(from_parquet.records, 50);
    EXPECT_EQ(from_parquet.malformed_records, from_jsonl.malformed_records);
    EXPECT_EQ(from_parquet.examples.examples, from_jsonl.examples.examples);
  }
}

}  // namespace
}  // namespace qlora::data
