"""Pretraining instances built on the fly from pre-tokenized documents.

Five layouts:

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
* ``doc_sentences``: RoBERTa's DOC-SENTENCES (Sec. 4.2): as
  ``full_sentences``, but a row never crosses a document boundary: the
  last row of a document ends with it, shorter and padded. RoBERTa then
  raises the batch size to keep the tokens per batch about those of
  FULL-SENTENCES; here the batch keeps its rows (static shapes), so a
  batch holds fewer real tokens (the compare tool's tokens budget counts
  padding too).
* ``sentence_distance``: ERNIE 2.0's sentence distance task (Sun et al.,
  AAAI 2020, Sec. 4.2.2), NSP extended to 3 classes: 0 B follows A, 1 B is
  from A's document but not adjacent, 2 B is from another document. Chunks
  and their A/B split are BERT's, from the same draws; the draw that NSP
  compares with 0.5 picks the class (``distance_probabilities``, p0, p1,
  p2: class 2 when it is below p2, 1 below p2 + p1, else 0, so (0.5, 0,
  0.5) is NSP's plan). Class 0 is NSP's IsNext, class 2 NSP's random B;
  a class-1 B starts at a uniform one of the sentences of A's document that
  leave a gap of at least one sentence to A (before or after it), and runs
  until A + B reach the target, the document's end, or (before A) the
  gap. Unused sentences are put back for classes 1 and 2, as NSP does for
  a random B. Fallbacks to class 2 (``Plan.fallback``): a one-sentence
  chunk that drew class 0 (it has no B of its own, as in NSP) and a chunk
  that drew class 1 whose document has no valid start (a document of up to
  a + 2 sentences, A being a of them, has none). The label shares are thus
  p0 * (1 - P(one-sentence chunk)), p1 * (1 - P(no class-1 start)) and p2
  plus both fallbacks: on long documents of short sentences, the draws'.
  Departure from BERT's pair truncation, for this layout only: tokens come
  off A's front and B's back, never at the join, so a class-0 B is still
  adjacent to A as the model sees it (BERT's front/back coins could take a
  whole sentence off either side of the join, and a class-0 pair then
  looked like class 1).
* ``discourse``: ERNIE 2.0's discourse relation task (Sec. 4.2.3): the
  pairs (s - 1, s) of adjacent sentences where s opens with a discourse
  marker, as [CLS] s-1 [SEP] s-without-its-marker [SEP], labelled with the
  marker's index in its list (discourse.py finds them in one read of the
  split, once: every data epoch has the same instances).

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

from absl import logging
import grain
import numpy as np

from data_pipelines import counter_rng
from data_pipelines import discourse
from data_pipelines import pretokenize
from data_pipelines.counter_rng import Stream
from data_pipelines.tokenizer import CLS_ID, PAD_ID, SEP_ID

LAYOUTS = ('nsp', 'sop', 'full_sentences', 'doc_sentences',
           'sentence_distance', 'discourse')
# Single packed segments, no pairs: no NSP.
PACKED_LAYOUTS = ('full_sentences', 'doc_sentences')
# Layouts of sentence pairs, [CLS] A [SEP] B [SEP], labelled per pair.
_PAIR_LAYOUTS = ('nsp', 'sop', 'sentence_distance', 'discourse')
# Pair layouts that may draw B from another document: a split needs 2.
_RANDOM_B_LAYOUTS = ('nsp', 'sop', 'sentence_distance')
# Packing lanes: the sentence stream is packed in independent lanes of about
# this many instances each, so planning is a vectorized loop; each lane's last
# instance may be short (about 1 / (2 * _INSTANCES_PER_LANE) waste).
_INSTANCES_PER_LANE = 64


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
  layout: str = 'nsp'
  max_seq_length: int = 128
  short_seq_prob: float = 0.1
  # sentence_distance: the chance of each class (0 adjacent, 1 same
  # document not adjacent, 2 other document), summing to 1.
  distance_probabilities: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
  # discourse: per marker (label = its index) the token sequences that
  # count as it (discourse.discourse_marker_ids), and the list's file for
  # messages ('' = the shipped English list).
  discourse_markers: tuple[tuple[tuple[int, ...], ...], ...] = ()
  discourse_markers_path: str = ''
  # Add ``token_document_labels`` to every batch (ERNIE 2.0's token-document
  # relation; see ``materialize_batch``).
  token_document: bool = False


@dataclasses.dataclass(frozen=True)
class Plan:
  """Instances of one data epoch, as sentence ranges (struct of arrays).

  Global sentence indices refer to ``DocumentIndex.sentence_lengths``.
  A is sentences [start, a_end); B is [a_end, end) unless ``is_random``.
  ``swapped`` (SOP only) lays B out before A. For the packed layouts the
  instance is [start, end): ``full_sentences``' may span documents,
  ``doc_sentences``' is within ``document``.

  ``label`` is the pair's label where the layout sets it (None: 1 for a
  random or swapped B): ``sentence_distance``'s class, where B is [a_end,
  end) for class 0 only, class 1 draws B from A's document when the
  instance is built and class 2 is ``is_random``; ``fallback`` marks its
  chunks made class 2 for want of the drawn class's B; ``discourse``'s
  marker index, with ``b_skip`` the marker's tokens cut from B's front.
  """
  document: np.ndarray     # int64 [N]
  start: np.ndarray        # int64 [N]
  a_end: np.ndarray        # int64 [N]
  end: np.ndarray          # int64 [N]
  is_random: np.ndarray    # bool  [N]
  target_length: np.ndarray  # int64 [N]
  swapped: np.ndarray      # bool  [N]
  label: np.ndarray | None = None      # int32 [N]
  fallback: np.ndarray | None = None   # bool  [N]
  b_skip: np.ndarray | None = None     # int64 [N]

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
                     'nsp')


def plan_sop(index: pretokenize.DocumentIndex, max_seq_length: int,
             short_seq_prob: float, seed: int, data_epoch: int) -> Plan:
  """ALBERT's SOP pairs of every document: BERT's chunks, from the same
  draws, with the coin that NSP uses for a random B deciding a swap."""
  return _plan_pairs(index, max_seq_length, short_seq_prob, seed, data_epoch,
                     'sop')


def plan_sentence_distance(
    index: pretokenize.DocumentIndex, max_seq_length: int,
    short_seq_prob: float, seed: int, data_epoch: int,
    probabilities: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
) -> Plan:
  """ERNIE 2.0's sentence distance pairs of every document: BERT's chunks,
  from the same draws, with NSP's coin picking the class (``probabilities``
  of classes 0, 1, 2; see the module docstring)."""
  return _plan_pairs(index, max_seq_length, short_seq_prob, seed, data_epoch,
                     'sentence_distance', probabilities)


def _plan_pairs(index: pretokenize.DocumentIndex, max_seq_length: int,
                short_seq_prob: float, seed: int, data_epoch: int,
                layout: str, probabilities=(1 / 3, 1 / 3, 1 / 3)) -> Plan:
  """BERT's chunking of every document; its pairs as ``layout`` makes them
  (nsp, sop or sentence_distance: ``_chunk_pairs``)."""
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
    pair, own_b = _chunk_pairs(layout, v[:, 1], n, p, p + a_len,
                               index.document_offsets[active], e,
                               probabilities)
    for name, value in (('document', active), ('start', p),
                        ('a_end', p + a_len), ('end', q),
                        ('target_length', t), *pair.items()):
      columns[name].append(value)
    # A B not the chunk's own puts the chunk's unused sentences back (BERT's
    # i -= unused).
    nxt = np.where(own_b, q, p + a_len)
    pos[active] = nxt
    going_on = nxt < e
    active, drawn = active[going_on], drawn[going_on]
    chunk_number += 1
  return _to_plan(columns)


def _chunk_pairs(layout: str, u: np.ndarray, n: np.ndarray,
                 start: np.ndarray, a_end: np.ndarray, doc_start: np.ndarray,
                 doc_end: np.ndarray, probabilities) -> tuple[dict, np.ndarray]:
  """What each chunk's pair is, from its uniform draw ``u`` (NSP's coin).

  Args:
    layout: nsp, sop or sentence_distance.
    u: float [C], one per chunk; n: its sentences; start, a_end: its A;
      doc_start, doc_end: its document's sentences (all int64 [C]).
    probabilities: sentence_distance's (p0, p1, p2).

  Returns:
    (plan columns: ``is_random``, ``swapped``, and for sentence_distance
    ``label`` and ``fallback``; bool [C], whether B is the chunk's own
    [a_end, end)).
  """
  coin = u < 0.5
  no_swap = np.zeros(len(n), bool)
  if layout == 'nsp':
    is_random = (n == 1) | coin
    return {'is_random': is_random, 'swapped': no_swap}, ~is_random
  if layout == 'sop':
    # Only a one-sentence chunk lacks a B of its own.
    return {'is_random': n == 1, 'swapped': (n >= 2) & coin}, n >= 2
  _, p1, p2 = probabilities
  drawn = np.where(u < p2, 2, np.where(u < p2 + p1, 1, 0))
  before, after = _far_starts(start, a_end, doc_start, doc_end)
  fallback = (((drawn == 0) & (n == 1))
              | ((drawn == 1) & (before + after == 0)))
  label = np.where(fallback, 2, drawn).astype(np.int32)
  return ({'is_random': label == 2, 'swapped': no_swap, 'label': label,
           'fallback': fallback}, label == 0)


def _far_starts(start, a_end, doc_start, doc_end):
  """Sentences of A's document where a class-1 B of sentence_distance may
  start: (int64 [C] before A, in [doc_start, start - 2]; after it, in
  [a_end + 1, doc_end - 1]), so that one sentence at least lies between."""
  return (np.maximum(start - 1 - doc_start, 0),
          np.maximum(doc_end - a_end - 1, 0))


def plan_discourse(index: pretokenize.DocumentIndex,
                   candidates: discourse.Candidates,
                   max_seq_length: int) -> Plan:
  """ERNIE 2.0's discourse pairs (s - 1, s): A is sentence s - 1, B is s
  less its marker's tokens (``b_skip``), the label the marker's index."""
  s = candidates.sentence.astype(np.int64)
  n = len(s)
  return Plan(
      document=np.searchsorted(index.document_offsets, s, 'right') - 1,
      start=s - 1, a_end=s, end=s + 1, is_random=np.zeros(n, bool),
      target_length=np.full(n, max_seq_length - 3, np.int64),
      swapped=np.zeros(n, bool), label=candidates.label.astype(np.int32),
      b_skip=candidates.marker_length.astype(np.int64))


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
  start, end, _ = _pack_lanes(csum, pos, np.append(pos[1:], len(lengths)),
                              max_num_tokens)
  document = np.searchsorted(index.document_offsets, start, 'right') - 1
  return _packed_plan(start, end, document, max_num_tokens)


def plan_doc_sentences(index: pretokenize.DocumentIndex,
                       max_seq_length: int) -> Plan:
  """RoBERTa's DOC-SENTENCES: each document's sentences packed in order,
  up to ``max_seq_length - 2`` tokens a row, a row never crossing into the
  next document; instances in document order."""
  max_num_tokens = max_seq_length - 2
  offsets = index.document_offsets.astype(np.int64)
  # One lane per document: every row is a document's.
  start, end, document = _pack_lanes(
      _cumsum0(index.sentence_lengths.astype(np.int64)), offsets[:-1],
      offsets[1:], max_num_tokens)
  order = np.argsort(start, kind='stable')
  return _packed_plan(start[order], end[order], document[order],
                      max_num_tokens)


def _pack_lanes(csum: np.ndarray, pos: np.ndarray, lane_end: np.ndarray,
                max_num_tokens: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Greedy packing of each lane [pos, lane_end) of the sentence stream
  (``csum``: its tokens' cumulative sum): rows of as many whole sentences
  as fit in ``max_num_tokens``, a sentence too long alone a row of its own
  (cut when built). (start, end, lane) of every row, all lanes' first
  rows, then their second rows, and so on."""
  pos = pos.copy()
  starts, ends, lanes = [], [], []
  active = np.flatnonzero(pos < lane_end)
  while active.size:
    p, e = pos[active], lane_end[active]
    q = np.searchsorted(csum, csum[p] + max_num_tokens, side='right') - 1
    q = np.clip(q, p + 1, e)
    starts.append(p)
    ends.append(q)
    lanes.append(active)
    pos[active] = q
    active = active[q < e]
  cat = lambda parts: (np.concatenate(parts) if parts
                       else np.zeros(0, np.int64))
  return cat(starts), cat(ends), cat(lanes)


