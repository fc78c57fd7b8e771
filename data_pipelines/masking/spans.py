"""Growing spans: taking attempts (start word, length) in order where they fit.

ngram and span masking draw attempts per row and take each where it fits: an
attempt whose window overlaps a taken word is skipped; one longer than the
remaining budget is shrunk to the longest prefix of whole words that fits.

The result is that of trying each row's attempts one at a time, in order.
To need fewer numpy steps, a step judges the next K attempts of every row
that still has budget at once (rows advance at their own pace): each against
the words taken before the step and a guess of what the earlier attempts of
the block take. The step decides the longest prefix of the block over which
the guess is exact.

In a row's bulk, the guess is that an attempt of the block takes its whole
window if that is free (no word taken before the step) and overlaps no
earlier free window of the block, and nothing otherwise. The step decides
attempts up to

- (excluded) the first that overlaps an earlier window of the block which
  itself overlaps an earlier one: one that overlaps only windows that
  overlap nothing earlier is rejected, as those are taken;
- (included) the first that does not fit the budget left whole, if it
  takes something or the guess counted it as taken;
- (included) with ``length_per_span``, the first that is rejected: the
  next attempt wants the rejected length, not the one the guess gave it.

Once the budget has cut a span short (the row's tail), most attempts fail,
so the guess is that none takes anything: the step decides attempts up to
the first that takes something (included).

Arrays of a step are [K, A] (attempt k of the block, active row a) or
[M, K, A] (word m of the attempt's window, M the longest wanted length).
Words are addressed in flat tables of S = W + M + 1 columns per row, so that
a window from any start word <= W stays in its row.
"""

from __future__ import annotations

import functools
import typing

import numpy as np

from data_pipelines.masking.units import Words

# Attempts per row that one step judges together: at most this many (fewer
# for spans, where a rejected attempt ends the step), and fewer when many
# rows take the pairwise overlap test, so that a step judges about
# _PAIR_BUDGET attempts in all.
_MAX_ATTEMPTS_PER_STEP = 16
_MAX_SPAN_ATTEMPTS_PER_STEP = 8
_MIN_ATTEMPTS_PER_STEP = 8
_PAIR_BUDGET = 512


