"""Corpus mixtures: several corpora sampled in proportion to size^S.

Multilingual BERT samples its languages with probabilities
``p_i = n_i^S / sum_j n_j^S``, ``n_i`` a language's size, S = 0.7: S = 1
keeps the natural shares, S = 0 samples the corpora uniformly, and values in
between raise the share of small corpora. Here ``n_i`` is the number of
tokens in component i's training split.

  prepare          one tokenizer shared by all components, then each
                   component pre-tokenized like a single corpus (and cached
                   like one, under its own fingerprint).
  MixedInstances   the mixed element stream over the components' own
                   endless ``InstanceDataset``s (a small corpus repeats more
                   often than a large one).

Exact shares with random access: the stream is cut into blocks of
``BLOCK_SIZE`` elements; every block holds the same number of slots per
component (``p_i * BLOCK_SIZE``, rounded by largest remainders, at least one
each), in an order shuffled per block by a counter-based permutation.
Element ``i`` is position ``r = i % BLOCK_SIZE`` of block
``b = i // BLOCK_SIZE``: it comes from component ``c = label_b[r]``, and is
element ``b * slots[c] + (positions before r in block b labelled c)`` of that
component's stream. So element ``i`` is a pure function of (seed, i), each
component's stream is read in order, and resuming is starting from an index.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import sys
import threading
from typing import Sequence

import numpy as np

from data_pipelines import corpus as corpus_lib
from data_pipelines import instances as instances_lib
from data_pipelines import pretokenize
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.counter_rng import Stream

# Elements per block of exact shares. A component's realized share differs
# from its slot share by less than one element per block.
BLOCK_SIZE = 2**16


def component_names(data_cfg) -> list[str]:
  """The mixture's components in sorted name order (empty: no mixture)."""
  return sorted(data_cfg.get('mixture') or {})


def is_mixture(data_cfg) -> bool:
  return bool(component_names(data_cfg))


def component_config(data_cfg, name: str):
  """A copy of the ``data`` section whose ``corpus`` is component ``name``.

  ``pretokenize.prepare`` of it builds and caches the component exactly as
  it would a single corpus.
  """
  cfg = copy.deepcopy(data_cfg)
  with cfg.unlocked():
    cfg.corpus = copy.deepcopy(data_cfg.mixture[name])
    cfg.mixture = type(cfg.mixture)()
  return cfg


def corpus_specs(data_cfg) -> dict[str, corpus_lib.CorpusSpec]:
  """Each component's corpus, by name (in sorted name order)."""
  return {name: corpus_lib.CorpusSpec.from_config(data_cfg.mixture[name])
          for name in component_names(data_cfg)}


def validate(data_cfg) -> None:
  """``corpus.validate`` of every component (reads no text but a sample).

  Raises:
    corpus.CorpusError: naming the component, e.g.
      ``data.mixture.wiki: corpus.path='/x' matches no files. ...``.
  """
  for name, spec in corpus_specs(data_cfg).items():
    try:
      corpus_lib.validate(spec)
    except corpus_lib.CorpusError as e:
      raise corpus_lib.CorpusError(f'data.mixture.{name}: {e}') from e


def fingerprints(data_cfg) -> dict[str, str]:
  """``corpus.fingerprint`` of every component, by name."""
  return {name: corpus_lib.fingerprint(spec)
          for name, spec in corpus_specs(data_cfg).items()}


def sampling_probabilities(sizes: Sequence[float], exponent: float
                           ) -> np.ndarray:
  """``p_i = n_i^S / sum_j n_j^S``.

  Args:
    sizes: ``n_i``, the components' sizes (training tokens), all > 0.
    exponent: ``S``; 1 = natural shares, 0 = uniform.

  Returns:
    float64 [num_components], summing to 1.
  """
  sizes = np.asarray(sizes, np.float64)
  if sizes.ndim != 1 or not len(sizes) or np.any(sizes <= 0):
    raise ValueError(f'mixture sizes must be positive; got {sizes}.')
  weights = sizes**exponent
  return weights / weights.sum()