def _packed_plan(start, end, document, max_num_tokens: int) -> Plan:
  """The plan of packed rows [start, end) (no pairs)."""
  n = len(start)
  return Plan(document=document, start=start, a_end=end, end=end,
              is_random=np.zeros(n, bool),
              target_length=np.full(n, max_num_tokens, np.int64),
              swapped=np.zeros(n, bool))


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


def _check_task_layout(config: InstanceConfig) -> None:
  """What sentence_distance and discourse need of ``config``."""
  if config.layout == 'sentence_distance':
    p = np.asarray(config.distance_probabilities, np.float64)
    if p.shape != (3,) or np.any(p < 0) or abs(p.sum() - 1) > 1e-6:
      raise ValueError(
          f'distance_probabilities={config.distance_probabilities}; use '
          'three chances >= 0 summing to 1 (classes 0 adjacent, 1 same '
          'document not adjacent, 2 other document), e.g. (1/3, 1/3, 1/3).')
  if config.layout == 'discourse' and not any(config.discourse_markers):
    raise ValueError(
        'data.layout="discourse" needs InstanceConfig.discourse_markers, the '
        'token sequences of each marker: discourse.discourse_marker_ids('
        'tokenizer, path)[0]; got none.')


def _log_fallbacks(plan: Plan, data_epoch: int) -> None:
  """Logs sentence_distance's chunks made class 2 for want of their B."""
  if plan.fallback is not None:
    logging.info(
        'sentence_distance, data epoch %d: label shares %s of %d pairs; %d '
        'chunks fell back to class 2 (a one-sentence chunk that drew 0, or '
        'a document with no sentence for a class-1 B).', data_epoch,
        np.round(np.bincount(plan.label, minlength=3) / max(len(plan), 1),
                 4).tolist(), len(plan), int(plan.fallback.sum()))


