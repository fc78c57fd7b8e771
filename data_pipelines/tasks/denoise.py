"""Denoising tasks in encoder form: the input is corrupted on the host and
the encoder labels what was done, per token or per row.

Six tasks, from BART's Table 1 (Lewis et al., ACL 2020) and T5's Table 4
(Raffel et al., JMLR 2020); each is a corrupting task with its own
``rate``:

====================  =====================================================
task                  corruption -> labels
====================  =====================================================
token_deletion        each token deleted with p = rate, the rest shift left
                      -> per kept token (and [SEP]): was a token deleted
                      right before it?
token_insertion       a random token inserted before each token with
                      p = rate -> per token: was it inserted?
token_replacement     each token replaced by a different random token with
                      p = rate -> per token: was it replaced?
token_shuffle         the tokens at positions chosen with p = rate permuted
                      among themselves -> per token: is it not the one that
                      was there?
sentence_permutation  a row's sentences shuffled (p = rate per row) -> at
                      each sentence's first token, its original index
document_rotation     the content rotated to start at a random word start
                      (p = rate per row) -> where the original first token
                      went
====================  =====================================================

"Token" here means a real token that is not a special: ``sentence_ids`` >=
0. Every draw is ``Counters.uniform(seed, stream, mask_epoch,
example_index, counter)`` with the task's stream: the counter is the
position for a position's first draw and ``-1 - position`` for its second
(a sentence's draw uses its original index; a row's draw no counter, but
document rotation's two, 0 and 1), so a row's corruption does not depend
on the batch it sits in.

Deletion, insertion, sentence permutation and document rotation move
every per-token field with the tokens (``input_ids``, ``token_type_ids``,
``attention_mask``, ``word_starts``, ``unit_labels``, ``sentence_ids``,
``capitalized``, ``token_document_labels``, those present).
``sentence_ids`` is then renumbered 0, 1, 2... in order of appearance, so
it keeps its meaning (as in the instance builder, a sentence starts where
the original sentence differs from the position before's, so one after a
[SEP] is always new); the original indices are in the labels. Replacement
and shuffle change ``input_ids`` only: each position keeps its segment,
sentence and word structure. The facts the builder recorded of a token
(``capitalized``, ``token_document_labels``) are then not those of a
replaced or shuffled token, nor known for an inserted one, so those three
tasks share no stream with capitalization or token_document
(``HostTask.new_tokens``; the config checks refuse it).

Design choices:

- token_deletion: a kept piece of a word whose earlier pieces were all
  deleted becomes a word start (whole-word masking sees what is left of
  the word as a word).
- token_insertion: an inserted token takes the ``token_type_ids`` and
  ``sentence_ids`` of the token after it, ``word_starts`` True,
  ``unit_labels`` 0, ``capitalized`` False. A row that grows past L keeps
  its first L - 1 tokens and its final [SEP]: a pair's middle [SEP] is
  dropped only with all of the second segment (the row may then end
  ``A [SEP] [SEP]`` or with B's first tokens only).
- sentence_permutation: sentences are permuted within each segment (a run
  of one ``token_type_ids`` value), and the [SEP] that ends a segment stays
  where it is, so a pair keeps ``[CLS] A [SEP] B [SEP]`` with the same
  segment lengths. A [SEP] inside a segment (a document boundary of
  ``full_sentences``) travels with the sentence before it.
- document_rotation needs a packed layout (``data.layout='full_sentences'``
  or ``'doc_sentences'``): in a pair the
  rotated ``token_type_ids`` (1 then 0) would show where the original start
  is. Inner [SEP]s rotate with the content; a row with no word start after
  its first content token is not rotated.
"""

from __future__ import annotations

import numbers

import numpy as np

from data_pipelines.counter_rng import Stream
from data_pipelines.masking.draws import Counters
from data_pipelines.tasks.base import HostTask
from data_pipelines.tasks.base import register
from data_pipelines.tasks.base import token_task
from data_pipelines.tasks.base import token_weights
from data_pipelines.tokenizer import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID

