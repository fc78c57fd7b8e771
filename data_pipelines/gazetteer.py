"""Entity and phrase units for ERNIE-style masking, from a gazetteer file.

The file holds one entity or phrase per line, optionally prefixed by its
kind and a tab (``phrase<TAB>in spite of``; no prefix means ``entity``).
While pre-tokenizing, each sentence's tokens are matched against the
tokenized entries, longest first, on word boundaries (a match starts and
ends where words start), and the matched tokens get unit labels:

  0 outside, 1 entity begins, 2 entity continues, 3 phrase begins,
  4 phrase continues

(ERNIE 1.0's ``seg_labels`` in spirit: unit boundaries stored next to the
tokens). Matching runs once per corpus, in the pre-tokenization pass.
"""

from __future__ import annotations

import collections
import io

import numpy as np

from bertjax import errors
from bertjax import storage
from data_pipelines import tokenizer as tokenizer_lib

OUTSIDE, ENTITY_BEGIN, ENTITY_INSIDE, PHRASE_BEGIN, PHRASE_INSIDE = range(5)
KINDS = {'entity': ENTITY_BEGIN, 'phrase': PHRASE_BEGIN}


class GazetteerError(errors.UserError, ValueError):
  """The gazetteer file cannot be used; the message says why."""


class Gazetteer:
  """Tokenized entries, indexed by first token, longest first."""

  def __init__(self, entries: list[tuple[str, str]],
               tokenizer: tokenizer_lib.Tokenizer):
    self._by_first = collections.defaultdict(list)
    encoded = tokenizer.encode([text for _, text in entries])
    for (kind, text), ids in zip(entries, encoded):
      if len(ids):
        self._by_first[int(ids[0])].append((tuple(int(i) for i in ids),
                                            KINDS[kind]))
    for candidates in self._by_first.values():
      candidates.sort(key=lambda c: -len(c[0]))
    self.num_entries = sum(len(c) for c in self._by_first.values())

  @classmethod
  def load(cls, path: str, tokenizer: tokenizer_lib.Tokenizer
           ) -> 'Gazetteer':
    entries = []
    try:
      with storage.open(path, 'rb') as f:
        lines = io.TextIOWrapper(f, encoding='utf-8', errors='replace')
        for number, line in enumerate(lines, 1):
          line = line.strip()
          if not line:
            continue
          kind, sep, text = line.partition('\t')
          if not sep:
            kind, text = 'entity', line
          if kind not in KINDS:
            raise GazetteerError(
                f'{path}:{number}: kind {kind!r}; use one of {sorted(KINDS)}'
                ' before a tab, or no prefix for an entity.')
          entries.append((kind, text.strip()))
    except OSError as e:
      raise GazetteerError(f'data.gazetteer_path={path!r}: {e}') from e
    if not entries:
      raise GazetteerError(f'data.gazetteer_path={path!r} has no entries.')
    return cls(entries, tokenizer)

  def label(self, ids: np.ndarray, word_starts: np.ndarray) -> np.ndarray:
    """int8 unit labels [len(ids)] for one sentence's tokens."""
    labels = np.zeros(len(ids), np.int8)
    tokens = ids.tolist()
    starts = word_starts.tolist() + [True]
    i, n = 0, len(tokens)
    while i < n:
      matched = 0
      if starts[i]:
        for entry, begin in self._by_first.get(tokens[i], ()):
          end = i + len(entry)
          if end <= n and starts[end] and tuple(tokens[i:end]) == entry:
            labels[i] = begin
            labels[i + 1:end] = begin + 1
            matched = len(entry)
            break
      i += matched or 1
    return labels