class InstanceBuilder(TransientAttributes):
  """Plans and materializes the instances of one split.

  Raises (on construction):
    ValueError: a layout or its settings are wrong.
    pretokenize.DataError: the split cannot give the layout's pairs: one
      document for a layout that draws B from another, or for discourse
      no sentence that opens with a marker (``discourse.find_candidates``,
      which reads the split once).
  """
  _TRANSIENT = {'_lock': threading.Lock, '_plans': collections.OrderedDict}

  def __init__(self, source, index: pretokenize.DocumentIndex,
               config: InstanceConfig, seed: int):
    if config.layout not in LAYOUTS:
      raise ValueError(f'data.layout={config.layout!r}; use one of {LAYOUTS}.')
    _check_task_layout(config)
    # SOP too: its one-sentence chunks take B from another document.
    if config.layout in _RANDOM_B_LAYOUTS and index.num_documents < 2:
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
    # discourse: the split's pairs, found here, once (one read of the
    # split; a corpus without markers fails when the pipeline is built),
    # and kept, pickled with the builder into Grain's workers, for every
    # epoch.
    self._discourse_plan = plan_discourse(
        index, discourse.find_candidates(
            source, index, config.discourse_markers,
            config.discourse_markers_path),
        config.max_seq_length) if config.layout == 'discourse' else None

  def plan(self, data_epoch: int) -> Plan:
    """The plan of one data epoch (cached; thread-safe)."""
    with self._lock:
      if data_epoch not in self._plans:
        if self.config.layout == 'discourse':
          plan = self._discourse_plan
        elif self.config.layout in _PAIR_LAYOUTS:
          plan = _plan_pairs(self.index, self.config.max_seq_length,
                             self.config.short_seq_prob, self.seed,
                             data_epoch, self.config.layout,
                             self.config.distance_probabilities)
          _log_fallbacks(plan, data_epoch)
        else:  # Packing is deterministic: every epoch has the same plan.
          pack = (plan_doc_sentences if self.config.layout == 'doc_sentences'
                  else plan_full_sentences)
          plan = self._plans.get(0) or pack(self.index,
                                            self.config.max_seq_length)
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
      ``unit_labels`` (int8 [n, L]; 0 on specials and padding),
      ``capitalized`` (bool [n, L]: the records' flag, True on the first
      token of a word whose first cased character is upper case in the
      original text, see pretokenize; False on specials and padding, and
      everywhere when the tokenizer does not lowercase), ``sentence_ids``
      (int32 [n, L]: the sentence of each token within its row, 0, 1, 2,
      ... in order of appearance, a sentence cut by truncation included,
      the sentences of different documents apart and B's numbered after
      A's; -1 on [CLS], [SEP] and padding), ``next_sentence_label`` (int32
      [n]), and with ``InstanceConfig.token_document``
      ``token_document_labels`` (int32 [n, L]: 1 where the token's id
      occurs in its document outside the part of the document the row
      uses, 0 otherwise and on specials and padding).
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

  def pair_b_sentences(self, plan: Plan, ks: np.ndarray, data_epoch: int):
    """Where the B of each pair instance ``ks`` is: (document, first
    sentence, end sentence), int64 [n] each, global sentence indices.

    The chunk's own [a_end, end), or for a random B another document
    (uniform), a uniform sentence in it, then sentences until A + B
    reaches the target length or the document ends; for a class-1 B of
    sentence_distance, ``_far_b``.
    """
    doc = plan.document[ks]
    start, a_end = plan.start[ks], plan.a_end[ks]
    target_b = plan.target_length[ks] - (self._csum[a_end]
                                         - self._csum[start])
    b_doc, b_start, b_end = doc.copy(), a_end.copy(), plan.end[ks].copy()
    rnd = np.flatnonzero(plan.is_random[ks])
    b_doc[rnd], b_start[rnd], b_end[rnd] = self._random_b(
        doc[rnd], target_b[rnd], ks[rnd], data_epoch)
    if self.config.layout == 'sentence_distance':
      far = np.flatnonzero(plan.label[ks] == 1)
      b_start[far], b_end[far] = self._far_b(
          doc[far], start[far], a_end[far], target_b[far], ks[far],
          data_epoch)
    return b_doc, b_start, b_end

  def _random_b(self, doc, target_b, ks, data_epoch):
    """Random Bs: (document, first, end sentence), int64 [m] each."""
    offsets, csum = self.index.document_offsets, self._csum
    r = counter_rng.randint(0, self.index.num_documents - 1, self.seed,
                            Stream.PAIRING, data_epoch, ks, 0)
    r += r >= doc
    r_start = counter_rng.randint(offsets[r], offsets[r + 1], self.seed,
                                  Stream.PAIRING, data_epoch, ks, 1)
    r_end = np.searchsorted(csum, csum[r_start] + target_b, 'left')
    return r, r_start, np.clip(r_end, r_start + 1, offsets[r + 1])

  def _far_b(self, doc, start, a_end, target_b, ks, data_epoch):
    """Class-1 Bs of sentence_distance: (first, end sentence), int64 [m].

    The first sentence is uniform among those of A's document that leave a
    sentence at least between A and B (``_far_starts``; the plan made
    class 1 only where there is one); B then runs until A + B reaches the
    target, the document's end, or, before A, the sentence before A.
    """
    offsets, csum = self.index.document_offsets, self._csum
    lo, hi = offsets[doc], offsets[doc + 1]
    before, after = _far_starts(start, a_end, lo, hi)
    j = counter_rng.randint(0, before + after, self.seed,
                            Stream.SENTENCE_DISTANCE, data_epoch, ks)
    is_before = j < before
    b_start = np.where(is_before, lo + j, a_end + 1 + j - before)
    b_end = np.searchsorted(csum, csum[b_start] + target_b, 'left')
    return b_start, np.clip(b_end, b_start + 1,
                            np.where(is_before, start - 1, hi))

  def _pair_segments(self, plan: Plan, ks: np.ndarray, data_epoch: int):
    """[CLS] A [SEP] B [SEP] per instance (B before A where ``swapped``),
    after BERT's pair truncation, B less its first ``b_skip`` tokens; and
    the labels: ``plan.label``, or 1 for a random or a swapped B."""
    seed, csum = self.seed, self._csum
    doc = plan.document[ks]
    start, a_end = plan.start[ks], plan.a_end[ks]
    b_doc, b_start, b_end = self.pair_b_sentences(plan, ks, data_epoch)
    # discourse's B (never swapped) starts after its marker.
    skip = (plan.b_skip[ks] if plan.b_skip is not None
            else np.zeros(len(ks), np.int64))
    # SOP's wrong order lays B out first. ALBERT swaps before truncating, so
    # the truncation and its front/back coins see B as the first segment. A
    # swapped pair is never random: both segments are in ``doc``.
    swapped = plan.swapped[ks]
    first_start = np.where(swapped, b_start, start)
    first_end = np.where(swapped, b_end, a_end)
    second_start = np.where(swapped, start, b_start)
    second_end = np.where(swapped, a_end, b_end)
    len_first = csum[first_end] - csum[first_start]
    len_second = csum[second_end] - csum[second_start] - skip
    remove_first, remove_second = truncation_counts(
        len_first, len_second, self.config.max_seq_length - 3)
    if self.config.layout == 'sentence_distance':
      # Cut at the far ends, A's front and B's back, so that the join is
      # what the label says: a class-0 B still follows A (BERT's coins
      # could cut A's last or B's first sentence away, leaving a gap), and
      # every class joins at sentence edges (no cut there marks a class).
      front_first, front_second = remove_first, np.zeros_like(remove_second)
    else:
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
                        + skip + front_second,
                        np.full(n, _SEP)], 1),
        length=np.stack([one, len_first - remove_first, one,
                         len_second - remove_second, one], 1),
        token_type=np.broadcast_to(np.array([0, 0, 0, 1, 1]), (n, 5)))
    labels = (plan.label[ks] if plan.label is not None
              else plan.is_random[ks] | swapped)
    return segments, labels.astype(np.int32)

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

  Flags are int8: bit 0 the word start, bits 1-3 the unit label (see
  pretokenize: 0 none, 1/2 entity begin/inside, 3/4 phrase begin/inside),
  bit 4 ``capitalized``. Document -1 holds the specials [CLS] and [SEP] (a
  word start, label 0, not capitalized). ``sentence`` numbers each token's
  sentence, the sentences of all the batch's documents apart (-1 for the
  specials). With ``token_document``, the (document, id) pairs of the
  whole documents are kept too, sorted (``_token_document_labels``).
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
    capitalized, records = [np.zeros(2, bool)], []
    for d, a, b in zip(docs.tolist(), lo.tolist(), hi.tolist()):
      record = builder.source[d]
      records.append(record)
      ids.append(record['token_ids'][a:b])
      word_starts.append(record['word_starts'][a:b])
      labels.append(record['unit_labels'][a:b])
      capitalized.append(record['capitalized'][a:b])
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
    self.flags |= np.concatenate(capitalized).astype(np.int8) << 4
    # Each token's sentence: its position in the documents' tokens, laid
    # end to end, against their sentences' ends.
    lengths = [r['sentence_lengths'] for r in records]
    ends = _cumsum0(np.concatenate([np.zeros(0, np.int64), *lengths]))
    first_token = ends[_cumsum0([len(x) for x in lengths])[:-1]]
    piece = hi - lo
    position = np.repeat(first_token + lo, piece) + _ranks(piece)
    self.sentence = np.concatenate(
        [[-1, -1], np.searchsorted(ends, position, 'right') - 1])
    self.token_document = builder.config.token_document
    if self.token_document:
      self.slot = np.concatenate([[-1, -1], np.repeat(np.arange(len(docs)),
                                                      piece)])
      self.num_documents = len(docs)
      # (document slot, id) of every token of the documents, sorted.
      self.document_keys = np.sort(np.concatenate(
          [np.zeros(0, np.int64)] + [(i << 32) | r['token_ids'].astype(
              np.int64) for i, r in enumerate(records)]))

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
    sentence = np.full(shape, -1, np.int64)
    sentence[row, col] = self.sentence[src]
    batch = {'input_ids': input_ids, 'token_type_ids': token_type_ids,
             'attention_mask': attention_mask,
             'word_starts': (flags & 1).astype(bool),
             'unit_labels': ((flags >> 1) & 7).astype(np.int8),
             'capitalized': (flags & 16).astype(bool),
             'sentence_ids': _sentence_ids(sentence)}
    if self.token_document:
      batch['token_document_labels'] = self._token_document_labels(
          row, col, src, shape)
    return batch

  def _token_document_labels(self, row, col, src, shape) -> np.ndarray:
    """int32 ``shape``: 1 where a token's id occurs in its document outside
    the tokens that its row uses of that document, 0 elsewhere.

    Per (row, document): the id's count in the whole document against its
    count in the row's part of it (the segments of a row never overlap);
    a few sorts for the batch.
    """
    slot = self.slot[src]
    real = slot >= 0
    row, col, slot = row[real], col[real], slot[real]
    ids = self.ids[src[real]].astype(np.int64)
    _, in_row, counts = np.unique(
        ((row * self.num_documents + slot) << 32) | ids, return_inverse=True,
        return_counts=True)
    keys, in_batch = np.unique((slot << 32) | ids, return_inverse=True)
    in_document = (np.searchsorted(self.document_keys, keys, 'right')
                   - np.searchsorted(self.document_keys, keys, 'left'))
    labels = np.zeros(shape, np.int32)
    labels[row, col] = in_document[in_batch] > counts[in_row]
    return labels


