"""BERT with ALBERT's n-gram masking, otherwise the BERT paper's run.

Lan et al. 2020, "ALBERT", Sec. 4.1 and google-research/albert
create_pretraining_data.py (--ngram=3): masked units are n-grams of whole
words with n <= 3 and P(n) proportional to 1/n (6/11, 3/11, 2/11); start
words are visited in random order and an n-gram that would overshoot the
budget is shortened; 80/10/10 per token. The model, data and optimizer are
BERT's (bert.py), so the only difference from bert.py is the masking.

Reference code: google-research/albert create_pretraining_data.py
``create_masked_lm_predictions`` (the n-gram units); the optimizer and loss
are google-research/bert's (bert.py).

  python -m bertjax.train \
      --config=experiments/configs/ngram_masking.py:size=base \
      --workdir=$WORK/bert-ngram-base --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

The full ALBERT recipe (factorized embeddings, shared layers, SOP, LAMB) is a
separate preset.
"""

from bertjax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base', phase='1')
  c = config_lib.bert_paper_config(args['size'], int(args['phase']))
  c.masking.strategy = 'ngram'
  c.masking.max_ngram = 3
  return c
