// The summaries of TensorBoard's hparams plugin, so that runs compare in its HParams tab: the
// experiment (which hyperparameters and metrics there are), the session start (this run's
// values) and the session end (its status), as encoded tensorflow.Summary messages for
// EventFileWriter::AddSummary. Each is one Summary.Value tagged `_hparams_/experiment`,
// `_hparams_/session_start_info` or `_hparams_/session_end_info`, whose metadata's plugin data
// (plugin "hparams", version 0) holds a tensorboard.hparams.HParamsPluginData, with the empty
// float tensor tensorboard's own summary API writes (tensorboard/plugins/hparams/
// plugin_data.proto, api.proto). Torch-free.
#pragma once

#include <string>
#include <variant>
#include <vector>

namespace qlora::tensorboard {

struct HParam {
  std::string name;                             // "trainer.learning_rate"
  std::variant<double, bool, std::string> value;
};

// The hyperparameters' names and types, and the metrics (scalar tags) to show beside them.
std::string HParamsExperimentSummary(const std::vector<HParam>& hparams, const std::vector<std::string>& metric_tags,
                                     double time_created);
// This run's values.
std::string HParamsSessionStartSummary(const std::vector<HParam>& hparams, double start_time);
// How the run ended.
std::string HParamsSessionEndSummary(bool succeeded, double end_time);

// A text-plugin summary (TensorBoard's TEXT tab): `markdown` as a scalar DT_STRING tensor
// tagged `tag`, as tf.summary.text writes it.
std::string TextSummary(const std::string& tag, const std::string& markdown);

}  // namespace qlora::tensorboard
