// qlora-export-gguf MODEL_DIR OUT.gguf [--type f16|bf16|q8_0|f32]: a Hugging Face LLaMA, Mistral
// or Qwen2 folder (a job's merged model) as a GGUF file for llama.cpp and Ollama.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/program/program_flags.h"
#include "worker/export/gguf_export.h"

ABSL_FLAG(std::string, type, "f16", "the matrices' type: f16 | bf16 | q8_0 | f32 (norms stay f32)");
ABSL_FLAG(std::string, name, "", "general.name (default: the folder's name)");

int main(int argc, char** argv) {
  qlora::ProgramFlagsOptions program;
  program.program = "qlora-export-gguf";
  program.usage = "qlora-export-gguf MODEL_DIR OUT.gguf [--type f16|bf16|q8_0|f32]\n"
                  "Writes a Hugging Face LLaMA, Mistral or Qwen2 folder (a job's merged model) as GGUF.";
  program.flag_files = {"gguf_export_main.cc"};
  std::vector<char*> args = qlora::ParseProgramFlags(argc, argv, program);
  if (args.size() != 3) {
    std::cerr << "usage: qlora-export-gguf MODEL_DIR OUT.gguf [--type f16|bf16|q8_0|f32]\n";
    return 2;
  }
  absl::StatusOr<qlora::gguf::GgufType> type = qlora::gguf::ParseGgufType(absl::GetFlag(FLAGS_type));
  if (!type.ok()) {
    std::cerr << "qlora-export-gguf: --type: " << type.status().message() << "\n";
    return 2;
  }
  qlora::gguf::GgufExportOptions options;
  options.type = *type;
  options.name = absl::GetFlag(FLAGS_name);
  if (absl::Status s = qlora::gguf::ExportGguf(args[1], args[2], options); !s.ok()) {
    std::cerr << "qlora-export-gguf: " << s.message() << "\n";
    return 1;
  }
  std::cout << args[2] << "\n";
  return 0;
}
