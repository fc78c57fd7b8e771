r"""Preparing a corpus: wall time, tokens/s and peak memory, by size and
worker count, next to the preparation it replaced.

For each corpus size (a synthetic corpus, synthetic_corpus.py), in fresh
processes, one at a time:

- the tokenizer: a seeded uniform sample of ``--sample`` sentences over the
  whole corpus (one pass, by 2 and by 1 worker processes: the same model),
  and SentencePiece trained on it (``--vocab`` pieces);
- the shards (data_pipelines/shards.py), with that tokenizer, by 1 and by 2
  worker processes (each with one SentencePiece thread);
- at the sizes in ``--beam_sizes``, the same shards by the Beam pipeline
  (data_pipelines/beam.py) on the DirectRunner in 2 processes;
- the peer, at the sizes in ``--peer_sizes``: bertjax's preparation before
  the shards (a TFDS builder, commit de319a0, loaded from git history),
  with the same tokenizer and 1 and all-core SentencePiece threads.

The shards' rows time ``pretokenize.write``: the preparation, from the
corpus to the shards, their merged index and the manifest (not the
trainer's loading of the index afterwards). Peak RSS is the largest
resident set of the process and of any one of its worker processes
(``getrusage``). Tokens/s is the tokens written over the phase's wall
time. The tokenizer is timed apart: it is the same for any worker count.

  python experiments/benchmarks/prepare.py --sizes=100,1000 \
      --work=/tmp/prepare_bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _REPO)
sys.path.insert(0, _HERE)

# The preparation this replaced, for the peer's rows.
PEER_COMMIT = 'de319a0'


def _rss_mb() -> tuple[float, float]:
  """(this process's, its largest child's) peak RSS in MB."""
  return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def _data_config(corpus_dir: str, data_dir: str, args):
  """The config's ``data`` section (a ConfigDict): the text files in
  ``corpus_dir``, prepared into ``data_dir``."""
  from bertjax import config_lib  # pylint: disable=g-import-not-at-top
  d = config_lib.base_config().data
  d.corpus.source = 'files'
  d.corpus.path = corpus_dir
  d.data_dir = data_dir
  d.tokenizer.vocab_size = args.vocab
  d.tokenizer.max_sentences = args.sample
  return d


def _phase_tokenizer(job: dict, args) -> dict:
  from data_pipelines import corpus  # pylint: disable=g-import-not-at-top
  from data_pipelines import pretokenize  # pylint: disable=g-import-not-at-top
  d = _data_config(job['corpus'], job['data_dir'], args)
  d.prepare_workers = job['workers']
  start = time.perf_counter()
  spec = corpus.CorpusSpec.from_config(d.corpus)
  tokenizer = pretokenize.load_or_train_tokenizer(d, spec,
                                                  corpus.fingerprint(spec))
  seconds = time.perf_counter() - start
  tokenizer.save(job['model'])
  return {'seconds': seconds, 'sha256': tokenizer.sha256}


def _phase_shards(job: dict, args) -> dict:
  from data_pipelines import pretokenize  # pylint: disable=g-import-not-at-top
  d = _data_config(job['corpus'], job['data_dir'], args)
  d.tokenizer.model_path = job['model']
  start = time.perf_counter()
  manifest = pretokenize.write(pretokenize.plan(d, num_threads=1),
                               job['workers'])
  seconds = time.perf_counter() - start
  return {'seconds': seconds, 'tokens': sum(
      manifest['splits'][s]['tokens'] for s in manifest['splits'])}


def _phase_beam(job: dict, args) -> dict:
  from data_pipelines import beam  # pylint: disable=g-import-not-at-top
  from data_pipelines import pretokenize  # pylint: disable=g-import-not-at-top
  d = _data_config(job['corpus'], job['data_dir'], args)
  d.tokenizer.model_path = job['model']
  start = time.perf_counter()
  manifest = beam.run(pretokenize.plan(d), workers=job['workers'])
  seconds = time.perf_counter() - start
  return {'seconds': seconds, 'tokens': sum(
      manifest['splits'][s]['tokens'] for s in manifest['splits'])}


def _phase_peer(job: dict, args) -> dict:
  import importlib.util  # pylint: disable=g-import-not-at-top
  source = subprocess.run(
      ['git', '-C', _REPO, 'show', f'{PEER_COMMIT}:data_pipelines/'
       'pretokenize.py'], capture_output=True, text=True, check=True).stdout
  path = os.path.join(job['data_dir'], 'peer_pretokenize.py')
  os.makedirs(job['data_dir'], exist_ok=True)
  with open(path, 'w') as f:
    f.write(source)
  spec = importlib.util.spec_from_file_location('peer_pretokenize', path)
  peer = importlib.util.module_from_spec(spec)
  sys.modules['peer_pretokenize'] = peer
  spec.loader.exec_module(peer)
  d = _data_config(job['corpus'], job['data_dir'], args)
  d.tokenizer.model_path = job['model']
  start = time.perf_counter()
  prepared = peer.prepare(d, num_threads=job['threads'])
  seconds = time.perf_counter() - start
  return {'seconds': seconds, 'tokens': prepared.train_index.num_tokens
          + prepared.eval_index.num_tokens}


_PHASES = {'tokenizer': _phase_tokenizer, 'shards': _phase_shards,
           'beam': _phase_beam, 'peer': _phase_peer}


def _run(job: dict, args) -> dict:
  """Runs a phase in a fresh process; its figures and peak RSS."""
  shutil.rmtree(job['data_dir'], ignore_errors=True)
  out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), '--job', json.dumps(job),
       f'--vocab={args.vocab}', f'--sample={args.sample}'],
      capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f'{job}: {out.stderr[-3000:]}')
  result = json.loads(out.stdout.strip().splitlines()[-1])
  shutil.rmtree(job['data_dir'], ignore_errors=True)
  return result


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--sizes', default='100,1000',
                      help='corpus sizes in MB.')
  parser.add_argument('--peer_sizes', default='100',
                      help='sizes at which the peer runs too.')
  parser.add_argument('--beam_sizes', default='100',
                      help='sizes at which the Beam pipeline (DirectRunner, '
                      '2 processes) runs too.')
  parser.add_argument('--work', default='/tmp/bertjax_prepare_bench')
  parser.add_argument('--vocab', type=int, default=8000)
  parser.add_argument('--sample', type=int, default=100_000,
                      help='data.tokenizer.max_sentences.')
  parser.add_argument('--job', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.job:
    job = json.loads(args.job)
    result = _PHASES[job['phase']](job, args)
    result['rss_mb'], result['child_rss_mb'] = _rss_mb()
    print(json.dumps(result))
    return
  import synthetic_corpus  # pylint: disable=g-import-not-at-top
  print(f'python {sys.version.split()[0]}, {os.cpu_count()} cores; '
        f'tokenizer: {args.vocab} pieces, a sample of {args.sample:,} '
        'sentences')
  rows = []
  for size in [float(x) for x in args.sizes.split(',')]:
    corpus = os.path.join(args.work, f'corpus_{size:g}mb')
    start = time.perf_counter()
    synthetic_corpus.write(corpus, size)
    print(f'\n{size:g} MB corpus in --work/{os.path.basename(corpus)} '
          f'({time.perf_counter() - start:.0f} s to write or find)')
    model = os.path.join(args.work, f'spm_{size:g}mb.model')
    base = {'corpus': corpus, 'model': model,
            'data_dir': os.path.join(args.work, 'data')}
    jobs = [(f'tokenizer: sample + train, {w} worker{"s" * (w > 1)}',
             {**base, 'phase': 'tokenizer', 'workers': w}) for w in (2, 1)]
    jobs += [(f'shards, {w} worker{"s" * (w > 1)}',
              {**base, 'phase': 'shards', 'workers': w}) for w in (1, 2)]
    if f'{size:g}' in args.beam_sizes.split(','):
      jobs.append(('Beam DirectRunner, 2 workers',
                   {**base, 'phase': 'beam', 'workers': 2}))
    if f'{size:g}' in args.peer_sizes.split(','):
      jobs += [(f'peer (TFDS builder, {PEER_COMMIT}), {t} thread'
                f'{"s" * (t > 1)}', {**base, 'phase': 'peer', 'threads': t})
               for t in (1, os.cpu_count())]
    for name, job in jobs:
      result = _run(job, args)
      rows.append((size, name, result))
      models = {r['sha256'] for mb, _, r in rows
                if mb == size and 'sha256' in r}
      if len(models) > 1:
        raise AssertionError('the tokenizer depends on the worker count')
      tokens = result.get('tokens')
      print(f'  {name:<38} {result["seconds"]:8.1f} s  '
            + (f'{tokens / result["seconds"] / 1e3:9,.0f}k tokens/s  '
               if tokens else ' ' * 21)
            + f'peak RSS {result["rss_mb"]:6.0f} MB '
            f'(largest worker {result["child_rss_mb"]:4.0f} MB)'
            + (f'  {tokens:,} tokens' if tokens else ''))
  print('\n' + json.dumps([{'mb': s, 'phase': n, **r} for s, n, r in rows]))


if __name__ == '__main__':
  main()
