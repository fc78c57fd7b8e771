"""Pretraining instances built on the fly from pre-tokenized documents.

Two layouts:

* ``nsp``: google-research/bert's ``create_instances_from_document``. Per
  document a target length (``max_seq_length - 3``, or with probability
  ``short_seq_prob`` a uniform length in [2, that]); sentences are gathered
  into chunks until the target is reached; each chunk splits at a random
  sentence into A and B; with probability 0.5 (always for a one-sentence
  chunk) B is replaced by sentences from a random other document and the
  unused sentences are put back for the next chunk; the pair is truncated
  from the longer side, front or back at random.
* ``full_sentences``: RoBERTa's FULL-SENTENCES. Whole sentences are packed
  contiguously, across document boundaries (a [SEP] marks each boundary), up
  to ``max_seq_length - 2`` tokens; no NSP.

Planning (which sentences form which instance) is vectorized over documents
and uses only the ``DocumentIndex``; documents are read when an instance is
materialized. All randomness is counter-based on (seed, data epoch, ...), so
an instance is a pure function of its index: Grain can fetch it from any
worker on any host, and a resumed run rebuilds exactly the same one.

Departure from google-research/bert: a random B is drawn from a document
different from A's in one draw (the reference tries 10 times and may fall back
to the same document).
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

LAYOUTS = ('nsp', 'full_sentences')
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
  For ``full_sentences``, the instance is [start, end) and may span documents.
  """
  document: np.ndarray     # int64 [N]
  start: np.ndarray        # int64 [N]
  a_end: np.ndarray        # int64 [N]
  end: np.ndarray          # int64 [N]
  is_random: np.ndarray    # bool  [N]
  target_length: np.ndarray  # int64 [N]

  def __len__(self) -> int:
    return len(self.start)


def _cumsum0(x: np.ndarray) -> np.ndarray:
  return np.concatenate([[0], np.cumsum(x, dtype=np.int64)])


def plan_nsp(index: pretokenize.DocumentIndex, max_seq_length: int,
             short_seq_prob: float, seed: int, data_epoch: int) -> Plan:
  """BERT's chunking of every document, vectorized over documents."""
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
  while active.size:
    p, e, t = pos[active], doc_end[active], target[active]
    q = np.searchsorted(csum, csum[p] + t, side='left')
    q = np.clip(q, p + 1, e)
    n = q - p
    v = counter_rng.uniform(seed, Stream.CHUNK_PLAN, data_epoch, active,
                            chunk_number, num=2)
    a_len = np.where(n >= 2, 1 + np.minimum((v[:, 0] * (n - 1)).astype(
        np.int64), n - 2), 1)
    is_random = (n == 1) | (v[:, 1] < 0.5)
    for name, value in (('document', active), ('start', p),
                        ('a_end', p + a_len), ('end', q),
                        ('is_random', is_random), ('target_length', t)):
      columns[name].append(value)
    # A random B puts the chunk's unused sentences back (BERT's i -= unused).
    nxt = np.where(is_random, p + a_len, q)
    pos[active] = nxt
    active = active[nxt < e]
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
  return _to_plan(columns)


def _to_plan(columns) -> Plan:
  return Plan(**{k: np.concatenate(v) if v else np.zeros(0, np.int64)
                 for k, v in columns.items()})


def truncation_counts(len_a: int, len_b: int, max_num_tokens: int
                      ) -> tuple[int, int]:
  """Tokens BERT's ``truncate_seq_pair`` removes from A and from B.

  It removes one token at a time from the longer sequence (from B on a tie)
  until the pair fits; the counts follow in closed form.
  """
  excess = len_a + len_b - max_num_tokens
  if excess <= 0:
    return 0, 0
  first = min(abs(len_a - len_b), excess)
  remove_a, remove_b = (first, 0) if len_a > len_b else (0, first)
  rest = excess - first
  return remove_a + rest // 2, remove_b + (rest + 1) // 2


