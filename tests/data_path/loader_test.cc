// The per-rank loader: every record exactly once per epoch over 1..4 ranks, deterministic
// shuffling that changes per epoch, the validation split, the equal-steps plan, malformed
// records through the whole path, and flat peak memory while streaming files far larger than
// the memory the process is allowed.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/data_path/test_util.h"
#include "worker/data/data_loader.h"
#include "worker/data/job_data_options.h"
#include "common/dataset/shard_planner.h"

namespace qlora::data {
namespace {

// A JSONL file of n records {"instruction": "q<i> ...", "output": "a<i>"}.
std::string WriteJsonl(const std::string& dir, const std::string& name, int n, int pad = 0) {
  std::string path = dir + "/" + name;
  std::ofstream out(path);
  for (int i = 0; i < n; ++i)
    out << "{\"instruction\": \"q" << i << " " << std::string(pad + i % 7, 'x')
        << "\", \"output\": \"a" << i << "\"}\n";
  return path;
}

LoaderOptions Options(bool packing, int rows = 4, int seq_len = 64) {
  LoaderOptions options;
  options.reader.format = DataFormat::kJsonl;
  options.example = *ExampleBuilder::OptionsFor(DataFormat::kJsonl, {"instruction"}, {"output"},
                                                "{instruction}|", seq_len);
  options.batch = {rows, seq_len, packing, kByteEos};
  options.shuffle_buffer_records = 16;
  return options;
}

// The instructions of every example of every micro-batch, in order.
std::vector<std::string> Epoch(DataLoader& loader, int64_t epoch) {
  EXPECT_TRUE(loader.StartEpoch(epoch).ok());
  std::vector<std::string> seen;
  while (true) {
    auto batch = loader.Next();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok() || !*batch) break;
    const MicroBatch& b = **batch;
    for (int r = 0; r < b.rows; ++r) {
      int at = r * b.seq_len;
      for (int32_t len : b.sequence_lengths[r]) {
        std::string text;
        for (int i = 1; i < len && b.input_ids[at + i] != '|'; ++i)
          text.push_back(static_cast<char>(b.input_ids[at + i]));
        seen.push_back(text);
        at += len;
      }
    }
  }
  return seen;
}

class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteByteTokenizer(dir_.path());
    tokenizer_ = std::move(*LoadTokenizer(dir_.path()));
  }
  TempDir dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(DataLoaderTest, EveryRecordOncePerEpochForOneToFourRanks) {
  std::string path = WriteJsonl(dir_.path(), "train.jsonl", 301);
  for (bool packing : {false, true}) {
    for (int world = 1; world <= 4; ++world) {
      auto plan = PlanShards({path}, world, ChunksOf(ReadFile(path).size(), 3));
      ASSERT_TRUE(plan.ok());
      for (int64_t epoch : {0, 1}) {
        std::multiset<std::string> all;
        std::vector<int64_t> records;
        for (int rank = 0; rank < world; ++rank) {
          LoaderOptions options = Options(packing);
          options.rank = rank;
          auto loader = DataLoader::Create((*plan)[rank], tokenizer_.get(), options);
          ASSERT_TRUE(loader.ok()) << loader.status();
          for (const std::string& s : Epoch(**loader, epoch)) all.insert(s);
          records.push_back((*loader)->stats().records);
        }
        ASSERT_EQ(all.size(), 301u) << "world " << world;
        // The interleaving index runs across the (shuffled, shared) chunk order: at most one
        // record apart over the whole epoch, not one per chunk.
        EXPECT_LE(*std::max_element(records.begin(), records.end()) -
                      *std::min_element(records.begin(), records.end()), 1)
            << "world " << world;
        for (int i = 0; i < 301; ++i)
          EXPECT_EQ(all.count(absl::StrCat("q", i, " ", std::string(i % 7, 'x'))), 1u) << i;
      }
    }
  }
}

