"""Word starts and unit labels from spans supplied with the data.

Annotated documents (``corpus.Document.spans``, from JSON Lines) carry
character spans per sentence. After tokenizing, each token is placed by its
last character (``Tokenizer.encode_with_offsets``) and:

* ``word`` spans replace the tokenizer's word starts: the tokens inside one
  span form one word, and the token after a span starts a new word. Tokens
  outside every word span keep the tokenizer's flags. This is how a user
  brings their own segmentation (e.g. a Chinese word segmenter's output)
  for whole-word, n-gram, span and entity masking.
* ``entity`` and ``phrase`` spans become units (labels as in gazetteer.py),
  widened to whole words so that a unit never splits a word. Nested or
  overlapping units keep the first (earliest start, then longest).
"""

from __future__ import annotations

import numpy as np

from data_pipelines import gazetteer as gazetteer_lib


def has_units(spans) -> bool:
  """Do a document's spans (one list per sentence) mark any unit?"""
  return any(kind != 'word' for sentence in spans for _, _, kind in sentence)


def token_labels(ends: np.ndarray, spans, word_starts: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(word starts, unit labels) of one sentence's tokens.

  Args:
    ends: per token, the character offset it ends before.
    spans: the sentence's ``(start, end, kind)`` character spans, sorted by
      start.
    word_starts: the tokenizer's word-start flags of the tokens.

  Returns:
    bool [n] word starts and int8 [n] unit labels.
  """
  n = len(ends)
  anchor = np.asarray(ends, np.int64) - 1
  word_starts = np.array(word_starts, bool)
  words = np.array([(a, b) for a, b, kind in spans if kind == 'word'],
                   np.int64).reshape(-1, 2)
  if len(words) and n:
    idx = np.searchsorted(words[:, 0], anchor, 'right') - 1
    inside = (idx >= 0) & (anchor < words[np.maximum(idx, 0), 1])
    word = np.where(inside, idx, -1)
    previous = np.concatenate([[-2], word[:-1]])
    word_starts = np.where(inside, word != previous,
                           word_starts | (previous >= 0))
  if n:
    word_starts[0] = True  # A sentence starts a word.
  labels = np.zeros(n, np.int8)
  word_id = np.cumsum(word_starts) - 1
  for a, b, kind in spans:
    if kind == 'word':
      continue
    members = np.flatnonzero((anchor >= a) & (anchor < b))
    if not members.size:
      continue
    first = np.searchsorted(word_id, word_id[members[0]], 'left')
    end = np.searchsorted(word_id, word_id[members[-1]], 'right')
    if labels[first:end].any():
      continue  # Overlaps a unit already placed.
    begin = gazetteer_lib.KINDS[kind]
    labels[first] = begin
    labels[first + 1:end] = begin + 1
  return word_starts, labels
