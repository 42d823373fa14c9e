// Small helpers for the data-path tests: a temporary folder, file I/O, the reference Python.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/dataset/shard_planner.h"
#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace qlora::data {

using TempDir = ::qlora::testing::TempDir;  // tests/util/temp_dir.h
using ::qlora::testing::ReadFile;           // tests/util/files.h
using ::qlora::testing::WriteFile;          // tests/util/files.h

// Plan options that cut a file of `bytes` bytes into about `chunks` chunks.
inline ShardPlanOptions ChunksOf(int64_t bytes, int chunks) {
  ShardPlanOptions options;
  options.chunk_bytes = bytes / chunks + 1;
  return options;
}

// $QLORA_PYTHON, else the QLORA_PYTHON the build was configured with
// (tests/data_path/CMakeLists.txt compiles it in because the shared test helper's ENVIRONMENT
// property currently passes only its first variable); "" when neither names an existing file.
inline std::string ReferencePython() {
  const char* python = std::getenv("QLORA_PYTHON");
#ifdef QLORA_CONFIGURED_PYTHON
  if (python == nullptr || *python == '\0') python = QLORA_CONFIGURED_PYTHON;
#endif
  if (python == nullptr || *python == '\0' || !std::filesystem::exists(python)) return "";
  return python;
}

// What a reference script made for a test suite, once: `python <script and args> <dir>` writes
// its files and expected.json into a fresh folder, read as `Json` (nlohmann::json or
// ordered_json). Without a reference Python nothing runs (python is ""); a script that fails
// leaves `expected` null and `command` says what ran.
template <typename Json>
struct ReferenceRun {
  std::string python;
  std::string command;
  TempDir dir;
  std::unique_ptr<Json> expected;

  explicit ReferenceRun(const std::string& script_and_args) : python(ReferencePython()) {
    if (python.empty()) return;
    command = python + " " + script_and_args + " " + dir.path();
    if (std::system(command.c_str()) != 0) return;
    expected = std::make_unique<Json>(Json::parse(ReadFile(dir.path() + "/expected.json")));
  }
};

}  // namespace qlora::data

namespace qlora::data {

// Ids of the byte tokenizer that WriteByteTokenizer writes: byte b is id b, then these.
constexpr int kByteBos = 256, kByteEos = 257, kByteStartHeader = 258, kByteEndHeader = 259,
              kByteEot = 260;

// Writes a tokenizer.json whose ids are the raw bytes (no merges) plus LLaMA-3's chat tokens,
// and a tokenizer_config.json: deterministic ids for tests that need no reference Python.
inline void WriteByteTokenizer(const std::string& dir) {
  std::string vocab;
  int next = 0x100;
  for (int b = 0; b < 256; ++b) {
    // GPT-2 byte-level spelling: printable bytes as themselves, the rest from U+0100 up.
    bool itself = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    int cp = itself ? b : next++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 = std::string(1, static_cast<char>(cp));
    } else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    if (utf8 == "\"" || utf8 == "\\") utf8 = "\\" + utf8;
    vocab += (b ? "," : "") + std::string("\"") + utf8 + "\":" + std::to_string(b);
  }
  std::string added;
  const char* names[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                         "<|end_header_id|>", "<|eot_id|>"};
  for (int i = 0; i < 5; ++i)
    added += std::string(i ? "," : "") + "{\"id\":" + std::to_string(256 + i) +
             ",\"content\":\"" + names[i] + "\",\"special\":true}";
  WriteFile(dir + "/tokenizer.json",
            "{\"added_tokens\":[" + added + "],\"normalizer\":null,"
            "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
            "\"post_processor\":null,\"model\":{\"type\":\"BPE\",\"vocab\":{" + vocab +
            "},\"merges\":[]}}");
  WriteFile(dir + "/tokenizer_config.json",
            "{\"bos_token\":\"<|begin_of_text|>\",\"eos_token\":\"<|end_of_text|>\","
            "\"add_bos_token\":true}");
}

}  // namespace qlora::data