# The per-token fields a corruption moves, and their value on padding.
TOKEN_FIELD_PADDING = {
    'input_ids': PAD_ID,
    'token_type_ids': 0,
    'attention_mask': 0,
    'word_starts': False,
    'unit_labels': 0,
    'sentence_ids': -1,
    'capitalized': False,
    # Built by the instance builder for token_document.
    'token_document_labels': 0,
}
# The fields of a token inserted before a token (others copy that token's;
# its capitalization and document relation are unknown, so no task that
# reads them shares its stream).
_INSERTED_TOKEN_VALUES = {'attention_mask': 1, 'word_starts': True,
                          'token_document_labels': 0,
                          'unit_labels': 0, 'capitalized': False}


# ---------------------------------------------------------------------------
# Shared pieces (also used by reordering.py).


def check_rate(name: str, params: dict, errors: list[str],
               typical: float) -> None:
  """Appends an error unless ``params['rate']`` is a number in (0, 1]."""
  rate = params.get('rate')
  if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not (
      0 < rate <= 1):
    errors.append(f'tasks.{name}.rate={rate!r} must be a number in (0, 1]; '
                  f'use e.g. {typical}.')


def positions_of(batch: dict) -> np.ndarray:
  """int64 [1, L]: the positions of a row."""
  return np.arange(np.shape(batch['input_ids'])[1])[None, :]


def content_span(batch: dict) -> np.ndarray:
  """bool [B, L]: the positions strictly between [CLS] and the row's final
  [SEP] (the tokens and any inner [SEP])."""
  final_sep = np.asarray(batch['attention_mask']).sum(axis=1) - 1
  positions = positions_of(batch)
  return (positions >= 1) & (positions < final_sep[:, None])


def sentence_starts(sentence_ids: np.ndarray) -> np.ndarray:
  """bool [B, L]: the tokens (``sentence_ids`` >= 0) whose sentence differs
  from the position before's, so one after a [SEP] always starts one (the
  instance builder's rule)."""
  previous = np.pad(sentence_ids[:, :-1], ((0, 0), (1, 0)),
                    constant_values=-1)
  return (sentence_ids >= 0) & (sentence_ids != previous)


def renumber_sentences(sentence_ids: np.ndarray) -> np.ndarray:
  """int32 [B, L]: sentences numbered 0, 1, 2... in order of appearance;
  -1 where ``sentence_ids`` is."""
  starts = sentence_starts(sentence_ids)
  return np.where(sentence_ids >= 0, np.cumsum(starts, axis=1) - 1,
                  -1).astype(np.int32)


def token_fields(batch: dict) -> dict:
  """The batch's per-token fields that move with the tokens (those
  present), each [B, L]."""
  return {name: np.asarray(batch[name]) for name in TOKEN_FIELD_PADDING
          if name in batch}


def gather_tokens(fields: dict, source: np.ndarray,
                  length: np.ndarray | None = None) -> dict:
  """Builds new rows from ``fields`` (each [B, N]).

  Args:
    fields: per-token fields, as ``token_fields`` gives (N may exceed L).
    source: int [B, L], the index in N each new position takes.
    length: int [B], the new rows' lengths (later positions become
      padding); None keeps every position.

  Returns:
    The fields, each [B, L] and of its dtype, ``sentence_ids`` renumbered.
  """
  valid = None if length is None else (
      np.arange(source.shape[1])[None, :] < length[:, None])
  moved = {}
  for name, values in fields.items():
    taken = np.take_along_axis(values, source, axis=1)
    if valid is not None:
      taken = np.where(valid, taken, TOKEN_FIELD_PADDING[name])
    moved[name] = taken.astype(values.dtype, copy=False)
  if 'sentence_ids' in moved:
    moved['sentence_ids'] = renumber_sentences(moved['sentence_ids'])
  return moved


