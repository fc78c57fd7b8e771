"""ERNIE 2.0's sentence distance task (Sun et al., AAAI 2020, Sec. 4.2.2).

"An extension of the traditional NSP task ... modeled as a 3-class
classification problem. '0' represents that the two sentences are adjacent
in the same document, '1' represent that the two sentences are in the same
document, but not adjacent, and '2' represents that the two sentences are
from two different documents."

The instance builder makes the pairs and their class
(``data.layout='sentence_distance'``, data_pipelines/instances.py): BERT's
chunks and A/B split, a class drawn per chunk with chances
``probabilities`` (p0, p1, p2), B as NSP's IsNext (0), a run of sentences
of A's document with a sentence at least between it and A (1), or NSP's
random B (2). A chunk that cannot have its drawn class (a one-sentence
chunk drawing 0, or a document with no sentence for a class-1 B) is class
2, so class 2 is a little above p2 on short documents (the builder logs the
shares and the fallbacks of each plan). The label replaces NSP's in
``next_sentence_labels``; the head reads [CLS].
"""

from __future__ import annotations

import numbers

from data_pipelines.tasks.base import HostTask
from data_pipelines.tasks.base import register

DEFAULT_PROBABILITIES = (1 / 3, 1 / 3, 1 / 3)


def _check(params: dict, data_cfg, errors: list[str]) -> None:
  del data_cfg
  p = params.get('probabilities')
  if (not isinstance(p, (tuple, list)) or len(p) != 3
      or not all(isinstance(x, numbers.Real) and not isinstance(x, bool)
                 and x >= 0 for x in p)
      or abs(sum(p) - 1) > 1e-6):
    errors.append(
        f'tasks.sentence_distance.probabilities={p!r} must be three chances '
        '>= 0 summing to 1, of classes 0 (adjacent), 1 (same document, not '
        'adjacent) and 2 (other documents); use (1/3, 1/3, 1/3), ERNIE '
        "2.0's three classes evenly.")


SENTENCE_DISTANCE = register(HostTask(
    name='sentence_distance',
    head='sentence',
    num_classes=lambda params, max_seq_length: 3,
    label_field='next_sentence_labels',
    weight_field='',
    fields=lambda params, max_seq_length: {},
    apply=None,
    defaults=lambda: {'probabilities': DEFAULT_PROBABILITIES},
    check=_check,
    layout='sentence_distance',
    description='ERNIE 2.0 sentence distance: adjacent, same document or '
                'another document.'))