def _sentence_ids(sentence: np.ndarray) -> np.ndarray:
  """int32 [n, L]: each token's sentence counted 0, 1, ... along its row,
  from ``sentence`` int64 [n, L] (any numbering of the sentences; -1 on
  specials and padding, which stay -1). A sentence starts where the number
  differs from the position before, so one after a [SEP] is always new."""
  previous = np.full_like(sentence, -1)
  previous[:, 1:] = sentence[:, :-1]
  starts = (sentence >= 0) & (sentence != previous)
  return np.where(sentence >= 0, np.cumsum(starts, axis=1) - 1,
                  -1).astype(np.int32)


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

  ``order_key``: counters added to the seed of the epochs' permutations,
  so that datasets of one corpus read it in different orders (a continual
  run's streams); () for a run's only stream.
  """

  _TRANSIENT = {'_lock': threading.Lock}

  def __init__(self, builder: InstanceBuilder, seed: int, dupe_factor: int,
               dynamic: bool, num_epochs: int | None = None,
               shuffle: bool = True, order_key: tuple[int, ...] = ()):
    super().__init__()
    self._builder = builder
    self._seed = seed
    self._order_key = tuple(int(k) for k in order_key)
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
        rng = np.random.default_rng(
            [self._seed, Stream.SHUFFLE, epoch, *self._order_key])
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
  per_instance = (
      'one per sentence that opens with a marker' if config.layout ==
      'discourse' else 'each document gives at least one' if config.layout
      in _PAIR_LAYOUTS else f'{config.layout} packs up to '
      f'{config.max_seq_length - 2} tokens in each')
  raise pretokenize.DataError(
      f'{what}, from {documents} documents of {tokens} tokens '
      f'(data.layout={config.layout!r}: {per_instance}), fewer than one '
      f'batch of batch_size={global_batch_size}. Use more text, or lower '
      'batch_size, or data.eval_fraction (or data.max_seq_length for '
      'a packed layout).')


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