def order_between_fixed(fixed: np.ndarray, rank: np.ndarray) -> np.ndarray:
  """int [B, L]: the source position of each new position, when the tokens
  between two fixed positions are reordered by ``rank``.

  Args:
    fixed: bool [B, L], positions that stay where they are ([CLS], an end
      [SEP], padding).
    rank: [B, L] (int or float), the sort key of each movable position
      within its run between fixed positions; equal ranks keep their order.
  """
  fixed_so_far = np.cumsum(fixed, axis=1)
  # A fixed position sorts just before the run that follows it.
  run = 2 * fixed_so_far - fixed
  positions = np.broadcast_to(np.arange(fixed.shape[1]), fixed.shape)
  return np.lexsort((positions, np.where(fixed, 0, rank), run), axis=-1)


def random_other_tokens(input_ids: np.ndarray, u: np.ndarray,
                        vocab_size: int) -> np.ndarray:
  """int [B, L]: for uniform draws ``u`` [B, L], a token uniform over the
  non-special vocabulary, never the token in ``input_ids`` (a special, such
  as [UNK], is replaced by any of them)."""
  ordinary = input_ids >= NUM_SPECIAL
  choices = (vocab_size - NUM_SPECIAL) - ordinary
  drawn = NUM_SPECIAL + np.minimum((u * choices).astype(np.int64),
                                   choices - 1)
  return drawn + (ordinary & (drawn >= input_ids))


def _rate_task_check(name: str, typical: float):
  """A ``check`` for a task whose only knob is ``rate``."""

  def check(params: dict, data_cfg, errors: list[str]) -> None:
    del data_cfg
    check_rate(name, params, errors, typical)

  return check


# ---------------------------------------------------------------------------
# token_deletion.


def _word_starts_after_deletion(word_starts: np.ndarray, source: np.ndarray,
                                moved: dict) -> np.ndarray:
  """bool [B, L]: ``word_starts`` moved to ``source``, plus the first kept
  piece of a word whose start was deleted."""
  word_number = np.cumsum(word_starts, axis=1)
  moved_number = np.take_along_axis(word_number, source, axis=1)
  previous = np.pad(moved_number[:, :-1], ((0, 0), (1, 0)),
                    constant_values=-1)
  first_kept = (moved['sentence_ids'] >= 0) & (moved_number != previous)
  return moved['word_starts'] | first_kept


def delete_tokens(batch: dict, params: dict, seed: int) -> dict:
  """BART's token deletion: each token deleted with p = ``rate``.

  Returns:
    A new batch: the kept tokens shifted left (fields moved, padding at the
    end); ``token_deletion_labels`` int32 [B, L], 1 at a kept token (not
    [CLS]) right after a deleted one; ``token_deletion_weights`` float32
    [B, L], 1 at every kept real token but [CLS].
  """
  input_ids = np.asarray(batch['input_ids'])
  counters = Counters.of_batch(batch, seed)
  draws = counters.uniform(Stream.TOKEN_DELETION, positions_of(batch))
  deleted = (np.asarray(batch['sentence_ids']) >= 0) & (
      draws < params['rate'])
  kept = (np.asarray(batch['attention_mask']) > 0) & ~deleted
  labelled = kept & (input_ids != CLS_ID)
  after_deleted = labelled & np.pad(deleted[:, :-1], ((0, 0), (1, 0)))
  source = np.argsort(~kept, axis=1, kind='stable')   # Kept ones first.
  length = kept.sum(axis=1)
  moved = gather_tokens(token_fields(batch), source, length)
  if 'word_starts' in moved:
    moved['word_starts'] = _word_starts_after_deletion(
        np.asarray(batch['word_starts']), source, moved)
  valid = np.arange(source.shape[1])[None, :] < length[:, None]
  out = dict(batch)
  out.update(moved)
  out['token_deletion_labels'] = (
      np.take_along_axis(after_deleted, source, axis=1) & valid).astype(
          np.int32)
  out['token_deletion_weights'] = (
      np.take_along_axis(labelled, source, axis=1) & valid).astype(
          np.float32)
  return out


# ---------------------------------------------------------------------------
# token_insertion.


def _interleave(inserted: np.ndarray, original: np.ndarray) -> np.ndarray:
  """[B, 2L]: slot 2p holds ``inserted[:, p]``, slot 2p + 1
  ``original[:, p]``."""
  inserted, original = np.broadcast_arrays(inserted, original)
  return np.stack([inserted, original], axis=2).reshape(
      original.shape[0], -1)


