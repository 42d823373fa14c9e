"""Reads TensorBoard event files with tensorboard's own EventAccumulator and prints, as JSON,
{tag: [[step, value], ...]} for every scalar tag of the run folder given.
  python read_events.py RUN_DIR
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)]
                  for tag in acc.Tags()["scalars"]}))