def apportion(weights: Sequence[float], total: int) -> np.ndarray:
  """int64 [len(weights)]: ``total`` split in proportion to ``weights``
  (not all 0), by largest remainders, ties to the earlier; sums to
  ``total``."""
  w = np.asarray(weights, np.float64)
  quota = w / w.sum() * total
  parts = np.floor(quota).astype(np.int64)
  remainder_order = np.argsort(-(quota - parts), kind='stable')
  parts[remainder_order[:total - parts.sum()]] += 1
  return parts


def block_slots(probabilities: Sequence[float], block_size: int
                ) -> np.ndarray:
  """Elements per block for each component: ``p_i * block_size`` rounded.

  Largest-remainder rounding (``apportion``), then every
  component with ``p_i > 0`` is given at least one slot, taken from the
  component with the most.

  Returns:
    int64 [num_components], summing to ``block_size``.
  """
  p = np.asarray(probabilities, np.float64)
  if block_size < np.count_nonzero(p > 0):
    raise ValueError(f'block_size={block_size} is smaller than the number '
                     f'of components ({np.count_nonzero(p > 0)}).')
  slots = apportion(p, block_size)
  for c in np.flatnonzero((p > 0) & (slots == 0)):
    slots[np.argmax(slots)] -= 1
    slots[c] += 1
  return slots


# ---------------------------------------------------------------------------
# Preparation: one tokenizer, then each component as a single corpus.


def equal_shares(sizes: Sequence[int], total: int) -> list[int]:
  """Shares of ``total`` as equal as ``sizes`` allow: each at most its size,
  the level the same for all that are not (the remainder of a split, one
  each, to the first of them). All of each if the sizes sum to no more."""
  if sum(sizes) <= total:
    return list(sizes)
  low, high = 0, max(sizes)   # The highest level whose shares fit.
  while low < high:
    mid = (low + high + 1) // 2
    if sum(min(n, mid) for n in sizes) <= total:
      low = mid
    else:
      high = mid - 1
  shares = [min(n, low) for n in sizes]
  remainder = total - sum(shares)
  for c, n in enumerate(sizes):
    if remainder and n > low:
      shares[c] += 1
      remainder -= 1
  return shares


def tokenizer_sample(specs: Sequence[corpus_lib.CorpusSpec], k: int,
                     seed: int, workers: int = 1) -> list[str]:
  """The tokenizer's ``k`` sentences from the components: from each, an
  ``equal_shares`` part of ``k`` (all of a component's text if it has
  less), a seeded uniform sample of it (``pretokenize.smallest_keys``,
  by ``workers`` processes); then one from each in turn.

  So a small corpus's pieces are not crowded out of the vocabulary (the
  aim of mBERT's smoothing, taken further); when the whole mixture fits in
  ``k``, the sample is all of its text (natural shares). Memory for two
  samples of ``k``: after each component, those read so far are cut to
  their shares of ``k`` among them, which the later ones only lower.
  """
  sizes: list[int] = []   # Each component's sentences, up to k.
  samples: list[list[tuple]] = []
  for spec in specs:
    samples.append(pretokenize.smallest_keys(spec, k, seed, workers))
    sizes.append(len(samples[-1]))
    samples = [sample[:share] for sample, share
               in zip(samples, equal_shares(sizes, k))]
  in_order = [pretokenize.in_corpus_order(sample) for sample in samples]
  return [sentence for turn in itertools.zip_longest(*in_order)
          for sentence in turn if sentence is not None]


def load_or_train_tokenizer(data_cfg, corpus_fingerprints: dict[str, str],
                            may_train: bool = True
                            ) -> tokenizer_lib.Tokenizer:
  """Loads ``tokenizer.model_path`` or trains one on all components.

  A trained model is cached like a single corpus's
  (``pretokenize.cached_tokenizer``), keyed by every component's name and
  fingerprint.

  Args:
    data_cfg: the config's ``data`` section, with a mixture.
    corpus_fingerprints: ``fingerprints(data_cfg)``.
    may_train: False: a model not yet trained is an error (as in
      ``pretokenize.cached_tokenizer``).
  """
  names = component_names(data_cfg)
  specs = corpus_specs(data_cfg)
  return pretokenize.cached_tokenizer(
      data_cfg, ('mixture', [[n, corpus_fingerprints[n]] for n in names]),
      lambda k, seed: tokenizer_sample(
          [specs[n] for n in names], k, seed,
          pretokenize.prepare_workers(data_cfg)),
      method='equal_shares', may_train=may_train)