def _truncated_source(present: np.ndarray, seq_len: int):
  """The slots (of bool ``present`` [B, 2L]) each of L positions takes:
  a row's first L - 1 present slots and its last one.

  Returns:
    (source int [B, L], length int [B]).
  """
  order = np.argsort(~present, axis=1, kind='stable')   # Present first.
  count = present.sum(axis=1)
  length = np.minimum(count, seq_len)
  source = order[:, :seq_len].copy()
  rows = np.arange(len(order))
  last = np.maximum(length - 1, 0)
  source[rows, last] = order[rows, np.maximum(count - 1, 0)]
  return source, length


def insert_tokens(batch: dict, params: dict, seed: int) -> dict:
  """Token insertion: a random token inserted before each token with
  p = ``rate`` (see the module docstring for the fields of an inserted
  token and for a row that grows past L).

  Returns:
    A new batch with the fields moved; ``token_insertion_labels`` int32
    [B, L], 1 at inserted tokens; ``token_insertion_weights`` float32
    [B, L], 1 at inserted and original tokens.
  """
  input_ids = np.asarray(batch['input_ids'])
  seq_len = input_ids.shape[1]
  is_token = np.asarray(batch['sentence_ids']) >= 0
  counters = Counters.of_batch(batch, seed)
  positions = positions_of(batch)
  inserted = is_token & (
      counters.uniform(Stream.TOKEN_INSERTION, positions) < params['rate'])
  new_tokens = random_other_tokens(
      np.zeros_like(input_ids),
      counters.uniform(Stream.TOKEN_INSERTION, -1 - positions),
      params['vocab_size'])
  expanded = {}
  for name, values in token_fields(batch).items():
    before = (new_tokens if name == 'input_ids' else
              _INSERTED_TOKEN_VALUES.get(name, values))
    expanded[name] = _interleave(
        np.asarray(before, values.dtype), values)
  present = _interleave(inserted, np.asarray(batch['attention_mask']) > 0)
  source, length = _truncated_source(present, seq_len)
  valid = np.arange(seq_len)[None, :] < length[:, None]
  out = dict(batch)
  out.update(gather_tokens(expanded, source, length))
  labels = np.take_along_axis(_interleave(inserted, False), source, axis=1)
  weights = np.take_along_axis(_interleave(inserted, is_token), source,
                               axis=1)
  out['token_insertion_labels'] = (labels & valid).astype(np.int32)
  out['token_insertion_weights'] = (weights & valid).astype(np.float32)
  return out


# ---------------------------------------------------------------------------
# token_replacement and token_shuffle: only input_ids change.


def replace_tokens(batch: dict, params: dict, seed: int) -> dict:
  """Each token replaced with p = ``rate`` by a different token, uniform
  over the non-special vocabulary.

  Returns:
    A new batch with new ``input_ids``; ``token_replacement_labels`` int32
    [B, L], 1 where replaced; ``token_replacement_weights`` float32 [B, L],
    1 at every token.
  """
  input_ids = np.asarray(batch['input_ids'])
  counters = Counters.of_batch(batch, seed)
  positions = positions_of(batch)
  replaced = (np.asarray(batch['sentence_ids']) >= 0) & (
      counters.uniform(Stream.TOKEN_REPLACEMENT, positions) < params['rate'])
  other = random_other_tokens(
      input_ids, counters.uniform(Stream.TOKEN_REPLACEMENT, -1 - positions),
      params['vocab_size'])
  out = dict(batch)
  out['input_ids'] = np.where(replaced, other, input_ids).astype(
      input_ids.dtype)
  out['token_replacement_labels'] = replaced.astype(np.int32)
  out['token_replacement_weights'] = token_weights(batch)
  return out


