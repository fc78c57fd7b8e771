r"""Beyond masking: BART's Table 1 and T5's Table 4 for encoders, in miniature.

``arg`` is ``arm=NAME``: one arm of the comparison, all on
compare_small.py's recipe (the tiny L2/H128 encoder, the embedded corpus,
batch 32, BERT's optimizer at peak lr 1e-3) and fine-tuned as it is
(``arm=finetune``: compare_small.py's fine-tuning). The arms:

- baselines: ``mlm`` (masked LM alone, packed full sentences), ``mlm_nsp``
  (BERT's MLM + NSP) and ``electra`` (compare_small.py's ELECTRA);
- the encoder forms of the denoising tasks (data_pipelines/tasks/
  denoise.py), each alone as BART and T5 ran them: ``token_deletion``,
  ``token_insertion``, ``token_replacement``, ``token_shuffle``,
  ``sentence_permutation``, ``document_rotation``;
- ERNIE 2.0's tasks, alone and with masked LM as ERNIE 2.0 trains them
  (``NAME+mlm``): ``capitalization``, ``token_document``,
  ``sentence_reordering``, ``sentence_distance``, ``discourse_relation``;
- ``ernie2``: all of ERNIE 2.0's streams under its continual schedule
  (experiments/configs/ernie2.py) at this scale.

Every arm gets the same pretraining FLOPs (``--budget=flops:7.3807e13``: the
MLM arm's 6000 steps of 32 x 128 tokens at 3.0M FLOPs per token,
compare_small.py's budget, where pretraining pays off on this task; a task
alone, with no MLM head, gets more steps: token_deletion 6,542) and the
same fine-tuning, under the same seeds, against the scratch control of
its architecture:

  python experiments/compare.py --out=runs/beyond_masking \
      --results=experiments/results/beyond_masking --seeds=3 \
      --budget=flops:7.3807e13 --control_repeats=4 --baseline=mlm \
      --finetune=experiments/configs/beyond_masking.py:arm=finetune \
      --finetune_lrs=3e-4,1e-3 \
      $(python experiments/configs/beyond_masking.py --runs)

(``--runs`` prints one ``--run NAME=SPEC`` per arm.) Capitalization
prediction needs an input that does not show case, so its arms (and
``ernie2``) read a lower-cased tokenizer of the same size: a different
architecture key, so they get their own scratch control.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(os.path.dirname(_HERE)) not in sys.path:
  # Run as a script from a checkout (--runs).
  sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

# pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import config_lib
# pylint: enable=g-import-not-at-top,wrong-import-position


def _sibling(name: str, arg: str):
  return config_lib.load_config_file(os.path.join(_HERE, f'{name}.py:{arg}'))

BASELINES = ('mlm', 'mlm_nsp', 'electra')
DENOISING = ('token_deletion', 'token_insertion', 'token_replacement',
             'token_shuffle', 'sentence_permutation', 'document_rotation')
ERNIE2_TASKS = ('capitalization', 'token_document', 'sentence_reordering',
                'sentence_distance', 'discourse_relation')
ARMS = (BASELINES + DENOISING + ERNIE2_TASKS
        + tuple(f'{t}+mlm' for t in ERNIE2_TASKS) + ('ernie2',))
# The demo corpus's 3% held out has no sentence that opens with a
# discourse marker; 10% has 39.
_DISCOURSE_EVAL_FRACTION = 0.1
# Tasks on instance layouts of their own (the rest read full sentences).
_LAYOUTS = {'sentence_distance': 'sentence_distance',
            'discourse_relation': 'discourse'}


def _small_bert():
  c = _sibling('compare_small', 'objective=bert')
  c.data.layout = 'full_sentences'
  c.objective.nsp_weight = 0.0
  return c


def _task_arm(task: str, with_mlm: bool):
  c = _small_bert()
  c.objective.mlm_weight = 1.0 if with_mlm else 0.0
  c.tasks[task].weight = 1.0
  c.data.layout = _LAYOUTS.get(task, 'full_sentences')
  if task == 'capitalization':
    c.data.tokenizer.lowercase = True
  if task == 'discourse_relation':
    c.data.eval_fraction = _DISCOURSE_EVAL_FRACTION
  return c


def _ernie2_arm():
  c = _small_bert()
  e = _sibling('ernie2', 'size=demo')
  for key in ('name', 'schedule', 'b2', 'eps', 'weight_decay'):
    c.optimizer[key] = e.optimizer[key]
  c.data.tokenizer.lowercase = True
  c.data.eval_fraction = _DISCOURSE_EVAL_FRACTION
  c.masking.strategy = e.masking.strategy
  for name in e.continual.streams:
    for task in e.continual.streams[name].tasks:
      c.tasks[task].weight = 1.0
  c.continual.stage_steps = tuple(
      round(f * c.total_steps) for f in (1 / 3, 1 / 3)) + (
          c.total_steps - 2 * round(c.total_steps / 3),)
  c.continual.streams = e.continual.streams
  c.model.task_type_vocab_size = e.model.task_type_vocab_size
  return c


def get_config(arg=None):
  args = config_lib.parse_arg(arg, arm='mlm')
  arm = args['arm']
  if arm == 'finetune':
    return _sibling('compare_small', 'finetune')
  if arm not in ARMS:
    raise ValueError(f'beyond_masking.py: arm={arm!r}; use one of {ARMS} '
                     'or finetune.')
  if arm == 'mlm':
    return _small_bert()
  if arm == 'mlm_nsp':
    return _sibling('compare_small', 'objective=bert')
  if arm == 'electra':
    return _sibling('compare_small', 'objective=electra')
  if arm == 'ernie2':
    return _ernie2_arm()
  task, _, mlm = arm.partition('+')
  return _task_arm(task, bool(mlm))


def run_flags() -> list[str]:
  """``--run NAME=SPEC`` for every arm, for experiments/compare.py."""
  path = os.path.join('experiments', 'configs', 'beyond_masking.py')
  return [f'--run {arm}={path}:arm={arm}' for arm in ARMS]


if __name__ == '__main__':
  if sys.argv[1:] != ['--runs']:
    sys.exit('usage: python experiments/configs/beyond_masking.py --runs')
  print(' '.join(run_flags()))
