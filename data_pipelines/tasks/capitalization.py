"""ERNIE 2.0's capitalization prediction (Sun et al., AAAI 2020, Sec. 4.2.1).

"Capitalized words usually have certain specific semantic information
compared to other words in sentences. The cased model has some advantages
in tasks like named entity recognition while the uncased model is more
suitable for some other tasks. To combine the advantages of both models,
we add a task to predict whether the word is capitalized or not."

Per word (its first token, ``word_starts``): 1 when the first cased
character of its original text is upper case ("Paris", "(Paris", "USA";
not "iPhone", "2nd"), else 0. The input must not show the case, so the
task needs a case-folding tokenizer (``data.tokenizer.lowercase=True``,
SentencePiece's ``nmt_nfkc_cf``); pre-tokenization then records each
token's flag from the text it came from (the records' ``capitalized``,
``tokenizer.capitalized_words``), and a batch carries it
(``instances.materialize_batch``). With a tokenizer that does not
case-fold, the records' flags are all False: ``check_has_case`` refuses
such data, as it does a corpus with no capitalized word, on the eval
batches.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from data_pipelines import pretokenize
from data_pipelines.tasks.base import register
from data_pipelines.tasks.base import token_task

LABELS = 'capitalization_labels'
WEIGHTS = 'capitalization_weights'


def capitalization_fields(batch: dict, params: dict, seed: int) -> dict:
  """The task's fields of a batch of instances.

  Args:
    batch: ``capitalized`` bool [B, L], ``word_starts`` bool [B, L] and
      ``sentence_ids`` int32 [B, L] (-1 on [CLS], [SEP] and padding).
    params: the task's knobs (none used).
    seed: the data seed (no draws).

  Returns:
    A new dict: ``batch`` and ``capitalization_labels`` int32 [B, L] (1 on
    the first token of a capitalized word), ``capitalization_weights``
    float32 [B, L] (1 on the first token of every word, [CLS], [SEP] and
    padding excluded: one label per word).
  """
  del params, seed
  out = dict(batch)
  out[LABELS] = np.asarray(batch['capitalized']).astype(np.int32)
  out[WEIGHTS] = (np.asarray(batch['word_starts'], bool)
                  & (np.asarray(batch['sentence_ids']) >= 0)
                  ).astype(np.float32)
  return out


def check_has_case(batches: dict | Iterable[dict]) -> int:
  """Refuses data with no capitalized word: run on the eval batches.

  Args:
    batches: a batch or batches holding ``capitalization_labels`` and
      ``capitalization_weights`` (``capitalization_fields``' output), or
      else ``capitalized`` and ``word_starts``, [B, L] each.

  Returns:
    The capitalized words seen (> 0).

  Raises:
    pretokenize.DataError: none of the batches' words is capitalized: the
      corpus is lower-cased, or the tokenizer does not case-fold (its
      records then hold no capitalization).
  """
  if isinstance(batches, dict):
    batches = (batches,)
  capitalized = words = 0
  for batch in batches:
    if LABELS in batch:
      weights = np.asarray(batch[WEIGHTS]) > 0
      labels = np.asarray(batch[LABELS]) > 0
    else:
      weights = np.asarray(batch['word_starts'], bool)
      labels = np.asarray(batch['capitalized'], bool)
    capitalized += int((labels & weights).sum())
    words += int(weights.sum())
  if not capitalized:
    raise pretokenize.DataError(
        f'capitalization prediction on a lower-cased corpus: none of the '
        f'{words} words of the eval batches is capitalized. Use a cased '
        'corpus and a tokenizer that case-folds (data.tokenizer.lowercase='
        'True trains one; a data.tokenizer.model_path must use '
        "SentencePiece's nmt_nfkc_cf normalization, as the records hold the "
        'case only then), or set --config.tasks.capitalization.weight=0.')
  return capitalized


def _check(params: dict, data_cfg, errors: list[str]) -> None:
  del params
  if not data_cfg.tokenizer.get('lowercase', False):
    errors.append(
        'tasks.capitalization.weight > 0 with data.tokenizer.lowercase='
        'False: the input would show the case that the task predicts. Set '
        '--config.data.tokenizer.lowercase=True (a tokenizer given by '
        "data.tokenizer.model_path must case-fold too: SentencePiece's "
        'nmt_nfkc_cf normalization).')


CAPITALIZATION = register(token_task(
    'capitalization', capitalization_fields,
    corrupts=False,
    token_facts=True,
    check=_check,
    check_data=check_has_case,
    description='ERNIE 2.0 capitalization: is the word capitalized (the '
                'input case-folded)?'))