def shuffle_tokens(batch: dict, params: dict, seed: int) -> dict:
  """The tokens at positions chosen with p = ``rate`` are permuted among
  themselves (uniformly: sorted by a uniform key each).

  Returns:
    A new batch with new ``input_ids``; ``token_shuffle_labels`` int32
    [B, L], 1 where the token differs from the one there before;
    ``token_shuffle_weights`` float32 [B, L], 1 at every token.
  """
  input_ids = np.asarray(batch['input_ids'])
  counters = Counters.of_batch(batch, seed)
  positions = positions_of(batch)
  chosen = (np.asarray(batch['sentence_ids']) >= 0) & (
      counters.uniform(Stream.TOKEN_SHUFFLE, positions) < params['rate'])
  keys = np.where(chosen,
                  counters.uniform(Stream.TOKEN_SHUFFLE, -1 - positions), 2.0)
  ascending = np.argsort(~chosen, axis=1, kind='stable')   # Chosen first.
  by_key = np.argsort(keys, axis=1, kind='stable')
  # The k-th chosen position takes the token of the k-th chosen key.
  is_chosen_slot = positions < chosen.sum(axis=1, keepdims=True)
  shuffled = input_ids.copy()
  rows = np.arange(len(input_ids))[:, None]
  shuffled[rows, ascending] = np.where(is_chosen_slot, input_ids[rows, by_key],
                                       input_ids[rows, ascending])
  out = dict(batch)
  out['input_ids'] = shuffled
  out['token_shuffle_labels'] = (shuffled != input_ids).astype(np.int32)
  out['token_shuffle_weights'] = token_weights(batch)
  return out


# ---------------------------------------------------------------------------
# sentence_permutation.


def segment_ends(batch: dict) -> np.ndarray:
  """bool [B, L]: the [SEP]s that end a segment (the next position is
  padding, the row's end or another ``token_type_ids`` value)."""
  input_ids = np.asarray(batch['input_ids'])
  real = np.asarray(batch['attention_mask']) > 0
  token_type = np.asarray(batch['token_type_ids'])
  next_real = np.pad(real[:, 1:], ((0, 0), (0, 1)))
  next_type = np.pad(token_type[:, 1:], ((0, 0), (0, 1)))
  return real & (input_ids == SEP_ID) & (~next_real |
                                         (next_type != token_type))


def permute_sentences(batch: dict, params: dict, seed: int) -> dict:
  """A row's sentences shuffled with p = ``rate`` per row, within each
  segment (see the module docstring).

  Returns:
    A new batch with the fields moved; ``sentence_permutation_labels``
    int32 [B, L], at the first token of each sentence its original index
    when that index < ``max_sentences`` (the head's classes), 0 elsewhere;
    ``sentence_permutation_weights`` float32 [B, L], 1 at those labels.
  """
  input_ids = np.asarray(batch['input_ids'])
  sentence_ids = np.asarray(batch['sentence_ids'])
  real = np.asarray(batch['attention_mask']) > 0
  fixed = ~real | (input_ids == CLS_ID) | segment_ends(batch)
  # An inner [SEP] belongs to the sentence before it.
  sentence_of = np.maximum.accumulate(sentence_ids, axis=1)
  counters = Counters.of_batch(batch, seed)
  sentence_keys = counters.uniform(Stream.SENTENCE_PERMUTATION,
                                   positions_of(batch))
  permuted = counters.per_row(Stream.SENTENCE_PERMUTATION) < params['rate']
  rank = np.where(permuted[:, None], np.take_along_axis(
      sentence_keys, np.maximum(sentence_of, 0), axis=1), 0.0)
  source = order_between_fixed(fixed, rank)
  original = np.take_along_axis(sentence_ids, source, axis=1)
  labelled = sentence_starts(original) & (original < params['max_sentences'])
  out = dict(batch)
  out.update(gather_tokens(token_fields(batch), source))
  out['sentence_permutation_labels'] = np.where(labelled, original, 0).astype(
      np.int32)
  out['sentence_permutation_weights'] = labelled.astype(np.float32)
  return out


def _check_permutation(params: dict, data_cfg, errors: list[str]) -> None:
  del data_cfg
  check_rate('sentence_permutation', params, errors, 1.0)
  max_sentences = params.get('max_sentences')
  if isinstance(max_sentences, bool) or not isinstance(
      max_sentences, numbers.Integral) or max_sentences < 2:
    errors.append(
        f'tasks.sentence_permutation.max_sentences={max_sentences!r} must '
        'be an int >= 2 (its head\'s classes: sentences with a larger '
        'index get no label); use e.g. 16.')


