"""Pretraining instances built on the fly from pre-tokenized documents.

Three layouts:

* ``nsp``: google-research/bert's ``create_instances_from_document``. Per
  document a target length (``max_seq_length - 3``, or with probability
  ``short_seq_prob`` a uniform length in [2, that]); sentences are gathered
  into chunks until the target is reached; each chunk splits at a random
  sentence into A and B; with probability 0.5 (always for a one-sentence
  chunk) B is replaced by sentences from a random other document and the
  unused sentences are put back for the next chunk; the pair is truncated
  from the longer side, front or back at random.
* ``sop``: ALBERT's sentence-order prediction (google-research/albert's
  ``create_instances_from_document`` with ``random_next_sentence=False``).
  Chunks and their A/B split are BERT's, from the same draws; with
  probability 0.5 a chunk's A and B are swapped (label 1, wrong order) and
  otherwise kept in order (label 0); the whole chunk is used either way. A
  one-sentence chunk has no B of its own: as in NSP it takes a random B from
  another document, labelled 1.
* ``full_sentences``: RoBERTa's FULL-SENTENCES. Whole sentences are packed
  contiguously, across document boundaries (a [SEP] marks each boundary), up
  to ``max_seq_length - 2`` tokens; no NSP.

Planning (which sentences form which instance) is vectorized over documents
and uses only the ``DocumentIndex``; documents are read when an instance is
materialized. All randomness is counter-based on (seed, data epoch, ...), so
an instance is a pure function of its index: Grain can fetch it from any
worker on any host, and a resumed run rebuilds exactly the same one.

Departure from google-research/bert and albert: a random B is drawn from a
document different from A's in one draw (the references try 10 times and may
fall back to the same document).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading

import grain
import numpy as np

from data_pipelines import counter_rng
from data_pipelines import pretokenize
from data_pipelines.counter_rng import Stream
from data_pipelines.tokenizer import CLS_ID, PAD_ID, SEP_ID

LAYOUTS = ('nsp', 'sop', 'full_sentences')
# Layouts of sentence pairs, [CLS] A [SEP] B [SEP], labelled per pair.
_PAIR_LAYOUTS = ('nsp', 'sop')
# Packing lanes: the sentence stream is packed in independent lanes of about
# this many instances each, so planning is a vectorized loop; each lane's last
# instance may be short (about 1 / (2 * _INSTANCES_PER_LANE) waste).
_INSTANCES_PER_LANE = 64


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
  layout: str = 'nsp'
  max_seq_length: int = 128
  short_seq_prob: float = 0.1


@dataclasses.dataclass(frozen=True)
class Plan:
  """Instances of one data epoch, as sentence ranges (struct of arrays).

  Global sentence indices refer to ``DocumentIndex.sentence_lengths``.
  A is sentences [start, a_end); B is [a_end, end) unless ``is_random``.
  ``swapped`` (SOP only) lays B out before A. For ``full_sentences``, the
  instance is [start, end) and may span documents.
  """
  document: np.ndarray     # int64 [N]
  start: np.ndarray        # int64 [N]
  a_end: np.ndarray        # int64 [N]
  end: np.ndarray          # int64 [N]
  is_random: np.ndarray    # bool  [N]
  target_length: np.ndarray  # int64 [N]
  swapped: np.ndarray      # bool  [N]

  def __len__(self) -> int:
    return len(self.start)


def _cumsum0(x: np.ndarray) -> np.ndarray:
  return np.concatenate([[0], np.cumsum(x, dtype=np.int64)])


def _ranks(counts: np.ndarray) -> np.ndarray:
  """0..counts[0]-1, 0..counts[1]-1, ...: each item's rank in its group."""
  return np.arange(int(np.sum(counts))) - np.repeat(_cumsum0(counts)[:-1],
                                                    counts)


# Chunk draws made at once by _plan_pairs: chunks per document, and in all.
_CHUNK_DRAW_BLOCK = 64
_CHUNK_DRAW_CELLS = 1 << 12


def plan_nsp(index: pretokenize.DocumentIndex, max_seq_length: int,
             short_seq_prob: float, seed: int, data_epoch: int) -> Plan:
  """BERT's NSP pairs of every document, vectorized over documents."""
  return _plan_pairs(index, max_seq_length, short_seq_prob, seed, data_epoch,
                     sentence_order=False)