TEST_F(DataLoaderTest, ShuffleIsDeterministicPerSeedAndChangesPerEpoch) {
  std::string path = WriteJsonl(dir_.path(), "train.jsonl", 200);
  auto shards = SplitFile(path, 4);
  ASSERT_TRUE(shards.ok());
  auto a = DataLoader::Create(*shards, tokenizer_.get(), Options(true));
  auto b = DataLoader::Create(*shards, tokenizer_.get(), Options(true));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::string> a0 = Epoch(**a, 0), a1 = Epoch(**a, 1), b0 = Epoch(**b, 0);
  EXPECT_EQ(a0, b0);
  EXPECT_NE(a0, a1);
  EXPECT_EQ(Epoch(**a, 0), a0);  // an epoch replays exactly
  LoaderOptions other_seed = Options(true);
  other_seed.seed = 7;
  auto c = DataLoader::Create(*shards, tokenizer_.get(), other_seed);
  EXPECT_NE(Epoch(**c, 0), a0);
  LoaderOptions ordered = Options(false);
  ordered.shuffle = false;
  auto d = DataLoader::Create(*shards, tokenizer_.get(), ordered);
  std::vector<std::string> in_order = Epoch(**d, 0);
  ASSERT_EQ(in_order.size(), 200u);
  EXPECT_EQ(in_order[0], "q0 ");
  EXPECT_EQ(in_order[199], absl::StrCat("q199 ", std::string(199 % 7, 'x')));
}

TEST_F(DataLoaderTest, ValidationSplitIsDisjointAndCoversEverything) {
  std::string path = WriteJsonl(dir_.path(), "train.jsonl", 1000);
  auto shards = SplitFile(path, 3);
  std::multiset<std::string> train, validation;
  for (SplitRole role : {SplitRole::kTrain, SplitRole::kValidation}) {
    LoaderOptions options = Options(false);
    options.split = role;
    options.validation_fraction = 0.1;
    auto loader = DataLoader::Create(*shards, tokenizer_.get(), options);
    for (const std::string& s : Epoch(**loader, 0))
      (role == SplitRole::kTrain ? train : validation).insert(s);
  }
  EXPECT_EQ(train.size() + validation.size(), 1000u);
  EXPECT_GT(validation.size(), 60u);
  EXPECT_LT(validation.size(), 140u);
  for (const std::string& s : validation) EXPECT_EQ(train.count(s), 0u) << s;
}

TEST(DataEpochPlanTest, EveryRankRunsTheSameStepsAndTheRemainderIsCounted) {
  auto plan = PlanEpoch({10, 7, 9}, 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->optimizer_steps, 3);
  EXPECT_EQ(plan->micro_batches_per_rank, 6);
  EXPECT_EQ(plan->dropped_micro_batches, (std::vector<int64_t>{4, 1, 3}));
  auto starved = PlanEpoch({10, 1}, 2);
  ASSERT_FALSE(starved.ok());
  EXPECT_NE(std::string(starved.status().message()).find("rank 1"), std::string::npos);
}

// data.test_fraction (Ludwig's third split probability): those records are held out, read
// neither as training nor as validation data, and the test share of a validation file is none.
TEST_F(DataLoaderTest, TestShareIsHeldOutOfTrainingAndValidation) {
  std::string path = WriteJsonl(dir_.path(), "train.jsonl", 1000);
  auto shards = SplitFile(path, 3);
  std::multiset<std::string> train, validation, train_without_test;
  for (SplitRole role : {SplitRole::kTrain, SplitRole::kValidation}) {
    LoaderOptions options = Options(false);
    options.split = role;
    options.validation_fraction = 0.1;
    options.test_fraction = 0.2;
    auto loader = DataLoader::Create(*shards, tokenizer_.get(), options);
    ASSERT_TRUE(loader.ok()) << loader.status();
    for (const std::string& s : Epoch(**loader, 0))
      (role == SplitRole::kTrain ? train : validation).insert(s);
  }
  LoaderOptions no_test = Options(false);
  no_test.split = SplitRole::kTrain;
  no_test.validation_fraction = 0.1;
  auto plain = DataLoader::Create(*shards, tokenizer_.get(), no_test);
  for (const std::string& s : Epoch(**plain, 0)) train_without_test.insert(s);
  const size_t held_out = 1000 - train.size() - validation.size();
  EXPECT_GT(held_out, 140u);
  EXPECT_LT(held_out, 260u);
  for (const std::string& s : validation) EXPECT_EQ(train.count(s), 0u) << s;
  // The test share comes out of training: every training record is one without a test share.
  for (const std::string& s : train) EXPECT_EQ(train_without_test.count(s), 1u) << s;
  EXPECT_EQ(train_without_test.size(), train.size() + held_out);

  JobConfig job;
  job.input_features = {{"instruction", "text"}};
  job.output_features = {{"output", "text"}};
  job.data.train_path = "/data/train.jsonl";
  job.data.test_fraction = 0.2;
  auto options = LoaderOptionsForJob(job, *tokenizer_, DatasetRole::kTrain, 0);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->test_fraction, 0.2);
  job.data.validation_path = "/data/val.jsonl";
  options = LoaderOptionsForJob(job, *tokenizer_, DatasetRole::kValidation, 0);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->test_fraction, 0.0);  // a validation file is read whole
}