@dataclasses.dataclass
class MixturePrepared:
  """The prepared components of a mixture and their sampling shares.

  Attributes:
    names: component names, sorted.
    components: each component's ``PreparedData``, in ``names`` order.
    tokenizer: the tokenizer all components share.
    exponent: ``S`` of ``p_i ~ n_i^S``.
  """
  names: tuple[str, ...]
  components: tuple[pretokenize.PreparedData, ...]
  tokenizer: tokenizer_lib.Tokenizer
  exponent: float

  @property
  def train_sizes(self) -> np.ndarray:
    """int64 [num_components]: tokens in each training split (``n_i``)."""
    return np.array([c.train_index.num_tokens for c in self.components],
                    np.int64)

  @property
  def probabilities(self) -> np.ndarray:
    """float64 [num_components]: the sampling probabilities ``p_i``."""
    return sampling_probabilities(self.train_sizes, self.exponent)

  @property
  def train_unigram_counts(self) -> np.ndarray:
    """[vocab_size]: the token frequencies of the sampled training stream,
    in tokens: component i's counts weighted by ``p_i N / n_i`` (``N`` the
    total), so that a component drawn above its natural share counts as
    often as it is seen (random replacement and the most-frequent-token
    baseline read the stream's distribution). The plain int64 sum at
    ``exponent`` 1 (natural shares), where the weights are all 1."""
    counts = [c.train_index.unigram_counts for c in self.components]
    if self.exponent == 1.0:
      return sum(counts)
    weights = self.probabilities * self.train_sizes.sum() / self.train_sizes
    return sum(w * c.astype(np.float64) for w, c in zip(weights, counts))

  @property
  def skipped(self) -> dict[str, int]:
    """``PreparedData.skipped`` summed over the components."""
    return {key: sum(c.skipped[key] for c in self.components)
            for key in corpus_lib.SKIP_COUNTERS}

  def summary(self) -> str:
    """A table: name, training tokens, natural share, sampled share."""
    sizes, p = self.train_sizes, self.probabilities
    width = max(len('component'), *(len(n) for n in self.names))
    lines = [f'{"component":<{width}}  {"tokens":>14}  natural  sampled']
    for name, n, share, q in zip(self.names, sizes, sizes / sizes.sum(), p):
      lines.append(f'{name:<{width}}  {n:>14,}  {share:7.4f}  {q:7.4f}')
    lines.append(f'(sampled ~ tokens^{self.exponent:g})')
    return '\n'.join(lines)


def prepare(data_cfg, num_threads: int = 0,
            tokenizer: tokenizer_lib.Tokenizer | None = None,
            corpus_fingerprints: dict[str, str] | None = None
            ) -> MixturePrepared:
  """Tokenizer + every component's pre-tokenized splits, built once, cached.

  Args:
    data_cfg: the config's ``data`` section, with a mixture.
    num_threads: tokenization threads (0 = one per core).
    tokenizer: the result of ``load_or_train_tokenizer`` if the caller
      already has it.
    corpus_fingerprints: ``fingerprints(data_cfg)`` if the caller already
      computed them.
  """
  names = component_names(data_cfg)
  if len(names) < 2:
    raise ValueError(f'data.mixture has {len(names)} component(s); a '
                     'mixture needs at least 2.')
  corpus_fingerprints = corpus_fingerprints or fingerprints(data_cfg)
  if tokenizer is None:
    tokenizer = load_or_train_tokenizer(data_cfg, corpus_fingerprints)
  components = []
  for name in names:
    try:
      components.append(pretokenize.prepare(
          component_config(data_cfg, name), num_threads, tokenizer=tokenizer,
          corpus_fingerprint=corpus_fingerprints[name]))
    except pretokenize.DataError as e:
      raise pretokenize.DataError(f'data.mixture.{name}: {e}') from e
  return MixturePrepared(tuple(names), tuple(components), tokenizer,
                         float(data_cfg.mixture_exponent))


# ---------------------------------------------------------------------------
# The mixed element stream.


