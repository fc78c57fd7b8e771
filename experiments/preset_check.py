r"""Checks that each new preset trains, resumes bitwise, exports, fine-tunes.

  PYTHONPATH=. python experiments/preset_check.py \
      --workdir=runs/preset_check \
      --out=experiments/results/beyond_masking/presets.md

The issue's acceptance item: "Every new preset trains 20 steps on the demo
corpus, resumes bitwise after a kill, exports, and fine-tunes through the
harness." The new presets (default; ``--presets`` takes a comma-separated
list of config specs) are ``experiments/configs/ernie2.py:size=demo`` and
``experiments/configs/beyond_masking.py:arm=NAME`` for every arm but the
baselines (``mlm``, ``mlm_nsp``, ``electra``: older presets' recipes).
For each, in ``WORKDIR/<preset>/``:

1. ``experiments/kill_resume.py --kills=2``: an uninterrupted 20-step run
   and one SIGKILLed twice and resumed, compared byte for byte
   (``metrics.jsonl``) and bit for bit (every final parameter). The preset
   keeps its model and data; only the length and cadence change
   (``OVERRIDES``; warmup 2 steps, since the presets' warmups exceed 20;
   a continual preset's stages are rescaled to the 20 steps, fractions
   kept: the shipped ones' three get 7, 7 and 6).
2. ``experiments/export.py`` of the killed-and-resumed run, then the
   exported class (``config.json``'s ``architectures``) loads with
   transformers and runs one forward on a tokenized sentence.
3. ``experiments/finetune.py`` of that run on the embedded task
   (experiments/configs/finetune.py: 256 examples per class) for one epoch
   at batch 32: its held-out accuracy.

Each preset's outcome goes to ``WORKDIR/<preset>/result.json``; a preset
that has one is skipped on a rerun (``--redo_failed`` retries those that
failed a step). The table of every selected preset, the command, the date
and the package versions go to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import transformers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from experiments.configs import beyond_masking  # pylint: disable=g-import-not-at-top,wrong-import-position

ERNIE2 = 'experiments/configs/ernie2.py:size=demo'
ARM_SPEC = 'experiments/configs/beyond_masking.py:arm={}'
PRESETS = (ERNIE2,) + tuple(ARM_SPEC.format(arm) for arm in beyond_masking.ARMS
                            if arm not in beyond_masking.BASELINES)
STEPS = 20
# 20 steps; logs every 5 (kill_resume kills after logged steps), evaluates
# and checkpoints so that a kill can land in either.
OVERRIDES = (f'--config.total_steps={STEPS}', '--config.num_train_steps=0',
             '--config.optimizer.warmup_steps=2', '--config.log_every_steps=5',
             '--config.eval_every_steps=20',
             '--config.checkpoint_every_steps=5')
KILL_RESUME = 'experiments/kill_resume.py'
KILLS = 2
FINETUNE_CONFIG = 'experiments/configs/finetune.py'
FINETUNE_OVERRIDES = ('--config.num_epochs=1', '--config.batch_size=32')
SENTENCE = 'The os module provides a portable way of using the file system.'
PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'grain',
            'sentencepiece', 'transformers', 'torch', 'numpy')
RESULT = 'result.json'


class StepFailed(RuntimeError):
  """A step of the check failed; ``step`` names it, the message says why."""

  def __init__(self, step: str, message: str):
    super().__init__(message)
    self.step = step


def preset_name(spec: str) -> str:
  """A directory name for ``spec``: ``ernie2_size_demo``,
  ``beyond_masking_arm_capitalization_mlm``."""
  config = os.path.splitext(os.path.basename(spec.split(':')[0]))[0]
  arg = spec.partition(':')[2]
  return re.sub(r'[^A-Za-z0-9]+', '_', f'{config}_{arg}').strip('_')


def continual_overrides(spec: str) -> list[str]:
  """A continual preset's stages rescaled to ``STEPS`` (fractions kept, as
  compare.py does), so that they cover the short run; [] for any other."""
  from bertjax import config_lib  # pylint: disable=g-import-not-at-top
  from data_pipelines import continual  # pylint: disable=g-import-not-at-top
  path, sep, arg = spec.partition(':')
  cfg = config_lib.load_config_file(os.path.join(REPO, path) + sep + arg)
  if not continual.is_continual(cfg):
    return []
  stages = continual.scaled_stages(cfg.continual.stage_steps, STEPS)
  return [f'--config.continual.stage_steps=({",".join(map(str, stages))})']


def _run(command: list[str], log_path: str) -> subprocess.CompletedProcess:
  """Runs ``command`` from the repository; its output goes to ``log_path``."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep
             + os.environ.get('PYTHONPATH', ''))
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True,
                          text=True)
  with open(log_path, 'w') as f:
    f.write(f'$ {" ".join(command)}\n# exit status {result.returncode}\n'
            f'--- stdout\n{result.stdout}--- stderr\n{result.stderr}')
  return result


