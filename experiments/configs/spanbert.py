"""SpanBERT: span masking plus the span boundary objective (SBO).

Joshi et al. 2020, "SpanBERT", Sec. 3.2 and 4 (the paper's run): the data,
masking and optimizer of span_masking.py (spans of Geometric(0.2) words
clipped to [1, 10], 80/10/10 once per span, unigram random tokens, one
512-token segment, no NSP, Adam epsilon 1e-8, lr 1e-4, 2.4M steps), and the
SBO head: each token of a masked span is also predicted from the span's
boundary states x_{s-1} and x_{e+1} and a relative-position embedding,
through two layers of Linear -> GELU -> LayerNorm and the decoder tied to
the word embeddings; loss = MLM + SBO (weight 1.0).

Reference code: facebookresearch/SpanBERT, pretraining/ (its README's
command: --pair-loss-weight 1.0 --max-pair-targets 15, and the default
--pair-positional-embedding-size 200): the head is pair_bert.py's
``BertPairTargetPredictionHead`` and ``MLPWithLayerNorm`` (15 relative
positions embedded in 200 dimensions, [x_{s-1}; x_{e+1}; p] -> H);
the loss criterions/spanbert_loss.py's ``NoNSPPairLoss``: the MLM mean
plus the SBO sum divided by the number of SBO targets + 1
(objective.sbo_count_offset=1.0); the optimizer and schedule as
span_masking.py says.

  python -m bertjax.train --config=experiments/configs/spanbert.py \
      --workdir=$WORK/spanbert-base --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Departures: as span_masking.py, dynamic masking, spans start uniformly
over words rather than over tokens. SpanBERT's trainer divides the gradient
of this loss, already a mean, once more by the masked tokens per GPU
(``multiply_grads(world_size / sample_size)``, not turned off by its
command); bertjax does not, as that factor depends on the reference's 32
GPUs: under Adam it changes only how large epsilon and the clipping norm
are against the gradient. Tokens of a span past its 15th have no SBO
target in SpanBERT (its pairs are cut at 15); here they are predicted
from the 15th position. Adjacent masked spans are merged into one
boundary pair and one 80/10/10 draw by SpanBERT, not here. A span at the first or last token of
its block has no SBO target in SpanBERT (``span_masking``: ``start >
lower_limit and end < upper_limit``); here [CLS] or [SEP] is its
boundary. span_masking.py is this run without
SBO, the paper's own ablation.
"""

import importlib.util
import os

_SPAN_MASKING = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             'span_masking.py')


def get_config(arg=None):
  spec = importlib.util.spec_from_file_location('span_masking', _SPAN_MASKING)
  span_masking = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(span_masking)
  c = span_masking.get_config(arg)
  c.objective.sbo_weight = 1.0
  c.objective.sbo_count_offset = 1.0
  c.model.sbo_positions = 15
  c.model.sbo_position_width = 200
  return c
