"""metrics.jsonl, TensorBoard events and resume truncation."""

import json
import os

from bertjax.runtime import metric_writers


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


def test_disabled_writer_writes_nothing(tmp_path):
  writer = metric_writers.MetricWriter(str(tmp_path), total_steps=6,
                                       first_step=0, enabled=False)
  writer.write(1, {'loss': 1.0})
  writer.close()
  assert not os.listdir(tmp_path)