def _tail(text: str, lines: int = 12) -> str:
  return '\n'.join(text.strip().splitlines()[-lines:])


def kill_resume(spec: str, directory: str, seed: int) -> dict:
  """Step 1: ``experiments/kill_resume.py``; the verdict and its line."""
  workdir = os.path.join(directory, 'kill_resume')
  shutil.rmtree(workdir, ignore_errors=True)   # It wants a new workdir.
  overrides = list(OVERRIDES) + continual_overrides(spec)
  command = [sys.executable, KILL_RESUME,
             f'--config={spec}', f'--workdir={workdir}', f'--kills={KILLS}',
             f'--seed={seed}', '--', *overrides]
  result = _run(command, os.path.join(directory, 'kill_resume.log'))
  lines = result.stdout.splitlines()
  verdict = [x for x in lines if x.startswith(('IDENTICAL', 'DIFFERENT'))]
  if not verdict:   # It raised: training failed, or too few logged steps.
    raise StepFailed('kill_resume', _tail(result.stderr or result.stdout))
  return {'identical': result.returncode == 0, 'verdict': verdict[-1],
          'kills': [x for x in lines if x.startswith('kill ')],
          'killed_run': os.path.join(workdir, 'killed')}


def load_export(directory: str) -> dict:
  """Loads an exported directory with the transformers class its
  ``config.json`` names and runs it on ``SENTENCE``."""
  with open(os.path.join(directory, 'config.json')) as f:
    architecture = json.load(f)['architectures'][0]
  try:
    model, info = getattr(transformers, architecture).from_pretrained(
        directory, output_loading_info=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    inputs = tokenizer(SENTENCE, return_tensors='pt')
    model.eval()
    with torch.no_grad():
      output = model(**inputs)
  except Exception as e:  # pylint: disable=broad-except
    return {'architecture': architecture, 'loaded': False,
            'error': f'{type(e).__name__}: {e}'}
  first = next(iter(output.values())).numpy()
  missing, unexpected = info['missing_keys'], info['unexpected_keys']
  return {'architecture': architecture,
          'missing_keys': sorted(missing),
          'unexpected_keys': sorted(unexpected),
          'output_shape': list(first.shape),
          'output_finite': bool(np.isfinite(first).all()),
          'loaded': not missing and bool(np.isfinite(first).all())}


def export(run: str, directory: str) -> dict:
  """Step 2: ``experiments/export.py`` of ``run``, each directory it wrote
  loaded back (ELECTRA writes two)."""
  out = os.path.join(directory, 'export')
  shutil.rmtree(out, ignore_errors=True)
  result = _run([sys.executable, 'experiments/export.py', f'--workdir={run}',
                 f'--out={out}'], os.path.join(directory, 'export.log'))
  if result.returncode != 0:
    raise StepFailed('export', _tail(result.stderr or result.stdout))
  written = [line.split(': ')[0] for line in result.stdout.splitlines()
             if ': ' in line]
  loads = [load_export(d) for d in written]
  return {'directories': written, 'loads': loads,
          'loaded': bool(loads) and all(x['loaded'] for x in loads)}


def finetune(run: str, directory: str) -> dict:
  """Step 3: ``experiments/finetune.py`` of ``run`` (it resumes itself)."""
  workdir = os.path.join(directory, 'finetune')
  command = [sys.executable, 'experiments/finetune.py',
             f'--config={FINETUNE_CONFIG}', f'--config.init={run}',
             f'--workdir={workdir}', *FINETUNE_OVERRIDES]
  result = _run(command, os.path.join(directory, 'finetune.log'))
  if result.returncode != 0:
    raise StepFailed('finetune', _tail(result.stderr or result.stdout))
  with open(os.path.join(workdir, 'downstream.json')) as f:
    downstream = json.load(f)
  # What a constant prediction scores, and how many classes were predicted:
  # a short fine-tuning of a 20-step encoder may predict one class only.
  labels = np.asarray(downstream['eval_labels'])
  predictions = np.asarray(downstream['eval_predictions'])
  return {'task': downstream['task'], 'steps': downstream['steps'],
          'headline': downstream['headline'],
          'metrics': downstream['metrics'],
          'majority_rate': float(np.bincount(labels).max() / len(labels)),
          'classes_predicted': len(np.unique(predictions))}


def check_preset(spec: str, directory: str, seed: int) -> dict:
  """The three steps for one preset; a failed step ends the preset and is
  recorded (``failed_step``, ``error``)."""
  os.makedirs(directory, exist_ok=True)
  record = {'preset': spec}
  start = time.time()
  try:
    record['kill_resume'] = kill_resume(spec, directory, seed)
    run = record['kill_resume']['killed_run']
    record['export'] = export(run, directory)
    record['finetune'] = finetune(run, directory)
  except StepFailed as e:
    record['failed_step'], record['error'] = e.step, str(e)
  record['wall_seconds'] = round(time.time() - start, 1)
  with open(os.path.join(directory, RESULT), 'w') as f:
    json.dump(record, f, indent=2)
  return record


def _cell(record: dict, step: str, key: str, text) -> str:
  """``text(record[key])`` when the step ran; else where the preset
  failed, or '-' for a step it never reached."""
  if key in record:
    return text(record[key])
  return f'**failed** ({step})' if record.get('failed_step') == step else '-'


def _kills(kr: dict) -> str:
  """'identical (killed at steps 10, 15)': the last step logged before
  each SIGKILL."""
  steps = [re.search(r'last logged step (\d+)', x)
           for x in kr.get('kills', ())]
  where = ', '.join(m.group(1) for m in steps if m)
  verdict = 'identical' if kr['identical'] else '**different**'
  return f'{verdict} (killed after steps {where})' if where else verdict


def _accuracy(ft: dict) -> str:
  """'0.2151 (majority 0.2151, 1 class predicted)'."""
  text = f'{ft["metrics"]["accuracy"]:.4f}'
  if 'majority_rate' in ft:
    n = ft['classes_predicted']
    text += (f' (majority {ft["majority_rate"]:.4f}, {n} '
             f'class{"es" if n > 1 else ""} predicted)')
  return text


def _row(record: dict) -> str:
  """One table row: preset, kill/resume, export class, load, fine-tune."""
  config, _, arg = record['preset'].partition(':')
  cells = [
      f'`{os.path.basename(config)}:{arg}`',
      _cell(record, 'kill_resume', 'kill_resume', _kills),
      _cell(record, 'export', 'export', lambda ex: ', '.join(
          x['architecture'] for x in ex['loads']) or '-'),
      _cell(record, 'export', 'export',
            lambda ex: 'OK' if ex['loaded'] else '**no**'),
      _cell(record, 'finetune', 'finetune', _accuracy),
      f'{record["wall_seconds"]:.0f}']
  return '| ' + ' | '.join(cells) + ' |'


def _versions() -> str:
  found = []
  for package in PACKAGES:
    try:
      found.append(f'{package} {importlib.metadata.version(package)}')
    except importlib.metadata.PackageNotFoundError:
      pass
  return f'Python {platform.python_version()}, ' + ', '.join(found)


def _failures(records: list[dict]) -> list[str]:
  """Each failure once, with the presets that failed with it (the error
  with the preset's directory name replaced by ``<preset>``)."""
  by_error = {}
  for record in records:
    if 'error' in record:
      error = record['error'].replace(preset_name(record['preset']),
                                      '<preset>')
      key = (record['failed_step'], error)
      by_error.setdefault(key, []).append(f'`{record["preset"]}`')
  lines = []
  for (step, error), presets in by_error.items():
    lines += [f'- failed at {step}: {", ".join(presets)}:', '', '  ```',
              *('  ' + x for x in error.splitlines()), '  ```']
  return lines


def _details(records: list[dict]) -> list[str]:
  """The failures, verdicts and load details, under the table."""
  lines = _failures(records)
  for record in records:
    name = record['preset']
    if 'kill_resume' in record and not record['kill_resume']['identical']:
      lines.append(f'- `{name}`: {record["kill_resume"]["verdict"]}')
    for load in record.get('export', {}).get('loads', ()):
      if 'error' in load:
        lines.append(f'- `{name}` {load["architecture"]} did not load: '
                     f'{load["error"]}')
      elif load['missing_keys'] or load['unexpected_keys']:
        lines.append(f'- `{name}` {load["architecture"]}: missing keys '
                     f'{load["missing_keys"]}, unexpected keys '
                     f'{load["unexpected_keys"]}')
      if 'error' not in load and not load['output_finite']:
        lines.append(f'- `{name}` {load["architecture"]}: its output on '
                     f'"{SENTENCE}" is not finite')
  return lines


def write_report(records: list[dict], out: str, command: str) -> str:
  """The markdown report of ``records``, written to ``out``."""
  lines = [
      '# New presets: train 20 steps, resume bitwise, export, fine-tune', '',
      'Made by experiments/preset_check.py (its docstring says what each '
      'column checks) on '
      f'{datetime.date.today().isoformat()}, {os.cpu_count()}-core CPU:', '',
      '```', command, '```', '',
      f'Pretraining overrides: `{" ".join(OVERRIDES)}` (continual presets '
      f'also `{" ".join(continual_overrides(ERNIE2))}`); kill_resume '
      f'`--kills={KILLS}`. Fine-tuning: `{FINETUNE_CONFIG}` (embedded task) '
      f'with `{" ".join(FINETUNE_OVERRIDES)}`, from the killed-and-resumed '
      'run; held-out accuracy, beside the rate of the most frequent held-out '
      'class and the number of classes the model predicts. Wall seconds: '
      'all three steps, on a machine shared with other jobs.', '',
      f'Packages: {_versions()}.', '',
      '| preset | kill/resume (2 SIGKILLs) | export class | transformers '
      'load + forward | fine-tune held-out accuracy | wall s |',
      '| --- | --- | --- | --- | ---: | ---: |',
      *(_row(r) for r in records)]
  details = _details(records)
  if details:
    lines += ['', '## Notes and failures', '', *details]
  text = '\n'.join(lines) + '\n'
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, 'w') as f:
    f.write(text)
  return text