def plan_sop(index: pretokenize.DocumentIndex, max_seq_length: int,
             short_seq_prob: float, seed: int, data_epoch: int) -> Plan:
  """ALBERT's SOP pairs of every document: BERT's chunks, from the same
  draws, with the coin that NSP uses for a random B deciding a swap."""
  return _plan_pairs(index, max_seq_length, short_seq_prob, seed, data_epoch,
                     sentence_order=True)


def _plan_pairs(index: pretokenize.DocumentIndex, max_seq_length: int,
                short_seq_prob: float, seed: int, data_epoch: int,
                sentence_order: bool) -> Plan:
  """BERT's chunking of every document; NSP or (``sentence_order``) SOP."""
  max_num_tokens = max_seq_length - 3
  csum = _cumsum0(index.sentence_lengths)
  num_docs = index.num_documents
  docs = np.arange(num_docs)
  u = counter_rng.uniform(seed, Stream.DOCUMENT_PLAN, data_epoch, docs, num=2)
  short = counter_rng.randint(2, max_num_tokens + 1, seed,
                              Stream.DOCUMENT_PLAN, data_epoch, docs, 2)
  target = np.where(u[:, 0] < short_seq_prob, short, max_num_tokens)
  pos = index.document_offsets[:-1].copy()
  doc_end = index.document_offsets[1:]
  columns = collections.defaultdict(list)
  active = docs[pos < doc_end]
  chunk_number = 0
  drawn, drawn_from = np.zeros((num_docs, 0, 2)), 0
  while active.size:
    p, e, t = pos[active], doc_end[active], target[active]
    q = np.searchsorted(csum, csum[p] + t, side='left')
    q = np.clip(q, p + 1, e)
    n = q - p
    # The chunk's two draws. Once few documents remain (the long ones), the
    # draws of several chunks come in one call, as one call per chunk would
    # dominate; while many do, a chunk at a time bounds the memory.
    if chunk_number - drawn_from >= drawn.shape[1]:
      block = max(1, min(_CHUNK_DRAW_BLOCK, _CHUNK_DRAW_CELLS // active.size))
      drawn = counter_rng.uniform(
          seed, Stream.CHUNK_PLAN, data_epoch, active[:, None],
          chunk_number + np.arange(block)[None, :], num=2)
      drawn_from = chunk_number
    v = drawn[:, chunk_number - drawn_from]
    a_len = np.where(n >= 2, 1 + np.minimum((v[:, 0] * (n - 1)).astype(
        np.int64), n - 2), 1)
    coin = v[:, 1] < 0.5
    if sentence_order:
      # Only a one-sentence chunk lacks a B of its own.
      is_random, swapped = n == 1, (n >= 2) & coin
    else:
      is_random, swapped = (n == 1) | coin, np.zeros(len(n), bool)
    for name, value in (('document', active), ('start', p),
                        ('a_end', p + a_len), ('end', q),
                        ('is_random', is_random), ('target_length', t),
                        ('swapped', swapped)):
      columns[name].append(value)
    # A random B puts the chunk's unused sentences back (BERT's i -= unused).
    nxt = np.where(is_random, p + a_len, q)
    pos[active] = nxt
    going_on = nxt < e
    active, drawn = active[going_on], drawn[going_on]
    chunk_number += 1
  return _to_plan(columns)


def plan_full_sentences(index: pretokenize.DocumentIndex,
                        max_seq_length: int) -> Plan:
  """RoBERTa's FULL-SENTENCES packing of the whole sentence stream."""
  max_num_tokens = max_seq_length - 2
  lengths = index.sentence_lengths.astype(np.int64).copy()
  # Each document after the first in an instance costs one [SEP].
  lengths[index.document_offsets[1:-1]] += 1
  csum = _cumsum0(lengths)
  tokens_per_lane = _INSTANCES_PER_LANE * max_num_tokens
  # Lanes start at document starts, about tokens_per_lane apart.
  doc_starts = index.document_offsets[:-1]
  lane_of_doc = csum[doc_starts] // tokens_per_lane
  first = np.flatnonzero(np.diff(lane_of_doc, prepend=-1) > 0)
  pos = doc_starts[first].astype(np.int64)
  lane_end = np.append(pos[1:], len(lengths))
  columns = collections.defaultdict(list)
  active = np.arange(len(pos))[pos < lane_end]
  while active.size:
    p, e = pos[active], lane_end[active]
    q = np.searchsorted(csum, csum[p] + max_num_tokens, side='right') - 1
    q = np.clip(q, p + 1, e)  # A sentence too long alone is truncated.
    for name, value in (('start', p), ('end', q)):
      columns[name].append(value)
    pos[active] = q
    active = active[q < e]
  n = sum(len(x) for x in columns['start'])
  columns['document'] = [np.searchsorted(
      index.document_offsets, np.concatenate(columns['start']), 'right') - 1]
  columns['a_end'] = columns['end']
  columns['is_random'] = [np.zeros(n, bool)]
  columns['target_length'] = [np.full(n, max_num_tokens, np.int64)]
  columns['swapped'] = [np.zeros(n, bool)]
  return _to_plan(columns)


def _to_plan(columns) -> Plan:
  return Plan(**{k: np.concatenate(v) if v else np.zeros(0, np.int64)
                 for k, v in columns.items()})


def truncation_counts(len_a, len_b, max_num_tokens: int):
  """Tokens BERT's ``truncate_seq_pair`` removes from A and from B.

  It removes one token at a time from the longer sequence (from B on a tie)
  until the pair fits; the counts follow in closed form. Works elementwise
  on arrays of lengths.
  """
  len_a, len_b = np.asarray(len_a, np.int64), np.asarray(len_b, np.int64)
  excess = np.maximum(len_a + len_b - max_num_tokens, 0)
  first = np.minimum(np.abs(len_a - len_b), excess)
  rest = excess - first
  a_longer = len_a > len_b
  return (np.where(a_longer, first, 0) + rest // 2,
          np.where(a_longer, 0, first) + (rest + 1) // 2)


class TransientAttributes:
  """Attributes that are not pickled but rebuilt, fresh, after unpickling.

  Grain's worker processes receive the pipeline by pickling; locks and
  caches stay behind and are rebuilt there. ``_TRANSIENT`` maps each such
  attribute to the factory that rebuilds it.
  """
  _TRANSIENT: dict = {}

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items()
            if k not in self._TRANSIENT}

  def __setstate__(self, state):
    self.__dict__.update(state)
    for name, factory in self._TRANSIENT.items():
      setattr(self, name, factory())


class InstanceBuilder(TransientAttributes):
  """Plans and materializes the instances of one split."""
  _TRANSIENT = {'_lock': threading.Lock, '_plans': collections.OrderedDict}

  def __init__(self, source, index: pretokenize.DocumentIndex,
               config: InstanceConfig, seed: int):
    if config.layout not in LAYOUTS:
      raise ValueError(f'data.layout={config.layout!r}; use one of {LAYOUTS}.')
    # SOP too: its one-sentence chunks take B from another document.
    if config.layout in _PAIR_LAYOUTS and index.num_documents < 2:
      raise pretokenize.DataError(
          f'data.layout="{config.layout}" draws B from other documents; the '
          f'split has {index.num_documents}. Use more text, or change '
          'data.eval_fraction (the eval split needs 2 documents too).')
    self.source = source
    self.index = index
    self.config = config
    self.seed = seed
    self._csum = _cumsum0(index.sentence_lengths)
    self._plans: collections.OrderedDict[int, Plan] = (
        collections.OrderedDict())
    self._lock = threading.Lock()

  def plan(self, data_epoch: int) -> Plan:
    """The plan of one data epoch (cached; thread-safe)."""
    with self._lock:
      if data_epoch not in self._plans:
        if self.config.layout in _PAIR_LAYOUTS:
          plan_pairs = plan_nsp if self.config.layout == 'nsp' else plan_sop
          plan = plan_pairs(self.index, self.config.max_seq_length,
                            self.config.short_seq_prob, self.seed, data_epoch)
        else:  # Packing is deterministic: every epoch has the same plan.
          plan = self._plans.get(0) or plan_full_sentences(
              self.index, self.config.max_seq_length)
        self._plans[data_epoch] = plan
        while len(self._plans) > 2:
          self._plans.popitem(last=False)
      return self._plans[data_epoch]

  def materialize_batch(self, plan: Plan, ks: np.ndarray,
                        data_epoch: int) -> dict:
    """Instances ``ks`` of ``plan``, padded to ``max_seq_length``.

    Vectorized over the batch: the documents the instances need are read
    once each, every instance is described as a few segments of those
    documents (and of [CLS]/[SEP]), and one gather assembles the batch.

    Returns:
      ``input_ids``, ``token_type_ids``, ``attention_mask`` (int32 [n, L]),
      ``word_starts`` (bool [n, L]; specials start a word, padding does not),
      ``unit_labels`` (int8 [n, L]; 0 on specials and padding) and
      ``next_sentence_label`` (int32 [n]).
    """
    ks = np.asarray(ks, np.int64)
    if self.config.layout in _PAIR_LAYOUTS:
      segments, labels = self._pair_segments(plan, ks, data_epoch)
    else:
      segments = self._packed_segments(plan, ks)
      labels = np.zeros(len(ks), np.int32)
    tokens = _DocumentTokens(self, segments)
    batch = tokens.assemble(segments, len(ks), self.config.max_seq_length)
    batch['next_sentence_label'] = labels
    return batch

  def materialize(self, plan: Plan, k: int, data_epoch: int) -> dict:
    """Instance ``k`` of ``plan``, unpadded (for inspection and tests)."""
    batch = self.materialize_batch(plan, np.array([k]), data_epoch)
    n = int(batch['attention_mask'][0].sum())
    instance = {key: value[0, :n] for key, value in batch.items()
                if key not in ('attention_mask', 'next_sentence_label')}
    instance['next_sentence_label'] = batch['next_sentence_label'][0]
    return instance

  def _token_offset(self, sentence: np.ndarray, doc: np.ndarray
                    ) -> np.ndarray:
    """Offset of global sentence ``sentence`` in document ``doc``'s tokens."""
    return self._csum[sentence] - self._csum[self.index.document_offsets[doc]]

  def _pair_segments(self, plan: Plan, ks: np.ndarray, data_epoch: int):
    """[CLS] A [SEP] B [SEP] per instance (B before A where ``swapped``),
    after BERT's pair truncation; and the labels: 1 for a random or a
    swapped B."""
    seed, offsets, csum = self.seed, self.index.document_offsets, self._csum
    doc = plan.document[ks]
    start, a_end = plan.start[ks], plan.a_end[ks]
    len_a = csum[a_end] - csum[start]
    is_random = plan.is_random[ks]
    # A random B: another document, uniform; a uniform sentence in it; then
    # sentences until A + B reaches the target length or the document ends.
    r = counter_rng.randint(0, self.index.num_documents - 1, seed,
                            Stream.PAIRING, data_epoch, ks, 0)
    r += r >= doc
    r_start = counter_rng.randint(offsets[r], offsets[r + 1], seed,
                                  Stream.PAIRING, data_epoch, ks, 1)
    target_b = plan.target_length[ks] - len_a
    r_end = np.searchsorted(csum, csum[r_start] + target_b, 'left')
    r_end = np.clip(r_end, r_start + 1, offsets[r + 1])
    b_doc = np.where(is_random, r, doc)
    b_start = np.where(is_random, r_start, a_end)
    b_end = np.where(is_random, r_end, plan.end[ks])
    # SOP's wrong order lays B out first. ALBERT swaps before truncating, so
    # the truncation and its front/back coins see B as the first segment. A
    # swapped pair is never random: both segments are in ``doc``.
    swapped = plan.swapped[ks]
    first_start = np.where(swapped, b_start, start)
    first_end = np.where(swapped, b_end, a_end)
    second_start = np.where(swapped, start, b_start)
    second_end = np.where(swapped, a_end, b_end)
    len_first = csum[first_end] - csum[first_start]
    len_second = csum[second_end] - csum[second_start]
    remove_first, remove_second = truncation_counts(
        len_first, len_second, self.config.max_seq_length - 3)
    front_first = _front_removals(seed, data_epoch, ks, 0, remove_first)
    front_second = _front_removals(seed, data_epoch, ks, 1, remove_second)
    n = len(ks)
    one = np.ones(n, np.int64)
    segments = _Segments.from_rows(
        doc=np.stack([-one, doc, -one, b_doc, -one], 1),
        start=np.stack([np.full(n, _CLS),
                        self._token_offset(first_start, doc) + front_first,
                        np.full(n, _SEP),
                        self._token_offset(second_start, b_doc)
                        + front_second,
                        np.full(n, _SEP)], 1),
        length=np.stack([one, len_first - remove_first, one,
                         len_second - remove_second, one], 1),
        token_type=np.broadcast_to(np.array([0, 0, 0, 1, 1]), (n, 5)))
    return segments, (is_random | swapped).astype(np.int32)

  def _packed_segments(self, plan: Plan, ks: np.ndarray):
    """[CLS] doc [SEP] doc ... [SEP]: a piece of each document the instance
    spans, a [SEP] before each piece but the first, cut to fit."""
    offsets, csum = self.index.document_offsets, self._csum
    start, end = plan.start[ks], plan.end[ks]
    first_doc = plan.document[ks]
    last_doc = np.searchsorted(offsets, end - 1, 'right') - 1
    pieces = last_doc - first_doc + 1
    row = np.repeat(np.arange(len(ks)), pieces)
    nth = _ranks(pieces)
    doc = first_doc[row] + nth
    piece_start = np.maximum(start[row], offsets[doc])
    piece_end = np.minimum(end[row], offsets[doc + 1])
    # Per row: [CLS], then ([SEP] unless first, piece) per document.
    seps = (nth > 0).astype(np.int64)
    segments = _Segments.interleave(
        row, len(ks),
        first=(-1, _CLS, 1),
        pairs=((-np.ones_like(doc), np.full_like(doc, _SEP), seps),
               (doc, self._token_offset(piece_start, doc),
                csum[piece_end] - csum[piece_start])))
    # A sentence longer than the instance is cut; then the final [SEP].
    segments = segments.truncate(self.config.max_seq_length - 1)
    return segments.append_to_rows(-1, _SEP, len(ks))


# Positions of [CLS] and [SEP] in the special-token buffer of
# ``_DocumentTokens`` (document -1).
_CLS, _SEP = 0, 1


@dataclasses.dataclass(frozen=True)
class _Segments:
  """Instances as runs of tokens, flat and in row order: row ``row[i]``
  continues with ``length[i]`` tokens of document ``doc[i]`` (-1 = the
  special tokens) from token ``start[i]``, of segment type
  ``token_type[i]``."""
  row: np.ndarray
  doc: np.ndarray
  start: np.ndarray
  length: np.ndarray
  token_type: np.ndarray

  @classmethod
  def from_rows(cls, doc, start, length, token_type) -> '_Segments':
    """From [n, S] arrays, S segments per row, to the flat layout."""
    n, s = doc.shape
    return cls(np.repeat(np.arange(n), s), doc.ravel(), start.ravel(),
               length.ravel(), np.ravel(token_type))

  @classmethod
  def interleave(cls, row, num_rows, first, pairs) -> '_Segments':
    """``first`` (a (doc, start, length) constant) opening each row, then
    per item of ``row`` (sorted) the two segments of ``pairs``."""
    (d0, s0, l0), (d1, s1, l1) = pairs
    m = len(row)
    rows = np.concatenate([np.arange(num_rows), row, row])
    # Sort key: the row, then the opening segment, then items in order with
    # each pair's first segment before its second.
    rank = np.concatenate([np.zeros(num_rows, np.int64),
                           1 + 2 * np.arange(m), 2 + 2 * np.arange(m)])
    perm = np.lexsort((rank, rows))
    cat = lambda a, b, c: np.concatenate([a, b, c]).astype(np.int64)[perm]
    return cls(rows[perm],
               cat(np.full(num_rows, first[0]), d0, d1),
               cat(np.full(num_rows, first[1]), s0, s1),
               cat(np.full(num_rows, first[2]), l0, l1),
               np.zeros(len(rows), np.int64))

  def offsets_in_row(self) -> np.ndarray:
    """int [S]: tokens of its row before each segment."""
    before = np.cumsum(self.length) - self.length
    return before - before[_first_of_row(self.row)][self.row]

  def truncate(self, max_tokens: int) -> '_Segments':
    """Cuts every row after ``max_tokens`` tokens."""
    length = np.clip(max_tokens - self.offsets_in_row(), 0, self.length)
    return dataclasses.replace(self, length=length)

  def append_to_rows(self, doc: int, start: int, num_rows: int
                     ) -> '_Segments':
    """Appends one token (a special) to the end of every row."""
    rows = np.concatenate([self.row, np.arange(num_rows)])
    perm = np.argsort(rows, kind='stable')
    cat = lambda a, v: np.concatenate([a, np.full(num_rows, v)])[perm]
    return _Segments(rows[perm], cat(self.doc, doc), cat(self.start, start),
                     cat(self.length, 1), cat(self.token_type, 0))


def _first_of_row(row: np.ndarray) -> np.ndarray:
  """For sorted ``row`` ids 0..n-1 (each present): index of each row's
  first item."""
  return np.searchsorted(row, np.arange(row[-1] + 1 if len(row) else 0))


class _DocumentTokens:
  """The tokens and flags a batch's segments use; each document read once.

  Flags are int8: bit 0 the word start, bits 1+ the unit label (see
  pretokenize: 0 none, 1/2 entity begin/inside, 3/4 phrase begin/inside).
  Document -1 holds the specials [CLS] and [SEP] (a word start, label 0).
  """

  def __init__(self, builder: InstanceBuilder, segments: _Segments):
    # Only the part of each document that the segments use is copied: an
    # instance needs a few hundred tokens of a document that may hold
    # thousands.
    real = segments.doc >= 0
    start = segments.start[real]
    end = start + segments.length[real]
    docs, slot = np.unique(segments.doc[real], return_inverse=True)
    lo = np.full(len(docs), np.iinfo(np.int64).max)
    np.minimum.at(lo, slot, start)
    hi = np.zeros(len(docs), np.int64)
    np.maximum.at(hi, slot, end)
    ids = [np.array([CLS_ID, SEP_ID], np.int32)]
    word_starts, labels = [np.ones(2, bool)], [np.zeros(2, np.int8)]
    for d, a, b in zip(docs.tolist(), lo.tolist(), hi.tolist()):
      record = builder.source[d]
      ids.append(record['token_ids'][a:b])
      word_starts.append(record['word_starts'][a:b])
      labels.append(record['unit_labels'][a:b])
    # Buffer position of each segment's first token: the offset of its
    # document's piece (slot 0: the specials), minus where the piece starts.
    base = _cumsum0([len(x) for x in ids])[:-1] - np.concatenate([[0], lo])
    segment_slot = np.zeros(len(segments.doc), np.int64)
    segment_slot[real] = slot + 1
    self.src_start = base[segment_slot] + segments.start
    self.ids = np.concatenate(ids)
    self.flags = np.concatenate(labels).astype(np.int8)
    self.flags <<= 1
    self.flags |= np.concatenate(word_starts)

  def assemble(self, segments: _Segments, num_rows: int,
               max_seq_length: int) -> dict:
    """Concatenates each row's segments (those given to the constructor);
    pads to ``max_seq_length``."""
    length = segments.length
    seg_of = np.repeat(np.arange(len(length)), length)
    within = _ranks(length)
    col = segments.offsets_in_row()[seg_of] + within
    row = segments.row[seg_of]
    src = self.src_start[seg_of] + within
    shape = (num_rows, max_seq_length)
    input_ids = np.full(shape, PAD_ID, np.int32)
    input_ids[row, col] = self.ids[src]
    flags = np.zeros(shape, np.int8)
    flags[row, col] = self.flags[src]
    token_type_ids = np.zeros(shape, np.int32)
    token_type_ids[row, col] = segments.token_type[seg_of]
    attention_mask = np.zeros(shape, np.int32)
    attention_mask[row, col] = 1
    return {'input_ids': input_ids, 'token_type_ids': token_type_ids,
            'attention_mask': attention_mask,
            'word_starts': (flags & 1).astype(bool),
            'unit_labels': (flags >> 1).astype(np.int8)}


def _front_removals(seed, data_epoch, ks, which, remove) -> np.ndarray:
  """How many of ``remove`` truncated tokens come off the front: each comes
  off the front or the back with p = 0.5 (BERT's ``truncate_seq_pair``)."""
  n = len(ks)
  total = int(remove.sum())
  if not total:
    return np.zeros(n, np.int64)
  row = np.repeat(np.arange(n), remove)
  coins = counter_rng.uniform(seed, Stream.TRUNCATION, data_epoch, ks[row],
                              which, _ranks(remove))
  return np.bincount(row, weights=coins < 0.5, minlength=n).astype(np.int64)



class BatchAccessDataset(TransientAttributes, grain.MapDataset):
  """A random-access dataset built for batches: ``get_batch(indices)``
  returns elements ``indices`` stacked, and element ``i`` is row 0 of
  ``get_batch([i])``. ``InstanceBatches`` batches any of them."""

  def get_batch(self, indices: np.ndarray) -> dict:
    raise NotImplementedError

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    return {key: value[0]
            for key, value in self.get_batch(np.array([index])).items()}


class InstanceDataset(BatchAccessDataset):
  """Instance ``i`` of an endless stream of shuffled epochs.

  Element ``i`` is a pure function of ``i`` and the seed: its epoch and
  position follow from the epochs' sizes, each epoch is a fresh permutation,
  and with static masking the data epoch (plan and masks) cycles through
  ``dupe_factor`` versions while the order still changes every epoch.

  Each element is padded to ``max_seq_length`` and carries
  ``example_index`` (its position in the data epoch's plan) and
  ``mask_epoch``, the counters that masking uses. ``get_batch`` builds many
  elements at once, vectorized; ``InstanceBatches`` batches with it.
  """

  _TRANSIENT = {'_lock': threading.Lock}

  def __init__(self, builder: InstanceBuilder, seed: int, dupe_factor: int,
               dynamic: bool, num_epochs: int | None = None,
               shuffle: bool = True):
    super().__init__()
    self._builder = builder
    self._seed = seed
    self._dupe_factor = dupe_factor
    self._dynamic = dynamic
    self._num_epochs = num_epochs
    self._shuffle = shuffle
    self._epoch_starts = [0]
    self._orders: dict[int, np.ndarray] = {}
    self._lock = threading.Lock()

  @property
  def builder(self) -> InstanceBuilder:
    return self._builder

  def data_epoch(self, epoch: int) -> int:
    return epoch if self._dynamic else epoch % self._dupe_factor

  def _epoch_start(self, epoch: int) -> int:
    while len(self._epoch_starts) <= epoch:
      e = len(self._epoch_starts) - 1
      size = len(self._builder.plan(self.data_epoch(e)))
      if size == 0:
        raise pretokenize.DataError(
            'an epoch has no instances: the split is empty.')
      self._epoch_starts.append(self._epoch_starts[-1] + size)
    return self._epoch_starts[epoch]

  def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(epoch, position in the epoch) of each element of ``indices``."""
    indices = np.asarray(indices, np.int64)
    with self._lock:
      last = int(indices.max(initial=0))
      epoch = len(self._epoch_starts) - 2
      while self._epoch_start(epoch + 1) <= last:
        epoch += 1
      starts = np.asarray(self._epoch_starts, np.int64)
    epochs = np.searchsorted(starts, indices, 'right') - 1
    return epochs, indices - starts[epochs]

  def epoch_size(self, epoch: int = 0) -> int:
    with self._lock:
      return self._epoch_start(epoch + 1) - self._epoch_start(epoch)

  def _order(self, epoch: int, size: int) -> np.ndarray:
    with self._lock:
      if epoch not in self._orders:
        rng = np.random.default_rng([self._seed, Stream.SHUFFLE, epoch])
        self._orders = {epoch: rng.permutation(size) if self._shuffle
                        else np.arange(size)}
      return self._orders[epoch]

  def __len__(self) -> int:
    if self._num_epochs is None:
      return sys.maxsize
    with self._lock:
      return self._epoch_start(self._num_epochs)

  def get_batch(self, indices: np.ndarray) -> dict:
    """Elements ``indices``, stacked (see ``materialize_batch``)."""
    epochs, positions = self.locate(indices)
    parts, rows = [], []
    for epoch in np.unique(epochs):  # Usually one; two at an epoch's end.
      in_epoch = np.flatnonzero(epochs == epoch)
      data_epoch = self.data_epoch(int(epoch))
      plan = self._builder.plan(data_epoch)
      ks = self._order(int(epoch), len(plan))[positions[in_epoch]]
      part = self._builder.materialize_batch(plan, ks, data_epoch)
      # Masks are keyed by (data epoch, position in its plan), so static
      # masking repeats them when a data epoch comes round again.
      part['example_index'] = ks.astype(np.int64)
      part['mask_epoch'] = np.full(len(ks), data_epoch, np.int64)
      parts.append(part)
      rows.append(in_epoch)
    if len(parts) == 1:
      return parts[0]
    order = np.argsort(np.concatenate(rows))
    return {key: np.concatenate([p[key] for p in parts])[order]
            for key in parts[0]}

  def __str__(self) -> str:
    return (f'InstanceDataset(layout={self._builder.config.layout}, '
            f'dynamic={self._dynamic}, dupe_factor={self._dupe_factor})')


class InstanceBatches(grain.MapDataset):
  """One host's rows of the global batches of a ``BatchAccessDataset``.

  Global batch ``b`` is elements ``[b * G, (b + 1) * G)``; a host reads the
  rows ``rows`` (sorted, in ``[0, G)``) of each, i.e. elements
  ``b * G + rows``, built vectorized. The rows are the ones its devices hold
  of the batch's sharding (``bertjax.sharding.process_batch_rows``), so the
  bytes of a global batch, and where each row lands, do not depend on the
  number of hosts.
  """

  def __init__(self, instances: BatchAccessDataset, global_batch_size: int,
               rows: np.ndarray | None = None,
               num_batches: int | None = None):
    """``rows`` None = all ``global_batch_size``; ``num_batches`` None = all.

    Raises:
      pretokenize.DataError: ``num_batches`` is None and ``instances`` has
        fewer distinct instances than one global batch
        (``check_fills_a_batch``): the training stream is built before the
        model is compiled, so a corpus too small fails first.
    """
    if num_batches is None:
      check_fills_a_batch(instances, global_batch_size)
    super().__init__(instances)
    self._instances = instances
    self._global = global_batch_size
    self._rows = check_rows(rows, global_batch_size)
    self._num_batches = num_batches

  def __len__(self) -> int:
    if self._num_batches is not None:
      return self._num_batches
    return len(self._instances) // self._global

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    return self._instances.get_batch(index * self._global + self._rows)

  def __str__(self) -> str:
    return (f'InstanceBatches({self._instances}, batch={self._global}, '
            f'rows={len(self._rows)})')


def check_fills_a_batch(dataset: BatchAccessDataset,
                        global_batch_size: int) -> None:
  """Fails when ``dataset`` holds fewer distinct instances than one batch.

  An endless stream would still deliver batches, each repeating the same
  few instances; that is a corpus or config mistake, reported with what
  to change. ``dataset`` is an ``InstanceDataset`` (its data epoch 0; the
  plan is cached, so the check costs nothing later) or a mixture of them
  (anything with ``components``: the sum over them). Other datasets are
  not checked.

  Raises:
    pretokenize.DataError: naming the instances, documents and tokens, the
      batch size and what to change.
  """
  parts = getattr(dataset, 'components', None) or (dataset,)
  if not all(isinstance(d, InstanceDataset) for d in parts):
    return
  sizes = [len(d.builder.plan(d.data_epoch(0))) for d in parts]
  if sum(sizes) >= global_batch_size:
    return
  config = parts[0].builder.config
  documents = sum(d.builder.index.num_documents for d in parts)
  tokens = sum(d.builder.index.num_tokens for d in parts)
  what = (f'the {len(parts)} components of the mixture hold {sum(sizes)} '
          f'instances in all ({sizes})' if len(parts) > 1 else
          f'the split holds {sizes[0]} instances')
  per_instance = ('each document gives at least one' if config.layout in
                  _PAIR_LAYOUTS else 'full_sentences packs '
                  f'{config.max_seq_length - 2} tokens in each')
  raise pretokenize.DataError(
      f'{what}, from {documents} documents of {tokens} tokens '
      f'(data.layout={config.layout!r}: {per_instance}), fewer than one '
      f'batch of batch_size={global_batch_size}. Use more text, or lower '
      'batch_size, or data.eval_fraction (or data.max_seq_length for '
      'full_sentences).')


def check_rows(rows: np.ndarray | None, global_batch_size: int) -> np.ndarray:
  """``rows`` as a sorted int64 array of distinct rows of a global batch."""
  if rows is None:
    return np.arange(global_batch_size, dtype=np.int64)
  rows = np.asarray(rows, np.int64)
  if (rows.ndim != 1 or not len(rows) or rows[0] < 0
      or rows[-1] >= global_batch_size or np.any(np.diff(rows) <= 0)):
    raise ValueError(f'rows must be sorted distinct rows of a global batch '
                     f'of {global_batch_size}; got {rows!r}.')
  return rows


def host_rows(global_batch_size: int, process_index: int,
              process_count: int) -> np.ndarray:
  """Host ``p`` of ``P``'s contiguous block of a global batch's rows.

  What ``process_batch_rows`` gives for a mesh whose batch axis orders the
  devices by process; for a pipeline used without a mesh.
  """
  if global_batch_size % process_count:
    raise ValueError(f'batch_size={global_batch_size} must be divisible by '
                     f'the number of processes ({process_count}).')
  n = global_batch_size // process_count
  return np.arange(process_index * n, (process_index + 1) * n, dtype=np.int64)
