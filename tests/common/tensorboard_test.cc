// The TensorBoard event writer against tensorboard itself: scalars written per step are what
// tensorboard's EventAccumulator reads back (tag, step, value); CRC-32C against known vectors.
#include "common/tensorboard/event_file_writer.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/tensorboard/crc32c.h"
#include "common/tensorboard/hparams_summary.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/temp_dir.h"

namespace qlora::tensorboard {
namespace {

TEST(CommonTensorboard, Crc32cMatchesKnownVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(""), 0u);
}

std::string RunAndCapture(const std::string& command) {
  std::string out;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

// tests/common/read_events.py under the reference Python (tensorboard's own reader), "" when the
// environment names none.
std::string ReadEventsCommand() {
  const char* python = std::getenv("QLORA_PYTHON");
  const char* source = std::getenv("QLORA_SOURCE_DIR");
  if (python == nullptr || *python == '\0' || source == nullptr) return "";
  return std::string("'") + python + "' '" + source + "/tests/common/read_events.py'";
}

TEST(CommonTensorboard, TensorboardReadsEveryScalarBack) {
  const std::string read_events = ReadEventsCommand();
  if (read_events.empty()) GTEST_SKIP() << "QLORA_PYTHON / QLORA_SOURCE_DIR not set: no tensorboard reference";
  qlora::testing::TempDir dir;
  {
    EventFileOptions options;
    options.wall_time = 1.7e9;
    options.host = "test-host";
    options.pid = 42;
    auto writer = EventFileWriter::Open(dir.path() + "/runs", options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_NE((*writer)->path().find("events.out.tfevents.1700000000.test-host.42.0"), std::string::npos);
    for (int step = 1; step <= 300; ++step) {
      ASSERT_TRUE((*writer)
                      ->AddScalars(step, 1.7e9 + step,
                                   {{"train/loss", 3.0f / step}, {"train/learning_rate", 1e-4f * step}})
                      .ok());
    }
    ASSERT_TRUE((*writer)->AddScalars(300, 1.7e9 + 301, {{"eval/loss", 0.25f}}).ok());
  }
  // A second writer in the same folder makes a second file, never overwriting the first.
  {
    EventFileOptions options;
    options.wall_time = 1.7e9;
    options.host = "test-host";
    options.pid = 42;
    auto again = EventFileWriter::Open(dir.path() + "/runs", options);
    ASSERT_TRUE(again.ok());
    EXPECT_NE((*again)->path().find(".42.1"), std::string::npos);
  }
  const std::string out = RunAndCapture(read_events + " '" + dir.path() + "/runs'");
  const auto scalars = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(scalars.is_object()) << out;
  ASSERT_EQ(scalars["train/loss"].size(), 300u) << out.substr(0, 500);
  EXPECT_EQ(scalars["train/loss"][0][0], 1);
  EXPECT_FLOAT_EQ(scalars["train/loss"][0][1].get<float>(), 3.0f);
  EXPECT_EQ(scalars["train/loss"][299][0], 300);
  EXPECT_FLOAT_EQ(scalars["train/loss"][299][1].get<float>(), 0.01f);
  EXPECT_FLOAT_EQ(scalars["train/learning_rate"][9][1].get<float>(), 1e-3f);
  ASSERT_EQ(scalars["eval/loss"].size(), 1u);
  EXPECT_FLOAT_EQ(scalars["eval/loss"][0][1].get<float>(), 0.25f);
}

// The hparams plugin reads the experiment (names and types, metrics), the run's values and its
// end status back with its own parser, so runs compare in TensorBoard's HParams tab.
TEST(CommonTensorboard, TheHparamsPluginReadsTheRunsHyperparameters) {
  const std::string read_events = ReadEventsCommand();
  if (read_events.empty()) GTEST_SKIP() << "QLORA_PYTHON / QLORA_SOURCE_DIR not set: no tensorboard reference";
  qlora::testing::TempDir dir;
  {
    EventFileOptions options;
    options.wall_time = 1.7e9;
    auto writer = EventFileWriter::Open(dir.path() + "/runs", options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const std::vector<HParam> hparams = {{"trainer.learning_rate", 2e-4},
                                         {"adapter.target_modules", std::string("q_proj,v_proj")},
                                         {"data.packing", true}};
    ASSERT_TRUE((*writer)->AddSummary(0, 1.7e9, HParamsExperimentSummary(hparams, {"train/loss", "eval/loss"}, 1.7e9)).ok());
    ASSERT_TRUE((*writer)->AddSummary(0, 1.7e9, HParamsSessionStartSummary(hparams, 1.7e9)).ok());
    ASSERT_TRUE((*writer)->AddScalars(1, 1.7e9 + 1, {{"train/loss", 2.5f}}).ok());
    ASSERT_TRUE((*writer)->AddSummary(1, 1.7e9 + 2, HParamsSessionEndSummary(true, 1.7e9 + 2)).ok());
  }
  const std::string out = RunAndCapture(read_events + " '" + dir.path() + "/runs' --hparams");
  const auto read = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(read.is_object()) << out;
  EXPECT_EQ(read["experiment"]["hparams"]["trainer.learning_rate"], "DATA_TYPE_FLOAT64") << out;
  EXPECT_EQ(read["experiment"]["hparams"]["adapter.target_modules"], "DATA_TYPE_STRING") << out;
  EXPECT_EQ(read["experiment"]["hparams"]["data.packing"], "DATA_TYPE_BOOL") << out;
  EXPECT_EQ(read["experiment"]["metrics"], nlohmann::json({"train/loss", "eval/loss"})) << out;
  EXPECT_DOUBLE_EQ(read["start"]["trainer.learning_rate"].get<double>(), 2e-4) << out;
  EXPECT_EQ(read["start"]["adapter.target_modules"], "q_proj,v_proj") << out;
  EXPECT_EQ(read["start"]["data.packing"], true) << out;
  EXPECT_EQ(read["end"], "STATUS_SUCCESS") << out;
}

// Evaluation samples as the TEXT tab shows them: tensorboard's reader gives each step's markdown
// back under its tag, unicode included.
TEST(CommonTensorboard, TheTextPluginReadsSamplesBack) {
  const std::string read_events = ReadEventsCommand();
  if (read_events.empty()) GTEST_SKIP() << "QLORA_PYTHON / QLORA_SOURCE_DIR not set: no tensorboard reference";
  qlora::testing::TempDir dir;
  {
    EventFileOptions options;
    options.wall_time = 1.7e9;
    auto writer = EventFileWriter::Open(dir.path() + "/runs", options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (int step : {10, 20}) {
      const std::string text = "**prompt:** Name a colour.\n\n**output:** bleu \u00e9t\u00e9 " + std::to_string(step);
      ASSERT_TRUE((*writer)->AddSummary(step, 1.7e9 + step, TextSummary("eval/sample_1", text)).ok());
    }
  }
  const std::string out = RunAndCapture(read_events + " '" + dir.path() + "/runs' --text");
  const auto texts = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(texts.is_object()) << out;
  ASSERT_EQ(texts["eval/sample_1"].size(), 2u) << out;
  EXPECT_EQ(texts["eval/sample_1"][1][0], 20);
  EXPECT_EQ(texts["eval/sample_1"][1][1], "**prompt:** Name a colour.\n\n**output:** bleu \u00e9t\u00e9 20");
}

}  // namespace
}  // namespace qlora::tensorboard
