// qlora_data_bench: tokens/s of one worker's data path (read, parse, tokenize, mask, pack),
// single-threaded, as a worker runs it.
//   qlora_data_bench --model_dir DIR [--data FILE] [--synthetic_mib 64] [--seq_len 2048]
//                    [--rows 8] [--no_packing] [--format auto]
// Without --data it writes a synthetic instruction/output JSONL file of the given size.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/data/data_loader.h"
#include "common/dataset/shard_planner.h"
#include "worker/data/shuffle.h"

namespace qlora::data {
namespace {

struct Args {
  std::string model_dir, data, format = "auto";
  int64_t synthetic_mib = 64;
  int seq_len = 2048, rows = 8;
  bool packing = true;
};

bool Parse(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (flag == "--model_dir") args->model_dir = value();
    else if (flag == "--data") args->data = value();
    else if (flag == "--format") args->format = value();
    else if (flag == "--synthetic_mib") args->synthetic_mib = std::atoll(value());
    else if (flag == "--seq_len") args->seq_len = std::atoi(value());
    else if (flag == "--rows") args->rows = std::atoi(value());
    else if (flag == "--no_packing") args->packing = false;
    else return false;
  }
  return !args->model_dir.empty();
}

// Instruction/output records of pseudo-English with numbers, punctuation and some code.
std::string WriteSynthetic(int64_t mib) {
  static const char* kWords[] = {
      "the", "model", "learns", "from", "data", "and", "then", "answers", "questions", "about",
      "history", "science", "code", "function", "return", "value", "because", "however",
      "training", "GPU", "memory", "tokens", "per", "second", "quickly", "(x)", "{y}", "42",
      "3.14", "2024", "don't", "it's", "naïve", "café", "日本", "données", "→", "—"};
  const std::string path =
      (std::filesystem::temp_directory_path() / "qlora_data_bench.jsonl").string();
  std::ofstream out(path);
  Rng rng(1);
  int64_t written = 0;
  while (written < (mib << 20)) {
    std::string instruction, output;
    for (int n = 20 + rng.Below(60); n > 0; --n)
      instruction += std::string(kWords[rng.Below(std::size(kWords))]) + (rng.Below(9) ? " " : ". ");
    for (int n = 40 + rng.Below(200); n > 0; --n)
      output += std::string(kWords[rng.Below(std::size(kWords))]) + (rng.Below(11) ? " " : ",\\n");
    std::string line = "{\"instruction\": \"" + instruction + "\", \"output\": \"" + output + "\"}\n";
    out << line;
    written += static_cast<int64_t>(line.size());
  }
  return path;
}

int Run(const Args& args) {
  const std::string path = args.data.empty() ? WriteSynthetic(args.synthetic_mib) : args.data;
  auto tokenizer = LoadTokenizer(args.model_dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  auto format = ResolveFormat(args.format, path);
  ShardPlanOptions plan_options;
  plan_options.format = ParseEnumName<DatasetFormat>(args.format).value_or(DatasetFormat::kAuto);
  auto shards = SplitFile(path, 1, plan_options);
  if (!format.ok() || !shards.ok()) {
    std::fprintf(stderr, "cannot plan %s\n", path.c_str());
    return 1;
  }
  LoaderOptions options;
  options.reader.format = *format;
  auto example = ExampleBuilder::OptionsFor(*format, {"instruction"}, {"output"}, "", args.seq_len);
  options.example = *example;
  const SpecialTokens& special = (*tokenizer)->special();
  options.batch = {args.rows, args.seq_len, args.packing,
                   special.pad_id >= 0 ? special.pad_id : special.eos_id};
  auto loader = DataLoader::Create(*shards, tokenizer->get(), options);
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loader.status().message()).c_str());
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    auto batch = (*loader)->Next();
    if (!batch.ok()) {
      std::fprintf(stderr, "%s\n", std::string(batch.status().message()).c_str());
      return 1;
    }
    if (!*batch) break;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const LoaderStats& stats = (*loader)->stats();
  const double bytes = static_cast<double>(std::filesystem::file_size(path));
  std::printf("tokenizer        %s (vocab %d)\n", (*tokenizer)->kind().c_str(),
              (*tokenizer)->vocab_size());
  std::printf("data             %s (%.1f MiB)\n", path.c_str(), bytes / (1 << 20));
  std::printf("records          %lld (%lld truncated)\n", static_cast<long long>(stats.records),
              static_cast<long long>(stats.examples.truncated));
  std::printf("micro-batches    %lld of %d x %d (%s)\n",
              static_cast<long long>(stats.micro_batches), args.rows, args.seq_len,
              args.packing ? "packed" : "padded");
  std::printf("tokens           %lld (%.1f%% of slots)\n", static_cast<long long>(stats.tokens),
              100.0 * stats.tokens / std::max<int64_t>(1, stats.micro_batches * args.rows * args.seq_len));
  std::printf("seconds          %.3f\n", seconds);
  std::printf("tokens/s/worker  %.0f\n", stats.tokens / seconds);
  std::printf("MiB/s            %.1f\n", bytes / (1 << 20) / seconds);
  if (args.data.empty()) std::filesystem::remove(path);
  return 0;
}

}  // namespace
}  // namespace qlora::data

int main(int argc, char** argv) {
  qlora::data::Args args;
  if (!qlora::data::Parse(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: qlora_data_bench --model_dir DIR [--data FILE] [--synthetic_mib N] "
                 "[--seq_len N] [--rows N] [--no_packing] [--format auto|jsonl|csv|text]\n");
    return 2;
  }
  return qlora::data::Run(args);
}
