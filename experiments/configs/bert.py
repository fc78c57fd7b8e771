"""BERT pretraining with MLM + NSP, the paper's settings.

Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers
for Language Understanding", Sec. 3.1 and Appendix A.2; data and optimizer
details from google-research/bert (create_pretraining_data.py,
run_pretraining.py, optimization.py):

* batch 256, 1M steps, Adam(beta1 0.9, beta2 0.999, eps 1e-6) without bias
  correction, decoupled weight decay 0.01 (not on LayerNorm or biases),
  global-norm clip 1.0, peak lr 1e-4, 10k warmup steps, linear decay from
  step 0 to step 1M (the script's flag default 5e-5 is not the paper's);
* 90% of the steps at sequence length 128 (20 predictions), then 10% at 512
  (80 predictions); the schedule spans both phases;
* static masking, dupe_factor 10, short_seq_prob 0.1, masked_lm_prob 0.15,
  80/10/10, NSP with 50% random-document negatives; dropout 0.1.

Reference code (google-research/bert), which the optimizer, schedule,
clipping and loss follow step for step (tests/experiments/
test_fidelity.py): optimization.py ``create_optimizer`` (the schedule, the
clip) and ``AdamWeightDecayOptimizer.apply_gradients`` (optimizer.name=
'bert_adamw', decay_mask='bert': not "LayerNorm", "layer_norm", "bias");
run_pretraining.py ``get_masked_lm_output`` (sum / (count + 1e-5)) and
``get_next_sentence_output`` (the mean), added with weight 1.

``arg`` is a comma-separated list of ``key=value``: ``size`` (any of
bertjax.models.bert.SIZES, default base) and ``phase`` (1 or 2).

Phase 1 (steps 0 to 900k at 128 tokens):

  python -m bertjax.train --config=experiments/configs/bert.py:size=base \
      --workdir=$WORK/bert-base-p1 --config.data.corpus.source=files \
      --config.data.corpus.path='/data/wiki_books/*.txt'

Phase 2 (steps 900k to 1M at 512 tokens, continuing phase 1's state):

  python -m bertjax.train \
      --config=experiments/configs/bert.py:size=base,phase=2 \
      --workdir=$WORK/bert-base-p2 --config.init_from=$WORK/bert-base-p1 \
      --config.data.corpus.source=files \
      --config.data.corpus.path='/data/wiki_books/*.txt'

Departures: the tokenizer is a SentencePiece unigram model of 30522 pieces
trained on the corpus (BERT used a 30522-piece WordPiece vocabulary); random
replacement tokens never include specials. Both are documented in
data_pipelines.
"""

from bertjax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='base', phase='1')
  return config_lib.bert_paper_config(args['size'], int(args['phase']))
