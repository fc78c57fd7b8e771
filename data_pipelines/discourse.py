"""ERNIE 2.0's discourse relation pairs: adjacent sentences whose second
opens with an explicit discourse marker.

ERNIE 2.0 (Sun et al., AAAI 2020, Sec. 4.2.3) predicts "the semantic or
rhetorical relation between two sentences", trained on Sileo et al.'s
(NAACL 2019) Discovery data: sentence pairs joined by an explicit discourse
marker, the marker removed and used as the label. Here a pair (s - 1, s) of
adjacent sentences of one document, where sentence s begins with a marker
of a list, is the instance [CLS] s-1 [SEP] s-without-its-marker [SEP],
labelled with the marker's index in the list (data.layout=discourse,
instances.py).

The list is data: one marker per line, '#' lines are comments
(``data/discourse_markers_en.txt``, the shipped English list, or any file).
Matching is on token ids, so training reads no text: ``discourse_marker_ids``
tokenizes each marker in the ways it can open a sentence:

- with its first letter upper-cased (as written at a sentence start) and
  lower-cased (a sentence that the splitter cut after a semicolon, say);
- each followed by a comma, and bare. Discovery mines adverbial markers
  followed by a comma; here the comma is optional, as conjunctions (but, so,
  because) rarely take one, and is removed with the marker when present.
  The comma form is tokenized as one text (``'However,'``), so it is the
  right sequence whether the tokenizer splits the comma off or merges it
  into the marker's last piece.

A sentence opens with a marker when its first tokens equal one of these
sequences (the longest that matches), the token after them starts a word (so
'So' does not match 'Sometimes' when both begin with the pieces '▁S', 'o'),
and at least one token remains. A sequence holding [UNK] (the tokenizer
cannot spell the marker) is dropped, as it would match unknown words; so is
a sequence that an earlier marker of the list already produced (the earlier
marker keeps it). What remains as noise: a marker word in another sense
("So many ...", "Still water ...") matches too.

``find_candidates`` finds the pairs in one pass over the split: it reads
every record of the split once, in blocks of whole documents, and matches
a block at once (numpy). The reads dominate, and are fewer than one NSP
epoch's (which reads about a record per instance): 0.06 s for the demo
corpus's 581 documents, minutes for millions of documents. It runs once per
split, when the instance builder is made (before Grain's workers start:
their pickled copies of the builder keep the pairs). Every data epoch has
the same instances, in a new order.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np

from bertjax import storage
from data_pipelines import pretokenize
from data_pipelines.tokenizer import UNK_ID

SHIPPED_MARKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               'data', 'discourse_markers_en.txt')
# Sentences that find_candidates matches at once (whole documents, at least
# one): its memory is a few hundred bytes a sentence (windows of the longest
# sequence's width) plus the block's records.
_BLOCK_SENTENCES = 1 << 16


def markers_file(path: str = '') -> str:
  """The list file that ``path`` names ('' = the shipped English list)."""
  return path or SHIPPED_MARKERS


def read_markers(path: str = '') -> tuple[str, ...]:
  """The markers of a list file, in order ('' = the shipped English list).

  Lines are stripped; blank lines and lines starting with '#' are skipped.
  A marker's label is its index in the result.

  Raises:
    ValueError: the file does not exist, holds no marker, or holds one
      twice (ignoring case: both would be matched by the same tokens).
  """
  path = markers_file(path)
  if not storage.isfile(path):
    raise ValueError(f'discourse markers file {path!r} does not exist; use '
                     "a text file of one marker per line, or '' for the "
                     f'shipped English list ({SHIPPED_MARKERS}).')
  lines = [line.strip() for line in storage.read_text(path).splitlines()]
  markers = tuple(x for x in lines if x and not x.startswith('#'))
  if not markers:
    raise ValueError(f'discourse markers file {path!r} holds no marker; '
                     'write one marker per line (lines starting with # are '
                     'comments).')
  counts = collections.Counter(m.lower() for m in markers)
  twice = sorted(m for m, n in counts.items() if n > 1)
  if twice:
    raise ValueError(f'discourse markers file {path!r} lists {twice} more '
                     'than once; a marker is one class: list each once.')
  return markers


def marker_variants(marker: str) -> tuple[str, ...]:
  """How ``marker`` can open a sentence: first letter upper-cased, and
  lower-cased (one of them when they are the same)."""
  variants = (marker[:1].upper() + marker[1:], marker.lower())
  return tuple(dict.fromkeys(variants))


def discourse_marker_ids(tokenizer, path: str = ''
                         ) -> tuple[tuple[tuple[int, ...], ...],
                                    tuple[str, ...]]:
  """The token sequences that count as each marker of a list.

  Args:
    tokenizer: a ``tokenizer.Tokenizer`` (anything whose ``encode(texts)``
      gives a token-id array per text).
    path: the markers file ('' = the shipped English list).

  Returns:
    (per marker, in list order, its token sequences: the variants of
    ``marker_variants`` each with a trailing comma and bare, minus those
    with [UNK] and those an earlier marker has; the markers). The label of
    a sequence is its marker's index, so a marker may keep no sequence
    (then it is never matched) and the labels still follow the list. This
    is ``InstanceConfig.discourse_markers``.
  """
  markers = read_markers(path)
  texts = [(label, text) for label, marker in enumerate(markers)
           for variant in marker_variants(marker)
           for text in (f'{variant},', variant)]
  encoded = tokenizer.encode([text for _, text in texts])
  per_marker: list[list[tuple[int, ...]]] = [[] for _ in markers]
  seen = set()
  for (label, _), ids in zip(texts, encoded):
    sequence = tuple(int(i) for i in ids)
    if sequence and UNK_ID not in sequence and sequence not in seen:
      seen.add(sequence)
      per_marker[label].append(sequence)
  return tuple(tuple(s) for s in per_marker), markers


@dataclasses.dataclass(frozen=True)
class Candidates:
  """The discourse pairs of a split: sentence s opens with a marker, and
  the pair is (s - 1, s).

  Attributes:
    sentence: int64 [N], the global index of s (into
      ``DocumentIndex.sentence_lengths``), increasing.
    label: int32 [N], the marker's index in its list.
    marker_length: int64 [N], tokens at s's front that are the marker (and
      its comma), removed from the instance.
    sentences_scanned: the sentences that have a previous sentence in their
      document (every one that could open a pair).
  """
  sentence: np.ndarray
  label: np.ndarray
  marker_length: np.ndarray
  sentences_scanned: int

  def __len__(self) -> int:
    return len(self.sentence)


@dataclasses.dataclass(frozen=True)
class _MarkerTable:
  """The marker sequences, longest first (list order within a length).

  Attributes:
    tokens: int64 [K, M], padded with -1.
    length: int64 [K], tokens of each sequence.
    label: int32 [K], its marker's index.
  """
  tokens: np.ndarray
  length: np.ndarray
  label: np.ndarray

  @classmethod
  def build(cls, markers) -> '_MarkerTable':
    rows = sorted(((len(s), label, s) for label, sequences in
                   enumerate(markers) for s in sequences if s),
                  key=lambda row: -row[0])
    width = rows[0][0] if rows else 1
    tokens = np.full((len(rows), width), -1, np.int64)
    for k, (n, _, sequence) in enumerate(rows):
      tokens[k, :n] = sequence
    return cls(tokens, np.array([r[0] for r in rows], np.int64),
               np.array([r[1] for r in rows], np.int32))

  def match(self, ids: np.ndarray, word_starts: np.ndarray,
            starts: np.ndarray, lengths: np.ndarray):
    """The marker that opens each sentence of a token buffer.

    Args:
      ids: int [T], the tokens; word_starts: bool [T], their flags.
      starts: int64 [S], each sentence's first token in ``ids``.
      lengths: int [S], its tokens.

    Returns:
      (label int32 [S], -1 where none; marker tokens int64 [S], 0 where
      none).
    """
    width = self.tokens.shape[1]
    cols = np.arange(width + 1)
    inside = cols < np.asarray(lengths)[:, None]          # [S, M + 1]
    pos = np.where(inside, starts[:, None] + cols, 0)
    window = np.where(inside, ids[pos] if len(ids) else 0, -2)
    starts_word = inside & (word_starts[pos] if len(ids) else False)
    # Only sentences whose first token opens a sequence are compared.
    maybe = np.flatnonzero(np.isin(window[:, 0], self.tokens[:, 0]))
    label = np.full(len(starts), -1, np.int32)
    marker_length = np.zeros(len(starts), np.int64)
    if not len(maybe):
      return label, marker_length
    same = ((window[maybe, None, :width] == self.tokens[None])
            | (np.arange(width) >= self.length[:, None])[None])
    # The token after the marker starts a word: the marker is whole words
    # and something follows it.
    hit = same.all(-1) & starts_word[maybe][:, self.length]   # [S', K]
    first = np.argmax(hit, axis=1)
    found = hit[np.arange(len(maybe)), first]
    label[maybe[found]] = self.label[first[found]]
    marker_length[maybe[found]] = self.length[first[found]]
    return label, marker_length


def find_candidates(source, index: pretokenize.DocumentIndex,
                    markers: tuple[tuple[tuple[int, ...], ...], ...],
                    markers_path: str = '') -> Candidates:
  """The discourse pairs of a split, in one read of its documents.

  Args:
    source: the split's records (``source[d]``: ``token_ids``,
      ``word_starts``).
    index: its ``DocumentIndex``.
    markers: per marker its token sequences (``discourse_marker_ids``).
    markers_path: the list they came from, for the error message.

  Raises:
    pretokenize.DataError: no sentence opens with a marker.
  """
  table = _MarkerTable.build(markers)
  offsets = index.document_offsets
  csum = np.concatenate([[0], np.cumsum(index.sentence_lengths,
                                        dtype=np.int64)])
  parts = [_scan_block(source, index, csum, lo, hi, table)
           for lo, hi in _blocks(offsets)]
  sentence, label, marker_length = (
      np.concatenate([p[i] for p in parts] + [np.zeros(0, dtype)])
      for i, dtype in enumerate((np.int64, np.int32, np.int64)))
  scanned = int(np.maximum(np.diff(offsets) - 1, 0).sum())
  if not len(sentence):
    raise pretokenize.DataError(
        f'data.layout="discourse": none of the {scanned} sentences scanned '
        f'(those with a previous sentence, in {index.num_documents} '
        'documents) opens with a marker of '
        f'{markers_file(markers_path)} ({len(table.length)} token sequences '
        f'of {len(markers)} markers). A discourse task on a corpus with no '
        'markers found has nothing to learn: use a corpus of running prose '
        'in the list\'s language, or a markers file for the corpus\'s '
        'language (tasks.discourse_relation.markers_path), or raise '
        'data.eval_fraction if this is a small evaluation split, or turn the'
        ' task off (tasks.discourse_relation.weight=0 and another '
        'data.layout).')
  return Candidates(sentence, label, marker_length, scanned)


def _blocks(offsets: np.ndarray):
  """(first, end) documents of consecutive blocks of about
  ``_BLOCK_SENTENCES`` sentences."""
  lo, num_documents = 0, len(offsets) - 1
  while lo < num_documents:
    hi = int(np.searchsorted(offsets, offsets[lo] + _BLOCK_SENTENCES,
                             'right')) - 1
    hi = min(max(hi, lo + 1), num_documents)
    yield lo, hi
    lo = hi


def _scan_block(source, index: pretokenize.DocumentIndex, csum: np.ndarray,
                lo: int, hi: int, table: _MarkerTable):
  """(sentence, label, marker_length) of the pairs of documents [lo, hi)."""
  offsets = index.document_offsets
  records = [source[d] for d in range(lo, hi)]
  ids = np.concatenate([np.asarray(r['token_ids'], np.int64)
                        for r in records] + [np.zeros(0, np.int64)])
  word_starts = np.concatenate([np.asarray(r['word_starts'], bool)
                                for r in records] + [np.zeros(0, bool)])
  sentences = np.arange(offsets[lo], offsets[hi])
  # A document's first sentence has no previous sentence to pair with.
  sentences = sentences[~np.isin(sentences, offsets[lo:hi])]
  label, marker_length = table.match(
      ids, word_starts, csum[sentences] - csum[offsets[lo]],
      index.sentence_lengths[sentences])
  keep = label >= 0
  return sentences[keep], label[keep], marker_length[keep]