TEST_F(DataLoaderTest, CountMatchesTheEpochAndFeedsThePlan) {
  std::string path = WriteJsonl(dir_.path(), "train.jsonl", 500);
  auto plan = PlanShards({path}, 3);
  std::vector<int64_t> counts;
  for (int rank = 0; rank < 3; ++rank) {
    LoaderOptions options = Options(true);
    options.rank = rank;
    auto loader = DataLoader::Create((*plan)[rank], tokenizer_.get(), options);
    auto count = CountMicroBatches(**loader, 1);
    ASSERT_TRUE(count.ok());
    EXPECT_EQ(count->micro_batches, (*loader)->stats().micro_batches);
    EXPECT_EQ(count->records, (*loader)->stats().records);
    counts.push_back(count->micro_batches);
  }
  auto epoch = PlanEpoch(counts, 2);
  ASSERT_TRUE(epoch.ok());
  EXPECT_GE(epoch->optimizer_steps, 1);
}

TEST_F(DataLoaderTest, MalformedRecordsFailOrAreCountedThroughThePipeline) {
  std::string path = dir_.path() + "/bad.jsonl";
  WriteFile(path, "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\"}\n"
                  "{\"instruction\": \"c\", \"output\": \"d\"}\nnot json\n");
  auto shards = SplitFile(path, 1);
  // The first error met fails the job: the missing output of line 2 (the builder) comes
  // before the reader reaches line 4 when records are not shuffled.
  LoaderOptions fail = Options(false);
  fail.shuffle = false;
  auto failing = DataLoader::Create(*shards, tokenizer_.get(), fail);
  ASSERT_TRUE(failing.ok());
  absl::Status status;
  while (true) {
    auto batch = (*failing)->Next();
    if (!batch.ok()) {
      status = batch.status();
      break;
    }
    if (!*batch) break;
  }
  EXPECT_NE(std::string(status.message()).find(path + ":2: malformed record: missing column 'output'"),
            std::string::npos) << status;
  LoaderOptions skip = Options(false);
  skip.reader.skip_malformed = true;
  auto skipping = DataLoader::Create(*shards, tokenizer_.get(), skip);
  EXPECT_EQ(Epoch(**skipping, 0).size(), 2u);
  EXPECT_EQ((*skipping)->stats().malformed_records, 2);
  EXPECT_EQ((*skipping)->stats().malformed_messages.size(), 2u);
}

