"""Where metrics go: the console, TensorBoard and ``WORKDIR/metrics.jsonl``.

Only process 0 writes. ``metrics.jsonl`` holds one JSON object per logged
step; on resume, entries after the restored step are dropped first, so the
file reads as if the run had never stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import logging
import tensorboardX


def truncate_jsonl(path: str, last_step: int) -> None:
  """Keeps only entries with ``step <= last_step`` (atomic rewrite)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = []
  for line in lines:
    try:
      if json.loads(line)['step'] <= last_step:
        kept.append(line)
    except (ValueError, KeyError):
      break  # A line torn by a kill mid-write ends the good part.
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    f.writelines(kept)
  os.replace(tmp, path)


class MetricWriter:
  """Console (progress bar on a terminal, plain lines otherwise) + TB + JSONL.
  """

  def __init__(self, workdir: str, total_steps: int, first_step: int,
               enabled: bool = True):
    self._enabled = enabled
    self._total = total_steps
    self._jsonl_path = os.path.join(workdir, 'metrics.jsonl')
    self._start_time = time.time()
    self._start_step = first_step
    self._bar = None
    if not enabled:
      return
    truncate_jsonl(self._jsonl_path, first_step)
    self._jsonl = open(self._jsonl_path, 'a')
    self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, 'tensorboard'))
    if sys.stderr.isatty():
      import tqdm  # pylint: disable=g-import-not-at-top
      self._bar = tqdm.tqdm(total=total_steps, initial=first_step,
                            unit='step', dynamic_ncols=True)

  def write(self, step: int, metrics: dict) -> None:
    if not self._enabled:
      return
    record = {'step': int(step)}
    record.update({k: float(v) for k, v in sorted(metrics.items())})
    self._jsonl.write(json.dumps(record) + '\n')
    self._jsonl.flush()
    for name, value in metrics.items():
      self._tb.add_scalar(name, float(value), step)
    self._tb.flush()
    if self._bar is not None:
      # A step's metrics may be written after the next step has begun.
      self._bar.update(max(0, step - self._bar.n))
      shown = {k: f'{v:.4g}' for k, v in metrics.items()
               if k in ('loss', 'mlm_accuracy', 'tokens_per_second',
                        'eval_mlm_accuracy')}
      self._bar.set_postfix(shown, refresh=True)
    else:
      elapsed = time.time() - self._start_time
      done = max(step - self._start_step, 1)
      eta = elapsed / done * (self._total - step)
      # The unit-length histogram goes to TensorBoard and JSONL only.
      text = ' '.join(f'{k}={v:.4g}' for k, v in sorted(metrics.items())
                      if not k.startswith('masking_unit_len_'))
      logging.info('step %d/%d (eta %.0fs) %s', step, self._total, eta, text)
      print(f'step {step}/{self._total} eta {eta:.0f}s {text}', flush=True)

  def advance(self, step: int) -> None:
    """Moves the progress bar (if any) to ``step``; cheap every step."""
    if self._bar is not None:
      self._bar.update(step - self._bar.n)

  def message(self, text: str) -> None:
    if not self._enabled:
      return
    if self._bar is not None:
      self._bar.write(text)
    else:
      print(text, flush=True)

  def close(self) -> None:
    if not self._enabled:
      return
    if self._bar is not None:
      self._bar.close()
    self._jsonl.close()
    self._tb.close()
