"""ERNIE 1.0's knowledge masking on the BERT encoder.

Sun et al. 2019, "ERNIE: Enhanced Representation through Knowledge
Integration", Sec. 3.2 and PaddlePaddle/ERNIE: masking in three levels,
basic (word), phrase and entity, where a whole phrase or entity is one unit
and 15% of the tokens are predicted; the paper trains the levels in stages.
Entity and phrase boundaries come from spans stored with the data (a JSON
Lines corpus, ``"spans": [[start, end, "entity"], ...]``, e.g. from an NER
tagger and a chunker, as the paper used; data_pipelines/corpus.py) or from
a gazetteer file (one entity per line, or ``phrase<TAB>...``), matched on
word boundaries while pre-tokenizing (data_pipelines/gazetteer.py). The
model, data and optimizer are BERT's (bert.py).

Reference code: PaddlePaddle/ERNIE ernie/batching.py ``mask`` (a unit is
chosen with probability 0.15 at its first token, then each of its tokens
is masked, replaced or kept); the optimizer and loss are google-research/
bert's (bert.py).

``arg``: ``size`` and ``stage``: ``word``, ``phrase``, ``entity`` (one
level, as the paper's stages, run one after another with
``--config.init_from``) or ``mixed`` (each row draws a level uniformly).

  python -m bertjax.train --config=experiments/configs/ernie.py:stage=mixed \
      --workdir=$WORK/ernie-base --config.data.gazetteer_path=/data/entities.txt \
      --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

  # Or with the units annotated in the data:
  python -m bertjax.train --config=experiments/configs/ernie.py:stage=mixed \
      --workdir=$WORK/ernie-base --config.data.corpus.source=files \
      --config.data.corpus.text_format=jsonl \
      --config.data.corpus.path='/data/annotated/*.jsonl'

Departures: ERNIE 1.0 trained on Chinese with dialogue data and a DLM task;
here only the masking is reproduced.
"""

from bertjax import config_lib

_STAGES = {'word': (1.0, 0.0, 0.0), 'phrase': (0.0, 1.0, 0.0),
           'entity': (0.0, 0.0, 1.0), 'mixed': (1 / 3, 1 / 3, 1 / 3)}


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base', stage='mixed')
  if args['stage'] not in _STAGES:
    raise ValueError(f'ernie.py: stage={args["stage"]!r}; use one of '
                     f'{sorted(_STAGES)}.')
  c = config_lib.bert_paper_config(args['size'], 1)
  c.masking.strategy = 'entity'
  c.masking.entity_mixture = _STAGES[args['stage']]
  return c