def grow_spans(words: Words, attempts, num_attempts: int, max_len: int,
               remaining, state=None, length_per_span: bool = False):
  """Takes spans (start word, length in words) in order where they fit.

  Args:
    words: the batch's words.
    attempts: ``attempts(begin, end)`` returns (starts, lengths), int
      [B, end - begin] each (or broadcastable), for attempts begin..end - 1:
      the start word and the wanted length in words (>= 1), per attempt or,
      with ``length_per_span``, per accepted span: a rejected attempt then
      keeps its length for the next start, so overlaps do not bias the
      lengths towards short spans. Drawn as the rows reach them.
    num_attempts: how many attempts each row has.
    max_len: the largest wanted length.
    remaining: int [B], budget left in tokens (an updated copy is returned).
    state: (taken, begins) of an earlier call to continue from.

  Returns:
    taken bool [B, S] (words taken; S >= W + max_len + 1), begins bool
    [B, S] (words that start a span) and remaining int [B].
  """
  batch_size, width = words.length.shape
  max_block = (_MAX_SPAN_ATTEMPTS_PER_STEP if length_per_span
               else _MAX_ATTEMPTS_PER_STEP)
  if state is None:
    state = (np.zeros((batch_size, width + max_len + 1), bool),
             np.zeros((batch_size, width + max_len + 1), bool))
  taken, begins = state[0].copy(), state[1].copy()
  flat_taken, flat_begins = taken.reshape(-1), begins.reshape(-1)
  tables = _word_tables(words, taken.shape[1], max_len)
  draw = functools.partial(_draw, attempts=attempts, tables=tables,
                           max_block=max_block,
                           length_per_span=length_per_span)
  # Rows seldom need more than one attempt per two predictions.
  table = draw(_Attempts.none(batch_size),
               min(num_attempts, int(remaining.max()) // 2 + 8))
  remaining = remaining.copy()
  active = _Active.of(remaining)
  while active.rows.size:
    num_bulk = active.num_bulk
    block_size = _block_size(num_bulk, max_block)
    if active.pointer.max() >= table.drawn:
      table = draw(table, min(num_attempts, max(
          2 * table.drawn, active.pointer.max() + max_block)))
    block = _gather(table, tables, active, block_size, length_per_span,
                    flat_taken)
    taken_whole, left, contested, unsure = _guess(block, active, num_bulk)
    short, best, inside, take = _fit(block, left, taken_whole, tables)
    # A short attempt is judged against the words taken before the step.
    decided = _decide(block, active, short, take, taken_whole,
                      unsure | (short & contested), length_per_span)
    if table.drawn < num_attempts:   # Attempts not drawn yet wait.
      decided = np.minimum(decided, table.drawn - active.pointer)
    decided_mask = block.k < decided
    take &= decided_mask
    flat_taken[block.cells[inside & take]] = True
    flat_begins[block.start[take]] = True
    active = _advance(active, block, take, best, decided,
                      (short & decided_mask).any(axis=0), tables)
    keep = _still_growing(active, take.any(axis=0), words, taken,
                          num_attempts)
    if not keep.all():
      remaining[active.rows] = active.budget
      active = active.select(keep)
  return taken, begins, remaining


def unit_first(words: Words, taken, begins) -> np.ndarray:
  """int [B, W]: for each taken word, the first token of its span; else -1.

  A taken word's span begins at the latest begin at or before it, which is
  in its row: spans are numbered over the flattened [B, S] arrays.
  """
  width = words.length.shape[1]
  begin_at = np.flatnonzero(begins)
  span_first = np.concatenate([[-1], words.first.ravel()[
      begin_at // taken.shape[1] * width + begin_at % taken.shape[1]]])
  span = np.cumsum(begins.ravel(), dtype=np.int32) * taken.ravel()
  return span_first[span].reshape(taken.shape)[:, :width]


class _WordTables(typing.NamedTuple):
  """The batch's words as flat tables of S columns per row.

  Attributes:
    width: W, the words of the widest row.
    row_start: int [B, 1], the flat index of each row's first word.
    cum: int [B * S], tokens before each word; past a row's last word, all
      of its tokens.
    cum_sorted: int [B * S], ``cum`` plus an offset per row that makes the
      whole table ascending, for ``np.searchsorted``.
    room: int [B * S], ``Words.room`` (0 past W).
    window: int [M, 1, 1], the offsets of a window's words from its start.
  """
  width: int
  row_start: np.ndarray
  cum: np.ndarray
  cum_sorted: np.ndarray
  room: np.ndarray
  window: np.ndarray


def _word_tables(words: Words, stride: int, max_len: int) -> _WordTables:
  """``words`` in tables of ``stride`` (S) columns per row, for windows of
  up to ``max_len`` (M) words."""
  batch_size, width = words.length.shape
  row_start = np.arange(batch_size)[:, None] * stride
  cum = np.empty((batch_size, stride), np.int64)
  cum[:, :width + 1] = words.cum
  cum[:, width + 1:] = words.cum[:, -1:]
  cum_sorted = (cum + row_start // stride * (
      int(words.cum[:, -1].max()) + 1)).ravel()
  room = np.zeros((batch_size, stride), np.int64)
  room[:, :width] = words.room
  return _WordTables(width, row_start, cum.ravel(), cum_sorted, room.ravel(),
                     np.arange(max_len)[:, None, None])


class _Attempts(typing.NamedTuple):
  """The attempts drawn so far: tables [B, drawn + max_block].

  Attributes:
    starts: the flat start word of each attempt, then padding (start word
      W, which has no room).
    lengths: the wanted length of each attempt, then padding (0; with
      ``length_per_span``, the last length, which stands for the lengths
      past the last attempt).
    drawn: attempts drawn per row.
  """
  starts: np.ndarray
  lengths: np.ndarray
  drawn: int

  @classmethod
  def none(cls, batch_size: int) -> '_Attempts':
    """No attempt drawn yet."""
    empty = np.zeros((batch_size, 0), np.int64)
    return cls(empty, empty, 0)


def _draw(table: _Attempts, end: int, attempts, tables: _WordTables,
          max_block: int, length_per_span: bool) -> _Attempts:
  """``table`` with attempts ``table.drawn``..``end - 1`` of every row."""
  begin = table.drawn
  batch_size = len(tables.row_start)
  shape = (batch_size, end - begin)
  starts, lengths = attempts(begin, end)
  starts = np.broadcast_to(starts + tables.row_start, shape)
  lengths = np.broadcast_to(lengths, shape)
  if length_per_span:
    padding = lengths[:, -1:]
  else:
    lengths = np.minimum(lengths, tables.room[starts])   # Never past the run.
    padding = 0
  pad = (batch_size, max_block)
  return _Attempts(
      np.concatenate([table.starts[:, :begin], starts,
                      np.broadcast_to(tables.row_start + tables.width, pad)],
                     axis=1),
      np.concatenate([table.lengths[:, :begin], lengths,
                      np.broadcast_to(padding, pad)], axis=1),
      end)


class _Active(typing.NamedTuple):
  """The rows still growing spans, each attribute [A].

  Attributes:
    rows: int, the row in the batch.
    budget: int, tokens left.
    pointer: int, the row's next attempt.
    accepted: int, spans taken (with ``length_per_span``, the index of the
      next wanted length).
    tail: bool, the budget has cut a span short.
  """
  rows: np.ndarray
  budget: np.ndarray
  pointer: np.ndarray
  accepted: np.ndarray
  tail: np.ndarray

  @classmethod
  def of(cls, remaining: np.ndarray) -> '_Active':
    """The rows with budget left (``remaining``, int [B] tokens)."""
    rows = np.flatnonzero(remaining > 0)
    return cls(rows, remaining[rows], np.zeros(rows.size, np.int64),
               np.zeros(rows.size, np.int64), np.zeros(rows.size, bool))

  @property
  def num_bulk(self) -> int:
    """Rows not in the tail, which take the pairwise overlap test."""
    return self.rows.size - np.count_nonzero(self.tail)

  def select(self, keep: np.ndarray) -> '_Active':
    """The rows where ``keep`` (bool [A]) is set."""
    return _Active(self.rows[keep], self.budget[keep], self.pointer[keep],
                   self.accepted[keep], self.tail[keep])


def _block_size(num_bulk: int, max_block: int) -> int:
  """K: fewer attempts per row when many rows take the overlap test."""
  if not num_bulk:
    return max_block
  return min(max_block, max(_MIN_ATTEMPTS_PER_STEP, _PAIR_BUDGET // num_bulk))


class _Block(typing.NamedTuple):
  """The next K attempts of each active row.

  Attributes:
    k: int [K, 1], the attempt's place in the block.
    start: int [K, A], its flat start word.
    want: int [K, A], its wanted length in words (never past the run).
    end: int [K, A], the flat word after its window.
    tokens: int [K, A], the tokens of its whole window.
    cells: int [M, K, A], the flat words of its window.
    hit: bool [M, K, A], words of the window taken before the step.
    free: bool [K, A], it wants words and none of them is taken.
  """
  k: np.ndarray
  start: np.ndarray
  want: np.ndarray
  end: np.ndarray
  tokens: np.ndarray
  cells: np.ndarray
  hit: np.ndarray
  free: np.ndarray


def _gather(table: _Attempts, tables: _WordTables, active: _Active,
            block_size: int, length_per_span: bool,
            flat_taken: np.ndarray) -> _Block:
  """The next ``block_size`` (K) attempts of each active row, and what
  they meet in the words taken so far (``flat_taken``, bool [B * S])."""
  k = np.arange(block_size)[:, None]
  table_row = active.rows * table.starts.shape[1]
  attempt = table_row + active.pointer + k
  start = table.starts.ravel()[attempt]
  if length_per_span:   # In the tail, nothing is accepted before k.
    want = np.minimum(
        table.lengths.ravel()[table_row + active.accepted + k * ~active.tail],
        tables.room[start])                            # Never past the run.
  else:
    want = table.lengths.ravel()[attempt]
  window = tables.window
  cells = start + window
  hit = flat_taken[cells]
  free = (want > 0) & ~(hit & (window < want)).any(axis=0)
  end = start + want
  tokens = tables.cum[end] - tables.cum[start]
  return _Block(k, start, want, end, tokens, cells, hit, free)


def _guess(block: _Block, active: _Active, num_bulk: int):
  """What each attempt takes if it fits the budget, and the budget before.

  ``num_bulk`` is ``active.num_bulk``.

  Returns:
    taken_whole bool [K, A] (the guess takes its whole window), left int
    [K, A] or [A] (tokens left before it), contested bool [K, A] (its
    window meets an earlier free one of the block) and unsure bool [K, A]
    (it meets an earlier contested one: the guess may be wrong).
  """
  if not num_bulk:
    none = np.zeros_like(block.free)   # All in the tail: nothing is taken.
    return block.free, active.budget, none, none
  start, end, k = block.start, block.end, block.k
  # meets[k, k', a]: the windows of k and of an earlier free k' overlap.
  meets = ((start[:, None] < end[None]) & (start[None] < end[:, None])
           & (k.T < k)[:, :, None] & (block.free & ~active.tail)[None])
  contested = meets.any(axis=1)
  unsure = (meets & contested[None]).any(axis=1)
  taken_whole = block.free & ~contested
  counted = np.where(taken_whole & ~active.tail, block.tokens, 0)
  left = active.budget + counted - np.cumsum(counted, axis=0)
  return taken_whole, left, contested, unsure


def _fit(block: _Block, left, taken_whole, tables: _WordTables):
  """What each attempt takes given the budget left before it.

  An attempt that does not fit whole takes the longest prefix of whole
  words that fits, if that is free.

  Returns:
    short bool [K, A] (it does not fit whole), best int [K, A] (the words
    it would take), inside bool [M, K, A] (the window's words among them)
    and take bool [K, A].
  """
  short = block.tokens > left
  best = block.want.copy()
  short_at = np.flatnonzero(short)
  if short_at.size:
    short_start = block.start.ravel()[short_at]
    fit = np.searchsorted(
        tables.cum_sorted, tables.cum_sorted[short_start]
        + np.broadcast_to(left, short.shape).ravel()[short_at],
        side='right') - short_start - 1
    best.ravel()[short_at] = np.maximum(
        np.minimum(block.want.ravel()[short_at], fit), 0)
  inside = tables.window < best
  take = np.where(short, (best > 0) & ~(block.hit & inside).any(axis=0),
                  taken_whole)
  return short, best, inside, take


def _decide(block: _Block, active: _Active, short, take, taken_whole,
            unsure, length_per_span: bool) -> np.ndarray:
  """int [A]: the attempts decided, up to the first ``unsure`` one
  (excluded) or the first after which the guess no longer holds (included).
  """
  last = short & (take | taken_whole)
  if length_per_span:
    last |= ~take
  last = np.where(active.tail, take, last)
  return np.where(unsure, block.k, np.where(last, block.k + 1,
                                           len(block.k))).min(axis=0)


def _advance(active: _Active, block: _Block, take, best, decided, cut,
             tables: _WordTables) -> _Active:
  """The active rows after taking ``take`` (bool [K, A]) and deciding
  ``decided`` (int [A]) attempts; ``cut`` (bool [A]) marks rows where the
  budget cut a decided attempt short."""
  took = np.where(take, tables.cum[block.start + best]
                  - tables.cum[block.start], 0)
  return _Active(
      active.rows, active.budget - took.sum(axis=0),
      active.pointer + decided, active.accepted + take.sum(axis=0),
      active.tail | cut)


def _still_growing(active: _Active, took_any, words: Words, taken,
                   num_attempts: int) -> np.ndarray:
  """bool [A]: rows with budget and attempts left; one that took nothing in
  the step goes on only while a free word fits."""
  keep = (active.budget > 0) & (active.pointer < num_attempts)
  stalled = np.flatnonzero(keep & ~took_any)
  if stalled.size:
    rows, width = active.rows[stalled], words.length.shape[1]
    length = words.length[rows]
    keep[stalled] = (~taken[rows, :width] & (length > 0) & (
        length <= active.budget[stalled, None])).any(axis=1)
  return keep
