"""SpanBERT: span masking plus the span boundary objective (SBO).

Joshi et al. 2020, "SpanBERT", Sec. 3.2 and 4 (the paper's run): the data,
masking and optimizer of span_masking.py (spans of Geometric(0.2) words
clipped to [1, 10], 80/10/10 once per span, unigram random tokens, one
512-token segment, no NSP, Adam epsilon 1e-8, lr 1e-4, 2.4M steps), and the
SBO head: each token of a masked span is also predicted from the span's
boundary states x_{s-1} and x_{e+1} and a relative-position embedding (200
positions), through two layers of Linear -> GELU -> LayerNorm and the
decoder tied to the word embeddings; loss = MLM + SBO (weight 1.0).

  python -m bertjax.train --config=experiments/configs/spanbert.py \
      --workdir=$WORK/spanbert-base --config.data.corpus.source=files \
      --config.data.corpus.path='/data/corpus/*.txt'

Departures (as span_masking.py): dynamic masking, spans start uniformly over
words rather than over tokens. span_masking.py is this run without SBO, the
paper's own ablation.
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
  c.model.sbo_positions = 200
  return c