def _load_record(directory: str) -> dict | None:
  path = os.path.join(directory, RESULT)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--presets', default=','.join(PRESETS),
                      help='comma-separated config specs (default: every '
                      'new preset).')
  parser.add_argument('--workdir', default='runs/preset_check')
  parser.add_argument('--out',
                      default='experiments/results/beyond_masking/presets.md')
  parser.add_argument('--seed', type=int, default=0,
                      help='kill_resume.py\'s --seed (the kill moments).')
  parser.add_argument('--redo_failed', action='store_true',
                      help='rerun presets whose result records a failure.')
  args = parser.parse_args(argv)
  # The steps run from the repository: relative paths are the repository's.
  args.workdir = os.path.join(REPO, args.workdir)
  args.out = os.path.join(REPO, args.out)
  records = []
  for spec in [s for s in args.presets.split(',') if s]:
    directory = os.path.join(args.workdir, preset_name(spec))
    record = _load_record(directory)
    if record is None or (args.redo_failed and 'error' in record):
      print(f'{spec}: checking in {directory}', flush=True)
      record = check_preset(spec, directory, args.seed)
    else:
      print(f'{spec}: done earlier ({directory}/{RESULT})', flush=True)
    print(_row(record), flush=True)
    records.append(record)
  command = 'PYTHONPATH=. python experiments/preset_check.py ' + ' '.join(
      sys.argv[1:] if argv is None else argv)
  print(write_report(records, args.out, command.strip()), end='')


if __name__ == '__main__':
  main()