class MixedInstances(instances_lib.BatchAccessDataset):
  """Element ``i`` of the mixture of the components' endless streams.

  The interface the pipeline uses from ``instances.InstanceDataset``:
  ``get_batch`` (vectorized), ``__getitem__`` and ``__len__`` (endless:
  ``sys.maxsize``). See the module docstring for the block scheme.

  Masking draws from (``mask_epoch``, ``example_index``), which two
  components repeat; a component-``c`` element's ``mask_epoch`` becomes
  ``mask_epoch * num_components + c`` so that their masks are independent.
  """

  _TRANSIENT = {'_lock': threading.Lock,
                '_blocks': collections.OrderedDict}

  def __init__(self, components: Sequence, probabilities: Sequence[float],
               seed: int, block_size: int = BLOCK_SIZE):
    """Mixes ``components`` (endless, random-access ``get_batch``).

    Args:
      components: one ``InstanceDataset`` (or alike) per component.
      probabilities: ``p_i``, one per component.
      seed: the config's seed (the block permutations derive from it).
      block_size: elements per block of exact shares.
    """
    super().__init__()
    if len(components) != len(probabilities):
      raise ValueError(f'{len(components)} components but '
                       f'{len(probabilities)} probabilities.')
    self._components = tuple(components)
    self._probabilities = np.asarray(probabilities, np.float64)
    self._seed = seed
    self._block_size = block_size
    self._slots = block_slots(self._probabilities, block_size)
    self._unshuffled_labels = np.repeat(
        np.arange(len(components), dtype=np.int32), self._slots)
    # Rank of each position of the sorted labels among its own label's.
    self._unshuffled_ranks = np.arange(block_size) - np.repeat(
        np.cumsum(self._slots) - self._slots, self._slots)
    self._blocks: collections.OrderedDict[int, tuple] = (
        collections.OrderedDict())
    self._lock = threading.Lock()

  @property
  def components(self) -> tuple:
    return self._components

  @property
  def slots(self) -> np.ndarray:
    """int64 [num_components]: elements of each component per block."""
    return self._slots

  @property
  def block_size(self) -> int:
    return self._block_size

  def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(label, rank) of every position of ``block``: int32 and int64
    [block_size]; rank = positions before it with the same label. Cached
    (the last few blocks; thread-safe)."""
    with self._lock:
      if block not in self._blocks:
        rng = np.random.default_rng([self._seed, Stream.MIXTURE, block])
        labels = self._unshuffled_labels[rng.permutation(self._block_size)]
        ranks = np.empty(self._block_size, np.int64)
        ranks[np.argsort(labels, kind='stable')] = self._unshuffled_ranks
        self._blocks[block] = (labels, ranks)
        while len(self._blocks) > 4:
          self._blocks.popitem(last=False)
      return self._blocks[block]

  def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
    """(component, index in the component's stream) of each element.

    Args:
      indices: int [n], element indices.

    Returns:
      Two int64 [n] arrays.
    """
    indices = np.asarray(indices, np.int64)
    blocks, positions = np.divmod(indices, self._block_size)
    component = np.empty(indices.shape, np.int64)
    within = np.empty(indices.shape, np.int64)
    for block in np.unique(blocks):  # Usually one; two at a block's end.
      rows = blocks == block
      labels, ranks = self._block(int(block))
      c = labels[positions[rows]]
      component[rows] = c
      within[rows] = block * self._slots[c] + ranks[positions[rows]]
    return component, within

  def component_of(self, indices) -> np.ndarray:
    """int64 [n]: the component each of ``indices`` comes from."""
    return self.locate(indices)[0]

  def get_batch(self, indices) -> dict:
    """Elements ``indices``, stacked: the components' fields, in order."""
    component, within = self.locate(indices)
    if not len(component):
      raise ValueError('get_batch needs at least one index.')
    n, num_components = len(component), len(self._components)
    batch = None
    for c in np.unique(component):
      rows = np.flatnonzero(component == c)
      part = self._components[c].get_batch(within[rows])
      part['mask_epoch'] = part['mask_epoch'] * num_components + c
      if batch is None:
        batch = {key: np.empty((n,) + value.shape[1:], value.dtype)
                 for key, value in part.items()}
      for key, value in part.items():
        batch[key][rows] = value
    return batch

  def __len__(self) -> int:
    return sys.maxsize

  def __str__(self) -> str:
    shares = ', '.join(f'{p:.3f}' for p in self._probabilities)
    return (f'MixedInstances({len(self._components)} components, '
            f'p=[{shares}])')