TEST_F(DataLoaderTest, JobConfigBecomesLoaderOptions) {
  JobConfig job;
  job.input_features = {{"instruction", "text"}};
  job.output_features = {{"output", "text"}};
  job.data.train_path = "/data/train.csv";
  job.data.validation_fraction = 0.05;
  job.data.packing = true;
  job.data.max_sequence_length = 1024;
  job.data.malformed_records = MalformedRecords::kSkip;
  job.trainer.batch_size = 4;
  job.trainer.eval_batch_size = 2;
  job.trainer.seed = 9;
  auto train = LoaderOptionsForJob(job, *tokenizer_, DatasetRole::kTrain, 3);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->reader.format, DataFormat::kCsv);
  EXPECT_TRUE(train->reader.skip_malformed);
  EXPECT_EQ(train->reader.max_record_bytes, 1 << 20);  // rows of 1024 tokens: the least bound
  EXPECT_EQ(train->example.layout, ExampleLayout::kInstruction);
  EXPECT_EQ(train->example.output_column, "output");
  EXPECT_EQ(train->batch.rows, 4);
  EXPECT_EQ(train->batch.seq_len, 1024);
  EXPECT_TRUE(train->batch.packing);
  EXPECT_EQ(train->batch.pad_id, kByteEos);  // no pad token: EOS pads
  EXPECT_EQ(train->seed, 9u);
  EXPECT_EQ(train->rank, 3);
  EXPECT_TRUE(train->shuffle);
  EXPECT_EQ(train->split, SplitRole::kTrain);
  auto validation = LoaderOptionsForJob(job, *tokenizer_, DatasetRole::kValidation, 0);
  ASSERT_TRUE(validation.ok());
  EXPECT_EQ(validation->split, SplitRole::kValidation);
  EXPECT_EQ(validation->batch.rows, 2);
  EXPECT_FALSE(validation->shuffle);
  job.data.validation_path = "/data/val.jsonl";
  EXPECT_EQ(DatasetPathForRole(job, DatasetRole::kValidation), "/data/val.jsonl");
  validation = LoaderOptionsForJob(job, *tokenizer_, DatasetRole::kValidation, 0);
  EXPECT_EQ(validation->reader.format, DataFormat::kJsonl);
  EXPECT_EQ(validation->split, SplitRole::kAll);
  // Rows of 400,000 tokens read records up to 16 bytes a token: one record fills a row.
  job.data.max_sequence_length = 400000;
  train = LoaderOptionsForJob(job, *tokenizer_, DatasetRole::kTrain, 0);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->reader.max_record_bytes, int64_t{16} * 400000);
}

// Peak RSS (KiB) of a child that streams `path` through the whole pipeline under an address
// space limit of its current size + `headroom_mib`; -1 if the child failed.
long StreamInChild(const std::string& model_dir, const std::string& path, long headroom_mib) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto tokenizer = LoadTokenizer(model_dir);
    auto shards = SplitFile(path, 1);
    if (!tokenizer.ok() || !shards.ok()) _exit(2);
    auto loader = DataLoader::Create(*shards, tokenizer->get(), Options(true, 8, 1024));
    if (!loader.ok()) _exit(3);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    struct rlimit limit;
    limit.rlim_cur = limit.rlim_max =
        static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (headroom_mib << 20);
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(4);
    int64_t tokens = 0;
    while (true) {
      auto batch = (*loader)->Next();
      if (!batch.ok()) _exit(5);
      if (!*batch) break;
      tokens += (*batch)->num_tokens;
    }
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    long result[2] = {usage.ru_maxrss, static_cast<long>(tokens)};
    if (write(fds[1], result, sizeof(result)) != sizeof(result)) _exit(6);
    _exit(tokens > 0 ? 0 : 7);
  }
  close(fds[1]);
  long result[2] = {-1, 0};
  ssize_t got = read(fds[0], result, sizeof(result));
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (got != sizeof(result) || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    ADD_FAILURE() << "child status " << wstatus << " (exit " << WEXITSTATUS(wstatus) << ")";
    return -1;
  }
  return result[0];
}

TEST_F(DataLoaderTest, StreamingMemoryStaysFlatAsTheFileGrows) {
  // 24 MiB and 96 MiB files, streamed under an address-space allowance of 48 MiB above the
  // process's size at the start: the larger file is twice that allowance.
  std::string small = WriteJsonl(dir_.path(), "small.jsonl", 24 * 1024 * 1024 / 640, 580);
  std::string large = WriteJsonl(dir_.path(), "large.jsonl", 96 * 1024 * 1024 / 640, 580);
  long small_kib = StreamInChild(dir_.path(), small, 48);
  long large_kib = StreamInChild(dir_.path(), large, 48);
  ASSERT_GT(small_kib, 0) << "the child failed on the small file";
  ASSERT_GT(large_kib, 0) << "the child failed on the large file (out of its allowance?)";
  RecordProperty("peak_rss_kib_24mib_file", std::to_string(small_kib));
  RecordProperty("peak_rss_kib_96mib_file", std::to_string(large_kib));
  // Peak RSS of the whole process (test binary included) is far below the file, and does
  // not grow with it (4 MiB of slack for allocator noise).
  EXPECT_LT(large_kib, 96 * 1024 / 2);
  EXPECT_LT(large_kib - small_kib, 4 * 1024) << small_kib << " KiB vs " << large_kib << " KiB";
}


