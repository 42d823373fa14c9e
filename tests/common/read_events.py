"""Reads TensorBoard event files with tensorboard's own EventAccumulator and prints, as JSON,
{tag: [[step, value], ...]} for every scalar tag of the run folder given; with --hparams, what
the hparams plugin reads instead: {"experiment": {"hparams": {name: type}, "metrics": [tag]},
"start": {name: value}, "end": status}, parsed by the plugin's own metadata module; with --text,
the text plugin's tensors: {tag: [[step, text], ...]}.
  python read_events.py RUN_DIR [--hparams | --text]
"""
import json
import sys

from google.protobuf import json_format
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0})
acc.Reload()
if "--text" in sys.argv:
    from tensorboard.util import tensor_util
    texts = acc.PluginTagToContent("text")
    print(json.dumps({tag: [[e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()]
                            for e in acc.Tensors(tag)] for tag in texts}))
    sys.exit(0)
if "--hparams" not in sys.argv:
    print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)]
                      for tag in acc.Tags()["scalars"]}))
    sys.exit(0)
content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
out = {}
if metadata.EXPERIMENT_TAG in content:
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    out["experiment"] = {
        "hparams": {h.name: api_pb2.DataType.Name(h.type) for h in experiment.hparam_infos},
        "metrics": [m.name.tag for m in experiment.metric_infos],
    }
if metadata.SESSION_START_INFO_TAG in content:
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    out["start"] = {k: json_format.MessageToDict(v) for k, v in start.hparams.items()}
if metadata.SESSION_END_INFO_TAG in content:
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    out["end"] = api_pb2.Status.Name(end.status)
print(json.dumps(out))
