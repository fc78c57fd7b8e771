"""metrics.jsonl, TensorBoard events and resume truncation."""

import json
import os
import struct
import subprocess
import sys

from tensorboardX.proto import event_pb2

from bertjax.runtime import metric_writers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_writes_jsonl_and_tensorboard(tmp_path):
  writer = metric_writers.MetricWriter(str(tmp_path), total_steps=10,
                                       first_step=0)
  writer.write(5, {'loss': 2.5, 'mlm_accuracy': 0.25})
  writer.write(10, {'loss': 2.0, 'eval_mlm_accuracy': 0.5})
  writer.close()
  lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
  assert [json.loads(line) for line in lines] == [
      {'step': 5, 'loss': 2.5, 'mlm_accuracy': 0.25},
      {'step': 10, 'eval_mlm_accuracy': 0.5, 'loss': 2.0}]
  events = os.listdir(tmp_path / 'tensorboard')
  assert len(events) == 1 and events[0].startswith('events.out.tfevents')
  assert os.path.getsize(tmp_path / 'tensorboard' / events[0]) > 0


def _events(event_file) -> list:
  """The Event protos of a TensorBoard event file (TFRecord framing:
  length, its CRC, the Event proto, its CRC)."""
  data, events, at = open(event_file, 'rb').read(), [], 0
  while at < len(data):
    (length,) = struct.unpack('<Q', data[at:at + 8])
    events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
    at += 16 + length
  return events


def _scalars(event_file) -> dict:
  """{(step, tag): value} of a TensorBoard event file."""
  return {(event.step, value.tag): value.simple_value
          for event in _events(event_file) for value in event.summary.value}


# A fresh interpreter that starts a run's writer, as the trainer does.
_WRITE_WITHOUT_TORCH = """
import sys
import bertjax.train
from bertjax.runtime import metric_writers
writer = metric_writers.MetricWriter(sys.argv[1], total_steps=2,
                                     first_step=0)
writer.write(2, {'loss': 1.25})
writer.close()
print('torch loaded:', 'torch' in sys.modules)
print('qwix loaded:', 'qwix' in sys.modules)
"""


def test_a_run_does_not_load_torch_and_its_scalars_are_written(tmp_path):
  """tensorboardX would import torch (1.5 s a process) where it is
  installed, as it is with the test extra; the trainer keeps it out, and
  the scalars are still logged. Nor does a float model's run load Qwix
  (bertjax.quantization imports it on first use)."""
  result = subprocess.run(
      [sys.executable, '-c', _WRITE_WITHOUT_TORCH, str(tmp_path)],
      capture_output=True, text=True, cwd=REPO, check=True,
      env=dict(os.environ, PYTHONPATH=REPO))
  assert 'torch loaded: False' in result.stdout
  assert 'qwix loaded: False' in result.stdout
  (events,) = os.listdir(tmp_path / 'tensorboard')
  assert _scalars(tmp_path / 'tensorboard' / events) == {(2, 'loss'): 1.25}


def test_resume_drops_entries_after_the_restored_step(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"step": 1, "loss": 3}\n{"step": 2, "loss": 2}\n'
                  '{"step": 3, "loss": 1}\n{"step": 4, "lo')  # Torn by a kill.
  writer = metric_writers.MetricWriter(str(tmp_path), total_steps=6,
                                       first_step=2)
  writer.write(3, {'loss': 1.5})
  writer.close()
  assert [json.loads(line) for line in path.read_text().splitlines()] == [
      {'step': 1, 'loss': 3}, {'step': 2, 'loss': 2},
      {'step': 3, 'loss': 1.5}]
  # TensorBoard is told to drop the killed attempt's points from step 3 on.
  (events,) = os.listdir(tmp_path / 'tensorboard')
  starts = [e.step for e in _events(tmp_path / 'tensorboard' / events)
            if e.session_log.status == event_pb2.SessionLog.START]
  assert starts == [3]


def test_disabled_writer_writes_nothing(tmp_path):
  writer = metric_writers.MetricWriter(str(tmp_path), total_steps=6,
                                       first_step=0, enabled=False)
  writer.write(1, {'loss': 1.0})
  writer.close()
  assert not os.listdir(tmp_path)
