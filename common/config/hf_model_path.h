// Resolving `base_model` to a local Hugging Face model folder, offline, the way transformers
// does with HF_HUB_OFFLINE=1: a local folder holding config.json wins; otherwise a hub name
// ("org/name" or "name") is looked up in the hub cache:
//   <cache>/models--org--name/refs/main            -> the commit hash
//   <cache>/models--org--name/snapshots/<hash>/    -> the folder (must hold config.json)
// and when refs/main is missing or stale, the newest snapshot that holds config.json.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace qlora {

// The hub cache folder as huggingface_hub chooses it: $HF_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else $HOME/.cache/huggingface/hub. Reads the environment.
std::string DefaultHfHubCache();

// True for "name" or "org/name" made of letters, digits, '.', '_' and '-'.
bool LooksLikeHubRepoId(const std::string& text);

// The absolute local folder for `base_model`. Errors (messages start with "base_model"):
//   FAILED_PRECONDITION  a hub name absent from `hub_cache` (says to download it), or a folder
//                        without config.json, or a file;
//   NOT_FOUND            a path (not a hub name) that does not exist.
absl::StatusOr<std::string> ResolveBaseModelPath(const std::string& base_model,
                                                 const std::string& hub_cache);

}  // namespace qlora
