r"""ERNIE 2.0: continual multi-task pretraining with a task embedding.

Sun et al., AAAI 2020, "ERNIE 2.0: A Continual Pre-Training Framework for
Language Understanding": one encoder learns a growing set of tasks, each
input carrying its task's id, whose embedding is added to the token,
position and segment embeddings (Sec. 3.3). Tasks are introduced stage by
stage and earlier ones stay in the mix (continual multi-task learning,
Sec. 3.2, Fig. 2). Here the streams (data_pipelines/continual.py), in the
order the paper's three groups are introduced:

  stage 0  word       word-aware: knowledge masking (masked LM over
                      ERNIE 1.0's phrase/entity units), capitalization
                      prediction, token-document relation
  stage 1  reorder    structure-aware: sentence reordering (sum_k k! orders)
           distance   structure-aware: sentence distance (3 classes)
  stage 2  discourse  semantic-aware: discourse relation (the marker that
                      joined two sentences, removed and predicted)

Each stream has its own task id (in order of first stage, then name: word
0, distance 1, reorder 2, discourse 3; fine-tuning reads row 0, the
word-aware stream's, trained in every stage) and an equal share of each
stage it is in.
IR relevance (query-title relevance from search logs) is left out: it
needs a search engine's logs, and no corpus here has queries.

``arg``: ``size`` (``base``, ``large`` or ``demo``: the demo corpus at the
demo's scale, 1200 steps in three stages of 400, 10% of it held out so
that the discourse stream has pairs to evaluate on), and ``masking``
(``entity``, the paper's knowledge masking, which needs entity/phrase
units: ``data.gazetteer_path`` or an annotated corpus, as
experiments/configs/ernie.py; or ``whole_word`` when there are none;
default ``entity``, ``whole_word`` for ``demo``).

  python -m bertjax.train --config=experiments/configs/ernie2.py:size=demo \
      --workdir=$WORK/ernie2-demo

  python -m bertjax.train --config=experiments/configs/ernie2.py:size=base \
      --workdir=$WORK/ernie2-base --config.data.gazetteer_path=entities.txt \
      --config.data.corpus.source=files \
      --config.data.corpus.path='/data/cased/*.txt'

Settings (Sec. 5.2, English): Adam with beta1 0.9, beta2 0.98, epsilon 1e-6
and weight decay 0.01 (PaddlePaddle/ERNIE's optimization.py: Paddle's
bias-corrected Adam, the decay applied to the weights apart from the
gradient, i.e. ``adamw``); peak learning rate 5e-5 with Paddle's noam decay
after 4,000 warmup steps (optimizer.schedule='noam'); batches of 393,216
tokens (3,072 sequences of 128). The input is lower-cased (capitalization
prediction needs an input that does not show case and a cased corpus).

Departures: the paper does not give its step counts or how it split them
between stages: here 1M steps in three equal stages. It warms up "for every
pre-training task"; here the schedule warms up once, at the start. The
streams' heads are linear layers on the encoder (the [CLS] state for the
sentence-level tasks), as ERNIE 1.0's; the paper does not describe its
heads.

Export: the encoder with its task embedding exports as transformers'
``ErnieModel`` (``use_task_id``; experiments/export.py).
"""

import ml_collections

from bertjax import config_lib
from bertjax.objectives import auxiliary

# (stream, its tasks, masked LM, layout, first stage).
STREAMS = (
    ('word', ('capitalization', 'token_document'), True, 'full_sentences', 0),
    ('reorder', ('sentence_reordering',), False, 'full_sentences', 1),
    ('distance', ('sentence_distance',), False, 'sentence_distance', 1),
    ('discourse', ('discourse_relation',), False, 'discourse', 2),
)
_MASKING = ('entity', 'whole_word')


def _streams() -> ml_collections.ConfigDict:
  out = ml_collections.ConfigDict()
  for name, tasks, mlm, layout, first in STREAMS:
    s = auxiliary.stream_defaults()
    s.tasks, s.mlm, s.layout, s.first_stage = tasks, mlm, layout, first
    out[name] = s
  return out


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base', masking='')
  size = args['size']
  if size not in ('base', 'large', 'demo'):
    raise ValueError(f'ernie2.py: size={size!r}; use base, large or demo.')
  masking = args['masking'] or ('whole_word' if size == 'demo' else 'entity')
  if masking not in _MASKING:
    raise ValueError(f'ernie2.py: masking={masking!r}; use one of '
                     f'{_MASKING}.')
  if size == 'demo':
    c = config_lib.demo_config()
    # The demo corpus's 3% held out has no sentence that opens with a
    # discourse marker; 10% has 39 (and 372 for training).
    c.data.eval_fraction = 0.1
  else:
    c = config_lib.bert_paper_config(size, 1)
    c.batch_size = 3072
    c.total_steps = 1_000_000
    c.num_train_steps = 0
    c.optimizer.learning_rate = 5e-5
    c.optimizer.warmup_steps = 4000
  c.optimizer.name = 'adamw'
  c.optimizer.schedule = 'noam'
  c.optimizer.b2 = 0.98
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.01
  c.data.tokenizer.lowercase = True
  c.data.layout = 'full_sentences'
  c.objective.nsp_weight = 0.0
  c.masking.strategy = masking
  for name in ('capitalization', 'token_document', 'sentence_reordering',
               'sentence_distance', 'discourse_relation'):
    c.tasks[name].weight = 1.0
  third = c.total_steps // 3
  c.continual.stage_steps = (third, third, c.total_steps - 2 * third)
  c.continual.streams = _streams()
  c.model.task_type_vocab_size = len(STREAMS)
  return c
