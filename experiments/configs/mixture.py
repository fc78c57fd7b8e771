"""A corpus mixture: the embedded corpus and your own text files.

The two corpora are sampled with probabilities proportional to their
training tokens to the power S = 0.7, multilingual BERT's exponential
smoothing (google-research/bert, multilingual.md): the smaller corpus is
seen more often than its natural share, the larger one less. One tokenizer is trained on
both (data_pipelines/mixture.py); the start of the run prints each
component's tokens, natural share and sampled share.

  python -m bertjax.train --config=experiments/configs/mixture.py \
      --workdir=/tmp/bertjax-mixture \
      --config.data.mixture.files.path='/data/my_corpus/*.txt'

``--config.data.mixture.files.path`` is required (the run stops with an
error naming it otherwise); ``files.text_format`` is
``sentence_per_line`` (a blank line between documents) or ``paragraphs``.
``--config.data.mixture_exponent`` changes S: 1 natural shares, 0 uniform.

``arg``: ``size=demo`` (default) trains the demo's tiny model
(configs/demo.py) on a CPU in minutes; ``size=base`` or ``size=large`` the
BERT paper's phase-1 run (configs/bert.py).

Reference code: google-research/bert (multilingual.md's smoothing; the
optimizer and loss of bert.py).
"""

from bertjax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='demo')
  if args['size'] == 'demo':
    c = config_lib.demo_config()
  else:
    c = config_lib.bert_paper_config(args['size'], 1)
  c.data.mixture.embedded = config_lib.corpus_config(source='embedded')
  c.data.mixture.files = config_lib.corpus_config(source='files', path='')
  c.data.mixture_exponent = 0.7
  return c