// Issue 16: 214 records, one with a 20,000-character field. With byte-balanced shards, 2 ranks
// trained 1 step per epoch where 1 rank trained 26 (~16 of 214 records). With interleaved
// records every world size trains, per epoch, the one-rank count to within one micro-batch
// per rank, and what was not trained is counted (left over, without a target).
TEST_F(DataLoaderTest, SkewedRecordsTrainAboutTheSameCountOnOneToThreeRanks) {
  const std::string path = dir_.path() + "/skewed.jsonl";
  {
    std::ofstream out(path);
    for (int i = 0; i < 214; ++i)
      out << "{\"instruction\": \"" << (i == 100 ? std::string(20000, 'x') : absl::StrCat("q", i))
          << "\", \"output\": \"a" << i << "\"}\n";
  }
  const int rows = 2;
  for (int accumulation : {1, 2}) {
  std::map<int, int64_t> trained_by_world;
  for (int world = 1; world <= 3; ++world) {
    SCOPED_TRACE(absl::StrCat("world ", world, ", accumulation ", accumulation));
    auto plan = PlanShards({path}, world);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<std::unique_ptr<DataLoader>> loaders;
    std::vector<EpochCount> counts;
    std::vector<int64_t> micro_batches;
    for (int rank = 0; rank < world; ++rank) {
      LoaderOptions options = Options(/*packing=*/false, rows, 32);
      options.rank = rank;
      auto loader = DataLoader::Create((*plan)[rank], tokenizer_.get(), options);
      ASSERT_TRUE(loader.ok()) << loader.status();
      auto count = CountMicroBatches(**loader, 0);
      ASSERT_TRUE(count.ok()) << count.status();
      counts.push_back(*count);
      micro_batches.push_back(count->micro_batches);
      loaders.push_back(std::move(*loader));
    }
    auto epoch = PlanEpoch(micro_batches, accumulation);
    ASSERT_TRUE(epoch.ok()) << epoch.status();
    int64_t trained = 0, left_over = 0, records = 0;
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(loaders[rank]->StartEpoch(0).ok());
      int64_t mine = 0;
      for (int64_t i = 0; i < epoch->micro_batches_per_rank; ++i) {
        auto batch = loaders[rank]->Next();
        ASSERT_TRUE(batch.ok() && batch->has_value());
        mine += (*batch)->num_examples;
      }
      trained += mine;
      left_over += counts[rank].examples - mine;
      records += counts[rank].records;
      EXPECT_EQ(counts[rank].records, 214 / world + (rank < 214 % world ? 1 : 0)) << rank;
    }
    EXPECT_EQ(records, 214);
    // Every record is trained, left over, or without a target (the long one: its prompt fills
    // the sequence and truncation leaves no target).
    int64_t without_target = 0;
    for (const EpochCount& c : counts) without_target += c.without_target;
    EXPECT_EQ(without_target, 1);
    EXPECT_EQ(trained + left_over + without_target, 214);
    trained_by_world[world] = trained;
    // Within one micro-batch per rank; with accumulation, whole steps: one step per rank.
    const int64_t bound = static_cast<int64_t>(world) * rows * accumulation;
    EXPECT_LE(trained_by_world[1] - trained, bound)
        << trained << " trained on " << world << " ranks, " << trained_by_world[1] << " on one";
    EXPECT_GE(trained_by_world[1] - trained, -bound);
  }
  }
}

}  // namespace
}  // namespace qlora::data
