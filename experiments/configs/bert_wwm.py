"""BERT with whole-word masking (BERT-wwm), otherwise the BERT paper's run.

Whole-word masking as released by google-research/bert (README, "Whole Word
Masking", 2019; create_pretraining_data.py --do_whole_word_mask) and studied
by Cui et al. 2019, "Pre-Training with Whole Word Masking for Chinese BERT":
when one piece of a word is chosen, all its pieces are masked; 80/10/10 is
decided per token; the count rule and every other setting are BERT's (see
bert.py).

Reference code: google-research/bert create_pretraining_data.py
``create_masked_lm_predictions`` (``do_whole_word_mask``); the optimizer
and loss are bert.py's (optimization.py, run_pretraining.py).

  python -m bertjax.train --config=experiments/configs/bert_wwm.py:size=base \
      --workdir=$WORK/bert-wwm-base --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Word boundaries come from the tokenizer (a piece starting with "▁" starts a
word). Departure from Cui et al.: they segment Chinese with LTP; here any
segmentation expressed as word-start flags in the pre-tokenized data is used
as it is.
"""

from bertjax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base', phase='1')
  c = config_lib.bert_paper_config(args['size'], int(args['phase']))
  c.masking.strategy = 'whole_word'
  return c