class InstanceBuilder:
  """Plans and materializes the instances of one split."""

  def __init__(self, source, index: pretokenize.DocumentIndex,
               config: InstanceConfig, seed: int):
    if config.layout not in LAYOUTS:
      raise ValueError(f'data.layout={config.layout!r}; use one of {LAYOUTS}.')
    if config.layout == 'nsp' and index.num_documents < 2:
      raise ValueError('data.layout="nsp" draws negatives from other '
                       f'documents; the split has {index.num_documents}.')
    self.source = source
    self.index = index
    self.config = config
    self.seed = seed
    self._csum = _cumsum0(index.sentence_lengths)
    self._plans: collections.OrderedDict[int, Plan] = (
        collections.OrderedDict())
    self._lock = threading.Lock()

  def __getstate__(self):
    # Grain's worker processes receive the pipeline by pickling; locks and
    # cached plans stay behind and are rebuilt there.
    state = dict(self.__dict__)
    state['_lock'] = None
    state['_plans'] = collections.OrderedDict()
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def plan(self, data_epoch: int) -> Plan:
    """The plan of one data epoch (cached; thread-safe)."""
    with self._lock:
      if data_epoch not in self._plans:
        if self.config.layout == 'nsp':
          plan = plan_nsp(self.index, self.config.max_seq_length,
                          self.config.short_seq_prob, self.seed, data_epoch)
        else:  # Packing is deterministic: every epoch has the same plan.
          plan = self._plans.get(0) or plan_full_sentences(
              self.index, self.config.max_seq_length)
        self._plans[data_epoch] = plan
        while len(self._plans) > 2:
          self._plans.popitem(last=False)
      return self._plans[data_epoch]

  def _sentences(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and flags of global sentences [start, end) of one doc.

    Flags are int8: bit 0 the word start, bits 1+ the unit label (see
    pretokenize: 0 none, 1/2 entity begin/inside, 3/4 phrase begin/inside).
    """
    doc = int(np.searchsorted(self.index.document_offsets, start, 'right') - 1)
    record = self.source[doc]
    first_sentence = self.index.document_offsets[doc]
    t0 = self._csum[start] - self._csum[first_sentence]
    t1 = self._csum[end] - self._csum[first_sentence]
    flags = record['word_starts'][t0:t1].astype(np.int8)
    if 'unit_labels' in record:
      flags |= record['unit_labels'][t0:t1].astype(np.int8) << 1
    return record['token_ids'][t0:t1], flags

  def materialize(self, plan: Plan, k: int, data_epoch: int) -> dict:
    """Instance ``k`` of ``plan``: unpadded token ids, types, word starts,
    unit labels (specials start a word and have label 0)."""
    if self.config.layout == 'nsp':
      instance = self._materialize_nsp(plan, k, data_epoch)
    else:
      instance = self._materialize_packed(plan, k)
    flags = instance.pop('flags')
    instance['word_starts'] = (flags & 1).astype(bool)
    instance['unit_labels'] = (flags >> 1).astype(np.int8)
    return instance

  def _materialize_nsp(self, plan: Plan, k: int, data_epoch: int) -> dict:
    max_num_tokens = self.config.max_seq_length - 3
    a_ids, a_flags = self._sentences(plan.start[k], plan.a_end[k])
    is_random = bool(plan.is_random[k])
    counters = (self.seed, data_epoch, k)
    if is_random:
      num_docs = self.index.num_documents
      doc = plan.document[k]
      r = int(counter_rng.randint(0, num_docs - 1, counters[0],
                                  Stream.PAIRING, *counters[1:], 0))
      r += r >= doc  # Uniform over the other documents.
      offsets = self.index.document_offsets
      b_start = int(counter_rng.randint(offsets[r], offsets[r + 1],
                                        counters[0], Stream.PAIRING,
                                        *counters[1:], 1))
      target_b = plan.target_length[k] - len(a_ids)
      b_end = np.searchsorted(self._csum, self._csum[b_start] + target_b,
                              'left')
      b_end = int(np.clip(b_end, b_start + 1, offsets[r + 1]))
      b_ids, b_flags = self._sentences(b_start, b_end)
    else:
      b_ids, b_flags = self._sentences(plan.a_end[k], plan.end[k])
    remove_a, remove_b = truncation_counts(len(a_ids), len(b_ids),
                                           max_num_tokens)
    a_ids, a_flags = _truncate(a_ids, a_flags, remove_a, counters, 0)
    b_ids, b_flags = _truncate(b_ids, b_flags, remove_b, counters, 1)
    ids = np.concatenate([[CLS_ID], a_ids, [SEP_ID], b_ids, [SEP_ID]])
    types = np.concatenate([np.zeros(len(a_ids) + 2, np.int32),
                            np.ones(len(b_ids) + 1, np.int32)])
    flags = np.concatenate([[1], a_flags, [1], b_flags, [1]]).astype(np.int8)
    return {'input_ids': ids.astype(np.int32), 'token_type_ids': types,
            'flags': flags, 'next_sentence_label': np.int32(is_random)}

  def _materialize_packed(self, plan: Plan, k: int) -> dict:
    max_num_tokens = self.config.max_seq_length - 2
    start, end = int(plan.start[k]), int(plan.end[k])
    offsets = self.index.document_offsets
    ids, flags = [np.array([CLS_ID])], [np.array([1], np.int8)]
    doc = int(plan.document[k])
    while start < end:
      piece_end = min(end, int(offsets[doc + 1]))
      if start == offsets[doc] and len(ids) > 1:
        ids.append(np.array([SEP_ID]))
        flags.append(np.array([1], np.int8))
      piece_ids, piece_flags = self._sentences(start, piece_end)
      ids.append(piece_ids)
      flags.append(piece_flags)
      start, doc = piece_end, doc + 1
    ids = np.concatenate(ids)[:max_num_tokens + 1]
    flags = np.concatenate(flags)[:max_num_tokens + 1]
    ids = np.append(ids, SEP_ID).astype(np.int32)
    return {'input_ids': ids, 'token_type_ids': np.zeros(len(ids), np.int32),
            'flags': np.append(flags, 1).astype(np.int8),
            'next_sentence_label': np.int32(0)}


def _truncate(ids, flags, remove, counters, which):
  """Removes ``remove`` tokens, each from the front or back with p = 0.5."""
  if not remove:
    return ids, flags
  coins = counter_rng.uniform(counters[0], Stream.TRUNCATION, *counters[1:],
                              which, num=remove)
  front = int((coins < 0.5).sum())
  keep = slice(front, len(ids) - (remove - front))
  return ids[keep], flags[keep]


def pad_instance(instance: dict, max_seq_length: int) -> dict:
  """Pads an instance to fixed shapes; adds ``attention_mask``."""
  n = len(instance['input_ids'])
  pad = max_seq_length - n

  def padded(x, value):
    return np.pad(x, (0, pad), constant_values=value)

  return {
      'input_ids': padded(instance['input_ids'], PAD_ID),
      'token_type_ids': padded(instance['token_type_ids'], 0),
      'attention_mask': padded(np.ones(n, np.int32), 0),
      'word_starts': padded(instance['word_starts'], False),
      'unit_labels': padded(instance['unit_labels'], 0),
      'next_sentence_label': instance['next_sentence_label'],
  }


class InstanceDataset(grain.MapDataset):
  """Instance ``i`` of an endless stream of shuffled epochs.

  Element ``i`` is a pure function of ``i`` and the seed: its epoch and
  position follow from the epochs' sizes, each epoch is a fresh permutation,
  and with static masking the data epoch (plan and masks) cycles through
  ``dupe_factor`` versions while the order still changes every epoch.

  Each element is padded to ``max_seq_length`` and carries
  ``example_index`` (its position in the data epoch's plan) and
  ``mask_epoch``, the counters that masking uses.
  """

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

  def __getstate__(self):
    state = dict(self.__dict__)
    state['_lock'] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def data_epoch(self, epoch: int) -> int:
    return epoch if self._dynamic else epoch % self._dupe_factor

  def _epoch_start(self, epoch: int) -> int:
    while len(self._epoch_starts) <= epoch:
      e = len(self._epoch_starts) - 1
      size = len(self._builder.plan(self.data_epoch(e)))
      if size == 0:
        raise ValueError('an epoch has no instances: the split is empty.')
      self._epoch_starts.append(self._epoch_starts[-1] + size)
    return self._epoch_starts[epoch]

  def locate(self, i: int) -> tuple[int, int]:
    """(epoch, position in the epoch) of element ``i``."""
    with self._lock:
      epoch = 0
      while self._epoch_start(epoch + 1) <= i:
        epoch += 1
      return epoch, i - self._epoch_starts[epoch]

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

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    epoch, j = self.locate(index)
    data_epoch = self.data_epoch(epoch)
    plan = self._builder.plan(data_epoch)
    k = int(self._order(epoch, len(plan))[j])
    instance = pad_instance(self._builder.materialize(plan, k, data_epoch),
                            self._builder.config.max_seq_length)
    # Masks are keyed by (data epoch, position in its plan), so static
    # masking repeats them when a data epoch comes round again.
    instance['example_index'] = np.int64(k)
    instance['mask_epoch'] = np.int64(data_epoch)
    return instance

  def __str__(self) -> str:
    return (f'InstanceDataset(layout={self._builder.config.layout}, '
            f'dynamic={self._dynamic}, dupe_factor={self._dupe_factor})')
