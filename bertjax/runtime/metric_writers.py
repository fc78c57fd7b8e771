"""Where metrics go: the console, TensorBoard and two JSON Lines files.

Only process 0 writes. ``WORKDIR/metrics.jsonl`` holds one JSON object per
logged step of what the run computed (losses, accuracies, learning rate,
masking telemetry, divergence counters): a rerun of the same config, or a
run killed and resumed any number of times, writes it byte for byte the
same. Timings (tokens per second, achieved TFLOP/s, MFU) vary from run to
run and go to ``WORKDIR/throughput.jsonl`` instead. On resume, entries after
the restored step are dropped from both first, so they read as if the run
had never stopped.

A bucket cannot append to an object, so for a workdir in one (``gs://``)
the files are written in a local directory and uploaded whole, each an
object that appears complete: after a write at most every
``UPLOAD_EVERY_SECONDS``, before each checkpoint (``sync``) and at the end.
A kill loses at most the lines since the last upload, all after the last
checkpoint, which a resume drops anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from absl import logging

from bertjax import storage


def _import_tensorboardx():
  """tensorboardX, without torch unless this process has loaded it already.

  tensorboardX imports torch wherever it is installed, only to accept
  torch tensors, which bertjax never logs; torch adds about 1.5 s and 80 MB
  (peak) to every process that trains (experiments/benchmarks/startup.py).
  ``sys.modules[name] = None`` is Python's way to make ``import name``
  raise ImportError (tensorboardX then logs numpy and floats, as here);
  the entry is gone again after the import, so torch imports as usual
  later on (e.g. for a Hugging Face export).
  """
  if 'tensorboardX' in sys.modules or 'torch' in sys.modules:
    import tensorboardX  # pylint: disable=g-import-not-at-top
    return tensorboardX
  sys.modules['torch'] = None
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
  finally:
    del sys.modules['torch']
  return tensorboardX


tensorboardX = _import_tensorboardx()

UPLOAD_EVERY_SECONDS = 30.0
_JSONL = ('metrics.jsonl', 'throughput.jsonl')   # Continued on resume.


def logged_lines(path: str) -> list[tuple[str, dict]]:
  """The entries of a metrics JSON Lines file (each line as written, and
  parsed), up to the first that is not a whole entry with a ``step``: a
  line torn by a kill mid-write ends the good part. Blank lines are
  skipped; a missing file has none. Local or in a bucket."""
  if not storage.exists(path):
    return []
  entries = []
  with storage.open(path, 'r') as f:
    for line in f:
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        break
      if not isinstance(record, dict) or 'step' not in record:
        break
      entries.append((line, record))
  return entries


def truncate_jsonl(path: str, last_step: int) -> None:
  """Keeps only entries with ``step <= last_step`` (atomic rewrite)."""
  if not os.path.exists(path):
    return
  kept = [line for line, record in logged_lines(path)
          if record['step'] <= last_step]
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    f.writelines(kept)
    f.flush()
    os.fsync(f.fileno())   # On disk before the name points at it.
  os.replace(tmp, path)


class MetricWriter:
  """Console (progress bar on a terminal, plain lines otherwise) + TB + JSONL.
  """

  def __init__(self, workdir: str, total_steps: int, first_step: int,
               enabled: bool = True):
    self._enabled = enabled
    self._total = total_steps
    self._start_time = time.time()
    self._start_step = first_step
    self._bar = None
    self._closed = False
    if not enabled:
      return
    self._workdir, self._local = workdir, workdir
    if storage.is_remote(workdir):
      self._local = tempfile.mkdtemp(prefix='bertjax-metrics-')
      for name in _JSONL:
        if storage.exists(os.path.join(workdir, name)):
          storage.download(os.path.join(workdir, name),
                           os.path.join(self._local, name))
    self._uploaded = time.monotonic()
    self._jsonl_path = os.path.join(self._local, 'metrics.jsonl')
    self._timing_path = os.path.join(self._local, 'throughput.jsonl')
    truncate_jsonl(self._jsonl_path, first_step)
    truncate_jsonl(self._timing_path, first_step)
    self._jsonl = open(self._jsonl_path, 'a')
    self._timing = open(self._timing_path, 'a')
    # A resumed run's TensorBoard drops the killed attempt's points past
    # the checkpoint, as the JSONL files do.
    self._tb = tensorboardX.SummaryWriter(
        os.path.join(self._local, 'tensorboard'),
        purge_step=first_step + 1 if first_step else None)
    if sys.stderr.isatty():
      import tqdm  # pylint: disable=g-import-not-at-top
      self._bar = tqdm.tqdm(total=total_steps, initial=first_step,
                            unit='step', dynamic_ncols=True)

  def write(self, step: int, metrics: dict, timing: dict | None = None
            ) -> None:
    """``metrics`` to metrics.jsonl, ``timing`` to throughput.jsonl; both
    to TensorBoard and the console."""
    if not self._enabled:
      return
    for stream, values in ((self._jsonl, metrics), (self._timing, timing)):
      if values:
        record = {'step': int(step)}
        record.update({k: float(v) for k, v in sorted(values.items())})
        stream.write(json.dumps(record) + '\n')
        stream.flush()
    metrics = {**metrics, **(timing or {})}
    for name, value in metrics.items():
      self._tb.add_scalar(name, float(value), step)
    self._tb.flush()
    if time.monotonic() - self._uploaded >= UPLOAD_EVERY_SECONDS:
      self._upload()
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
      # The unit-length histogram and the data's skip counts (constant,
      # printed once at the start) go to TensorBoard and JSONL only.
      text = ' '.join(f'{k}={v:.4g}' for k, v in sorted(metrics.items())
                      if not k.startswith(('masking_unit_len_',
                                           'data_skipped_')))
      logging.info('step %d/%d (eta %.0fs) %s', step, self._total, eta, text)
      print(f'step {step}/{self._total} eta {eta:.0f}s {text}', flush=True)

  def sync(self) -> None:
    """Forces the lines written so far to disk (before a checkpoint, so
    that a machine crash cannot lose lines the checkpoint has passed)."""
    if not self._enabled:
      return
    for stream in (self._jsonl, self._timing):
      os.fsync(stream.fileno())
    self._tb.flush()
    self._upload()

  def _upload(self) -> None:
    """A bucket workdir's files, each uploaded whole (see the docstring)."""
    self._uploaded = time.monotonic()
    if self._local == self._workdir:
      return
    for path in storage.find(self._local):
      storage.upload(path, os.path.join(
          self._workdir, os.path.relpath(path, self._local)))

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
    """Uploads a bucket workdir's files and removes their local copies;
    again, does nothing."""
    if not self._enabled or self._closed:
      return
    self._closed = True
    if self._bar is not None:
      self._bar.close()
    self._jsonl.close()
    self._timing.close()
    self._tb.close()
    self._upload()
    if self._local != self._workdir:
      shutil.rmtree(self._local, ignore_errors=True)