# ---------------------------------------------------------------------------
# document_rotation.


def _chosen_start(candidates: np.ndarray, u: np.ndarray) -> np.ndarray:
  """int [B]: a position uniform among a row's ``candidates`` (bool
  [B, L]) from a uniform draw ``u`` [B]; 0 for a row with none."""
  count = candidates.sum(axis=1)
  k = np.minimum((u * count).astype(np.int64), np.maximum(count - 1, 0))
  return np.argmax(candidates & (np.cumsum(candidates, axis=1) == k[:, None] +
                                 1), axis=1)


def rotate_documents(batch: dict, params: dict, seed: int) -> dict:
  """With p = ``rate`` per row, the content between [CLS] and the final
  [SEP] rotated to start at a word start chosen uniformly among those after
  its first token.

  Returns:
    A new batch with the fields moved; ``document_rotation_label`` int32
    [B], the position of the original first content token (1 for a row
    not rotated).
  """
  span = content_span(batch)
  positions = positions_of(batch)
  candidates = span & np.asarray(batch['word_starts'], bool) & (
      np.asarray(batch['sentence_ids']) >= 0) & (positions > 1)
  counters = Counters.of_batch(batch, seed)
  draws = counters.uniform(Stream.DOCUMENT_ROTATION, np.array([[0, 1]]))
  rotated = (draws[:, 0] < params['rate']) & candidates.any(axis=1)
  start = _chosen_start(candidates, draws[:, 1])
  # The content before the new start goes after the rest.
  rank = (rotated[:, None] & (positions < start[:, None])).astype(np.int64)
  source = order_between_fixed(~span, rank)
  final_sep = np.asarray(batch['attention_mask']).sum(axis=1) - 1
  out = dict(batch)
  out.update(gather_tokens(token_fields(batch), source))
  out['document_rotation_label'] = np.where(
      rotated, final_sep - start + 1, 1).astype(np.int32)
  return out


# ---------------------------------------------------------------------------
# The declarations.

# The four token-level detections: (name, corruption, whether it leaves
# tokens without their facts and labels what became of the token shown,
# what the head says).
_RATE_TASKS = (
    ('token_deletion', delete_tokens, False,
     'BART token deletion: which tokens follow a deleted one.'),
    ('token_insertion', insert_tokens, True,
     'Random tokens inserted: which tokens were inserted.'),
    ('token_replacement', replace_tokens, True,
     'Uniform random replacement: which tokens were replaced.'),
    ('token_shuffle', shuffle_tokens, True,
     'Chosen tokens permuted: which tokens are out of place.'),
)
for _name, _apply, _new_tokens, _description in _RATE_TASKS:
  register(token_task(_name, _apply, corrupts=True, new_tokens=_new_tokens,
                      shown_token_labels=_new_tokens,
                      defaults=lambda: {'rate': 0.15},
                      check=_rate_task_check(_name, 0.15),
                      description=_description))

SENTENCE_PERMUTATION = register(token_task(
    'sentence_permutation', permute_sentences,
    num_classes=lambda params, max_seq_length: params['max_sentences'],
    corrupts=True,
    across_documents=True,
    defaults=lambda: {'rate': 1.0, 'max_sentences': 16},
    check=_check_permutation,
    description='BART sentence permutation: each sentence\'s original index.'))

DOCUMENT_ROTATION = register(HostTask(
    name='document_rotation',
    head='pointer',
    num_classes=lambda params, max_seq_length: max_seq_length,
    label_field='document_rotation_label',
    weight_field='',
    fields=lambda params, max_seq_length: {
        'document_rotation_label': ((), np.int32)},
    apply=rotate_documents,
    corrupts=True,
    across_documents=True,
    defaults=lambda: {'rate': 1.0},
    check=_rate_task_check('document_rotation', 1.0),
    layout='full_sentences',
    description='BART document rotation: where the document starts.'))
