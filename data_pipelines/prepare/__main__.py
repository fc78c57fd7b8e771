r"""Prepare a config's pre-tokenized data on its own, before training.

  python -m data_pipelines.prepare --config=experiments/configs/bert.py \
      --config.data.corpus.path='/data/wiki/**/*.txt.gz' --workers=64

trains (or loads) the tokenizer, then writes the shards
(data_pipelines/shards.py) into ``data.data_dir``, where the trainer with
the same config finds and reuses them. ``--runner=local`` (the default)
writes them with ``--workers`` processes on this machine; ``--runner=beam``
runs the same preparation as an Apache Beam pipeline (data_pipelines/
beam.py): on the DirectRunner in ``--workers`` processes, or with Beam's
own options after ``--``, e.g. on Dataflow:

  python -m data_pipelines.prepare --config=... \
      --config.data.corpus.path='gs://B/wiki/**/*.txt.gz' \
      --config.data.data_dir=gs://B/prepared --runner=beam -- \
      --runner=DataflowRunner --project=P --region=R \
      --temp_location=gs://B/tmp --num_workers=100 --setup_file=./setup.py

Both write the same bytes, and both resume: a rerun after a failure keeps
the shards that were finished. Progress (documents, tokens/s, ETA) goes to
stderr; the summary to stdout. ``--verify`` checks a finished
preparation's every shard against its SHA-256 instead.
"""

from __future__ import annotations

import os
import time

from absl import app
from absl import flags
from ml_collections import config_flags

from bertjax import config_lib
from bertjax import errors
from bertjax import objectives
from data_pipelines import beam
from data_pipelines import corpus
from data_pipelines import mixture as mixture_lib
from data_pipelines import pretokenize
from data_pipelines import shards
from data_pipelines.prepare import progress as progress_lib

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, e.g. '
    'experiments/configs/bert.py:size=base', lock_config=False)
_WORKERS = flags.DEFINE_integer(
    'workers', 0, 'Processes that write shards (0 = one per core); '
    'overrides data.prepare_workers.')
_RUNNER = flags.DEFINE_enum(
    'runner', 'local', ['local', 'beam'], 'local: a process pool on this '
    'machine; beam: an Apache Beam pipeline (DirectRunner, or the runner '
    'given in Beam options after --).')
_VERIFY = flags.DEFINE_boolean(
    'verify', False, 'Check every shard of a finished preparation against '
    'its SHA-256 (reads them all), and write nothing.')


def plans(cfg, may_train: bool = True) -> list[pretokenize.Plan]:
  """What the trainer would prepare for ``cfg``: its corpus, or each
  component of its mixture (with the mixture's one tokenizer); the
  tokenizer trained if needed (an error if not ``may_train``)."""
  if not mixture_lib.is_mixture(cfg.data):
    return [pretokenize.plan(cfg.data, may_train=may_train)]
  fingerprints = mixture_lib.fingerprints(cfg.data)
  tokenizer = mixture_lib.load_or_train_tokenizer(cfg.data, fingerprints,
                                                  may_train)
  return [pretokenize.plan(mixture_lib.component_config(cfg.data, name),
                           tokenizer=tokenizer,
                           corpus_fingerprint=fingerprints[name])
          for name in mixture_lib.component_names(cfg.data)]


def verify(the_plan: pretokenize.Plan) -> str:
  manifest = shards.read_manifest(the_plan.directory)
  if manifest is None:
    raise pretokenize.DataError(
        f'{the_plan.directory} is not a finished preparation: prepare it '
        'first (the same command without --verify).')
  shards.check_shards(the_plan.directory, manifest, full=True)
  return f'{manifest["num_shards"]} shards: every file has its SHA-256.'


def write(the_plan: pretokenize.Plan, workers: int, beam_args) -> str:
  """Prepares ``the_plan`` (locally or with Beam); its summary."""
  start = time.perf_counter()
  if _RUNNER.value == 'beam':
    manifest = beam.run(the_plan, beam_args, workers)
    progress = None
  else:
    progress = progress_lib.Progress(
        progress_lib.estimated_text_size(corpus.files(the_plan.spec))
        if the_plan.spec.source == 'files' else None)
    try:
      manifest = pretokenize.write(the_plan, workers, progress)
    finally:
      progress.close()
  return summary(manifest, time.perf_counter() - start, progress)


def main(argv) -> None:
  cfg = _CONFIG.value
  if cfg is None:
    raise app.UsageError('--config is required.')
  beam_args = argv[1:]
  if beam_args and _RUNNER.value != 'beam':
    raise app.UsageError(f'unexpected arguments {beam_args}: Beam options '
                         'go after -- with --runner=beam.')
  with errors.reporting('prepare'):
    _prepare(cfg, beam_args)


def _prepare(cfg, beam_args) -> None:
  # As the trainer sees it: e.g. a student reads its teacher's tokenizer.
  cfg = objectives.get(cfg.objective.name).prepare_config(cfg)
  config_lib.validate(cfg)
  if mixture_lib.is_mixture(cfg.data):
    mixture_lib.validate(cfg.data)
  else:
    corpus.validate(corpus.CorpusSpec.from_config(cfg.data.corpus))
  workers = _WORKERS.value or cfg.data.prepare_workers or os.cpu_count()
  cfg.data.prepare_workers = workers   # The tokenizer's sample too.
  start = time.perf_counter()
  for the_plan in plans(cfg, may_train=not _VERIFY.value):
    print(f'tokenizer: {the_plan.tokenizer.vocab_size} pieces '
          f'({time.perf_counter() - start:.1f} s)')
    print(f'data: {the_plan.directory}')
    print(verify(the_plan) if _VERIFY.value else
          write(the_plan, workers, beam_args))


def summary(manifest: dict, seconds: float, progress=None) -> str:
  splits = manifest['splits']
  tokens = sum(splits[s]['tokens'] for s in splits)
  lines = [
      f'{manifest["num_shards"]} shards of {manifest["docs_per_shard"]} raw '
      f'documents: {manifest["num_raw_documents"]:,} documents read',
      *(f'  {s}: {splits[s]["records"]:,} documents, '
        f'{splits[s]["tokens"]:,} tokens' for s in splits),
      f'  skipped: {pretokenize.format_skipped(manifest["skipped"])}',
  ]
  if progress is not None and progress.reused:
    lines.append(f'  {progress.reused} shards were already written and kept')
  lines.append(f'{seconds:.1f} s, {tokens / max(seconds, 1e-9) / 1e3:,.0f}k '
               'tokens/s')
  return '\n'.join(lines)


if __name__ == '__main__':
  app.run(main, flags_parser=errors.flags_parser('prepare'))
