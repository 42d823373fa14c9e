// RunGeneration: model, adapter, tokenizer and prompts for a generation session, and the text
// streamed piece by piece (held back where a stop string or a multi-byte character may still
// be forming).
#include "worker/run/generation_run.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/text/utf8.h"
#include "worker/data/generation_prompt.h"
#include "worker/data/tokenizer.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/peft_io.h"
#include "worker/run/run_options.h"

namespace qlora::worker {
namespace {

// generation_config.json of the base model, as a GenerationConfig and its eos ids (empty when
// the folder has none).
GenerationConfig ModelGenerationConfig(const std::string& model_dir, std::vector<int64_t>* eos_ids) {
  GenerationConfig config;
  std::ifstream in(model_dir + "/generation_config.json");
  if (!in) return config;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return config;
  auto number = [&](const char* key) -> std::optional<double> {
    if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
    return std::nullopt;
  };
  auto integer = [&](const char* key) -> std::optional<int64_t> {
    if (j.contains(key) && j[key].is_number_integer()) return j[key].get<int64_t>();
    return std::nullopt;
  };
  config.temperature = number("temperature");
  config.top_p = number("top_p");
  config.repetition_penalty = number("repetition_penalty");
  config.top_k = integer("top_k");
  config.max_new_tokens = integer("max_new_tokens");
  if (j.contains("do_sample") && j["do_sample"].is_boolean()) config.do_sample = j["do_sample"].get<bool>();
  if (j.contains("eos_token_id")) {
    const nlohmann::json& eos = j["eos_token_id"];
    if (eos.is_number_integer()) eos_ids->push_back(eos.get<int64_t>());
    if (eos.is_array()) {
      for (const auto& id : eos) {
        if (id.is_number_integer()) eos_ids->push_back(id.get<int64_t>());
      }
    }
  }
  return config;
}

template <typename T>
void Overlay(std::optional<T>* into, const std::optional<T>& from) {
  if (from.has_value()) *into = from;
}

GenerationConfig Layered(const std::vector<const GenerationConfig*>& lowest_first) {
  GenerationConfig out;
  for (const GenerationConfig* g : lowest_first) {
    Overlay(&out.temperature, g->temperature);
    Overlay(&out.top_p, g->top_p);
    Overlay(&out.repetition_penalty, g->repetition_penalty);
    Overlay(&out.max_new_tokens, g->max_new_tokens);
    Overlay(&out.min_new_tokens, g->min_new_tokens);
    Overlay(&out.top_k, g->top_k);
    Overlay(&out.num_beams, g->num_beams);
    Overlay(&out.do_sample, g->do_sample);
  }
  return out;
}

// Where text[0, end) may be sent now: not into a stop string that may still be forming (its
// longest length less one held back) nor into a character whose bytes are not all there.
size_t SafeEnd(const std::string& text, size_t longest_stop) {
  size_t end = text.size() - std::min(text.size(), longest_stop > 0 ? longest_stop - 1 : 0);
  while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  // A character whose bytes are not all there yet (a byte-level token ends inside it), or that
  // a decoder shows as U+FFFD until they are: wait for the next tokens.
  const size_t invalid = FirstInvalidUtf8(std::string_view(text).substr(0, end));
  if (invalid != std::string::npos && invalid + 4 > end) end = invalid;
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  if (end == text.size() && text.size() >= 3 && text.compare(text.size() - 3, 3, kReplacement) == 0) end -= 3;
  return end;
}

}  // namespace

std::vector<int64_t> EndOfSequenceIds(const engine::LlamaConfig& config, const data::Tokenizer& tokenizer,
                                      bool end_of_turn) {
  std::vector<int64_t> ids = {config.eos_token_id};
  for (const int32_t id : {tokenizer.special().eos_id, end_of_turn ? tokenizer.TokenToId("<|eot_id|>") : -1}) {
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<engine::GenerationOptions> ResolveGenerationOptions(const GenerationRequest& request,
                                                                   const std::vector<int64_t>& eos_ids) {
  std::vector<int64_t> model_eos;
  const GenerationConfig model = ModelGenerationConfig(request.job.base_model_path, &model_eos);
  const GenerationConfig g = Layered({&model, &request.job.generation, &request.parameters});
  if (g.num_beams.value_or(1) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation.num_beams is ", *g.num_beams, ": beam search is not supported; use 1"));
  }
  engine::GenerationOptions options;
  options.max_new_tokens = g.max_new_tokens.value_or(256);
  options.min_new_tokens = g.min_new_tokens.value_or(0);
  options.sampling.do_sample = g.do_sample.value_or(false);
  // Temperature 0 is greedy decoding (transformers ignores temperature without sampling): a 0
  // turns off sampling that only the model's generation_config.json asks for (chat models ship
  // do_sample: true). Sampling the job or the request asks for stays, and the engine refuses it.
  if (g.temperature == 0.0 && !request.job.generation.do_sample && !request.parameters.do_sample) {
    options.sampling.do_sample = false;
  }
  options.sampling.temperature = g.temperature.value_or(1.0);
  options.sampling.top_k = g.top_k.value_or(50);
  options.sampling.top_p = g.top_p.value_or(1.0);
  options.sampling.repetition_penalty = g.repetition_penalty.value_or(1.0);
  options.sampling.seed = request.seed.value_or(0);
  options.eos_token_ids = model_eos.empty() ? eos_ids : model_eos;
  for (int64_t id : eos_ids) {
    if (std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), id) ==
        options.eos_token_ids.end()) {
      options.eos_token_ids.push_back(id);
    }
  }
  return options;
}

absl::Status RunGeneration(const GenerationRequest& request, const std::string& device_name,
                           const PieceSink& emit) {
  const at::Device device(device_name == "cuda" ? at::kCUDA : at::kCPU);
  const JobConfig& job = request.job;
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<engine::LlamaForCausalLM> model,
                         engine::LoadLlama(job.base_model_path, LoadOptionsFor(job, device)));
  QLORA_RETURN_IF_ERROR(engine::LoadAdapter(model.get(), request.adapter_dir));
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer, data::LoadTokenizer(job.base_model_path));
  const int64_t context = model->config().max_position_embeddings;
  QLORA_ASSIGN_OR_RETURN(data::GenerationPrompts prompts,
                         data::GenerationPrompts::ForJob(job, tokenizer.get(), static_cast<int>(context)));
  QLORA_ASSIGN_OR_RETURN(engine::GenerationOptions options,
                         ResolveGenerationOptions(request, EndOfSequenceIds(model->config(), *tokenizer,
                                                                           prompts.layout() == data::ExampleLayout::kChat)));
  size_t longest_stop = 0;
  for (const std::string& s : request.stop) longest_stop = std::max(longest_stop, s.size());

  for (size_t index = 0; index < request.prompts.size(); ++index) {
    QLORA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, prompts.Ids(request.prompts[index]));
    GeneratedPiece piece;
    piece.prompt_index = static_cast<int>(index);
    std::vector<int32_t> generated;
    std::string text;        // the decoded output so far (end of sequence left out)
    size_t sent = 0;         // bytes of it already sent
    bool stopped = false;    // by a stop string
    absl::Status failure;
    bool client_gone = false;
    auto send = [&](size_t end) -> bool {
      if (end <= sent) return true;
      piece.text = text.substr(sent, end - sent);
      sent = end;
      absl::StatusOr<bool> go_on = emit(piece);
      if (!go_on.ok()) failure = go_on.status();
      if (!go_on.ok() || !*go_on) client_gone = true;
      return !client_gone;
    };
    const std::vector<int64_t> prompt(ids.begin(), ids.end());
    auto result = engine::Generate(*model, prompt, options, [&](int64_t token) {
      if (std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), token) !=
          options.eos_token_ids.end()) {
        return true;  // the end; its text is not part of the output
      }
      generated.push_back(static_cast<int32_t>(token));
      absl::StatusOr<std::string> decoded = tokenizer->Decode(generated);
      if (!decoded.ok()) {
        failure = decoded.status();
        return false;
      }
      text = std::move(*decoded);
      for (const std::string& s : request.stop) {
        const size_t at = s.empty() ? std::string::npos : text.find(s, sent > s.size() ? sent - s.size() : 0);
        if (at != std::string::npos) {
          text.resize(at);
          stopped = true;
        }
      }
      if (stopped) return false;
      return send(SafeEnd(text, longest_stop));
    });
    if (!failure.ok()) return failure;
    if (!result.ok()) return result.status();
    if (client_gone) return absl::OkStatus();
    if (!send(text.size())) return failure;
    piece.text.clear();
    piece.done = true;
    piece.prompt_tokens = static_cast<int64_t>(prompt.size());
    piece.generated_tokens = static_cast<int64_t>(result->tokens.size());
    switch (result->end) {
      case engine::GenerationEnd::kEndOfSequence: piece.finish_reason = "eos"; break;
      case engine::GenerationEnd::kMaxNewTokens: piece.finish_reason = "length"; break;
      case engine::GenerationEnd::kContextFull: piece.finish_reason = "context"; break;
      case engine::GenerationEnd::kStoppedByCaller: piece.finish_reason = "stop"; break;
    }
    absl::StatusOr<bool> go_on = emit(piece);
    if (!go_on.ok()) return go_on.status();
    if (!*go_on) return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace qlora::worker
