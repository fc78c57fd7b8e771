"""Encoding examples into fixed-shape rows in BERT's layout, and reading span
answers back out of a model's logits.

Rows are [CLS] A [SEP] (B [SEP]) [PAD]... with our SentencePiece ids; the
arrays per kind are listed in ``encode``'s docstring.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from data_pipelines import corpus as corpus_lib
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.downstream import base


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
  """Lengths after BERT's ``_truncate_seq_pair`` (longest-first) to ``budget``.

  The original pops one token at a time from the longer segment (from B on a
  tie); this is its closed form, so long documents cost no loop.
  """
  if len_a + len_b <= budget:
    return len_a, len_b
  short = min(len_a, len_b)
  if 2 * short <= budget:  # Only the longer one is cut.
    return (len_a, budget - len_a) if len_a == short else (budget - len_b,
                                                            len_b)
  # Both are cut to equal length; B loses the odd token (ties pop from B).
  return budget - budget // 2, budget // 2


def _check_lengths(max_seq_length: int) -> None:
  if max_seq_length < 4:
    raise base.TaskError(
        f'max_seq_length={max_seq_length} leaves no room for text beside '
        '[CLS] and two [SEP]s; use at least 4 (BERT uses 128 or 512).')


def _require(example: dict, field: str, index: int):
  if not isinstance(example, dict) or field not in example:
    raise base.TaskError(
        f'example {index} has no field {field!r}; see the example formats in '
        'data_pipelines/downstream/__init__.py.')
  return example[field]


def _empty_rows(n: int, length: int) -> dict[str, np.ndarray]:
  return {'input_ids': np.zeros((n, length), np.int32),
          'token_type_ids': np.zeros((n, length), np.int32),
          'attention_mask': np.zeros((n, length), np.int32)}


def _write_row(out: dict, row: int, a: np.ndarray, b: np.ndarray | None
               ) -> None:
  """Writes [CLS] a [SEP] (b [SEP]) into row ``row`` of the arrays.

  Type ids: 0 for [CLS], A and the first [SEP]; 1 for B and its [SEP].
  """
  ids, types = out['input_ids'][row], out['token_type_ids'][row]
  ids[0] = tokenizer_lib.CLS_ID
  ids[1:1 + len(a)] = a
  end = 1 + len(a)
  ids[end] = tokenizer_lib.SEP_ID
  end += 1
  if b is not None:
    ids[end:end + len(b)] = b
    ids[end + len(b)] = tokenizer_lib.SEP_ID
    types[end:end + len(b) + 1] = 1
    end += len(b) + 1
  out['attention_mask'][row, :end] = 1


# ---------------------------------------------------------------------------
# Classification and regression.


def _encode_sentences(kind: str, examples: list[dict], tokenizer,
                      length: int) -> dict[str, np.ndarray]:
  texts = [corpus_lib.clean_text(base.check_string(
      _require(ex, 'text', i), f'example {i}', 'text'))
           for i, ex in enumerate(examples)]
  pairs = [ex.get('text_pair') for ex in examples]
  with_pair = [i for i, p in enumerate(pairs) if p is not None]
  a_ids = tokenizer.encode(texts) if texts else []
  b_ids = {}
  if with_pair:
    b_ids = dict(zip(with_pair, tokenizer.encode(
        [corpus_lib.clean_text(str(pairs[i])) for i in with_pair])))
  out = _empty_rows(len(examples), length)
  for i, a in enumerate(a_ids):
    b = b_ids.get(i)
    if b is None:
      a = a[:length - 2]
    else:
      keep_a, keep_b = truncate_pair(len(a), len(b), length - 3)
      a, b = a[:keep_a], b[:keep_b]
    _write_row(out, i, a, b)
  labels = [_require(ex, 'label', i) for i, ex in enumerate(examples)]
  out['label'] = np.array(labels, np.float32 if kind == 'regression'
                          else np.int32).reshape(len(examples))
  return out


# ---------------------------------------------------------------------------
# Where tokens are in the text.


def token_char_spans(text: str, ends: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
  """[start, end) of each token's characters in ``text``.

  ``ends`` are ``Tokenizer.encode_with_offsets``'s (the offset each token ends
  before). A token starts where the last token that ends earlier ends, past
  the whitespace its "▁" stands for; tokens that share an end (a bare "▁"
  and the unknown character after it) share a span.

  Returns:
    starts, ends: int64 [num_tokens] each.
  """
  ends = np.asarray(ends, np.int64)   # Non-decreasing, none at 0.
  before = np.searchsorted(ends, ends, 'left') - 1
  starts = np.where(before >= 0, ends[np.maximum(before, 0)], 0)
  # Skip whitespace: the next word start at or after each start.
  words = [m.span() for m in re.finditer(r'\S+', text)]
  if words and len(starts):
    word_starts = np.array([a for a, _ in words], np.int64)
    word_ends = np.array([b for _, b in words], np.int64)
    w = np.searchsorted(word_ends, starts, 'right')
    inside = w < len(words)
    starts = np.where(inside, np.maximum(starts, word_starts[
        np.minimum(w, len(words) - 1)]), starts)
  starts = np.minimum(starts, np.maximum(ends - 1, 0))
  return starts, ends


# ---------------------------------------------------------------------------
# Token tasks.


def _joined_words(examples: list[dict]
                  ) -> tuple[list[str], list[tuple[np.ndarray, np.ndarray]]]:
  """Each example's words joined by spaces, and the words' [start, end)
  characters in that text (int64 [num_words] each)."""
  joined, bounds = [], []
  for i, ex in enumerate(examples):
    words = [str(w) for w in _require(ex, 'words', i)]
    tags = _require(ex, 'labels', i)
    if len(words) != len(tags):
      raise base.TaskError(f'example {i}: {len(words)} words but {len(tags)} '
                           'labels; give one label per word.')
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]).astype(np.int64)
    joined.append(' '.join(words))
    bounds.append((starts, starts + np.array([len(w) for w in words],
                                             np.int64)))
  return joined, bounds


def _label_first_subtokens(out: dict, i: int, ends: np.ndarray,
                           word_starts: np.ndarray, word_ends: np.ndarray,
                           tags: np.ndarray) -> None:
  """Writes each word's tag on its first token into row ``i`` of
  ``out['labels']`` (and the word's index into ``out['label_words']``),
  and the words labelled into ``out['words_kept']``.

  Args:
    ends: int64 [num_tokens], the row's (truncated) tokens' placed ends.
    word_starts, word_ends: int64 [num_words], the words' characters.
    tags: int32 [num_words].
  """
  last_char = ends - 1
  word = np.searchsorted(word_starts, last_char, 'right') - 1
  valid = (word >= 0) & (last_char < word_ends[np.maximum(word, 0)])
  seen = set()
  for position, (w, ok) in enumerate(zip(word.tolist(), valid.tolist())):
    if ok and w not in seen:  # The word's first sub-token.
      seen.add(w)
      out['labels'][i, 1 + position] = tags[w]
      out['label_words'][i, 1 + position] = w
  out['words_kept'][i] = len(seen)


def _encode_tokens(examples: list[dict], tokenizer,
                   length: int) -> dict[str, np.ndarray]:
  """Token tasks: each word's label on its first sub-token.

  The words are joined with spaces and tokenized as one sentence (as
  pretraining tokenized its sentences); each token belongs to the word that
  holds its last character (``encode_with_offsets``). SentencePiece never
  lets a piece cross whitespace, so this equals word-by-word encoding for
  ordinary words, and words holding spaces still work.
  """
  joined, bounds = _joined_words(examples)
  encoded = tokenizer.encode_with_offsets(joined) if joined else []
  out = _empty_rows(len(examples), length)
  out['labels'] = np.full((len(examples), length), base.IGNORE, np.int32)
  out['label_words'] = np.full((len(examples), length), -1, np.int32)
  out['words_kept'] = np.zeros(len(examples), np.int32)
  for i, ((ids, ends), (starts, word_ends)) in enumerate(zip(encoded,
                                                             bounds)):
    ids, ends = ids[:length - 2], ends[:length - 2]
    _write_row(out, i, ids, None)
    if not len(ids) or not len(starts):
      continue
    _label_first_subtokens(out, i, ends, starts, word_ends,
                           np.asarray(examples[i]['labels'], np.int32))
  return out


def word_tags(predictions: np.ndarray, features: dict, examples: list[dict],
              label_names=()) -> tuple[np.ndarray, np.ndarray]:
  """Token tasks: (predicted, gold) tag ids [N, W] for every word of each
  example (W its most words; gold -1 past a sentence's end), so that the
  metrics score every word, as conlleval does.

  A word's prediction is its first sub-token's; a word the row lost (cut
  off by ``max_seq_length``, or one with no token at all) is predicted
  'O', or, where the tags have no 'O', a tag that is always wrong.
  Scoring the rows' labels alone would leave the lost words' gold out.
  """
  width = max((len(e['labels']) for e in examples), default=0)
  gold = np.full((len(examples), width), base.IGNORE, np.int32)
  names = list(label_names)
  predicted = np.full_like(gold, names.index('O') if 'O' in names else -2)
  for i, example in enumerate(examples):
    gold[i, :len(example['labels'])] = example['labels']
    positions = np.flatnonzero(features['label_words'][i] >= 0)
    predicted[i, features['label_words'][i, positions]] = predictions[
        i, positions]
  return predicted, gold


# ---------------------------------------------------------------------------
# Span tasks (SQuAD v1.1).


class _Context(NamedTuple):
  """One example's context tokens (arrays [num_tokens])."""
  ids: np.ndarray
  char_starts: np.ndarray
  char_ends: np.ndarray
  answer: tuple[int, int]   # First and last answer token; (-1, -1) if none.
  best_window: np.ndarray   # The window that is each token's max context.


class _Window(NamedTuple):
  """One row: a window of an example's context after its question."""
  example: int
  query: np.ndarray         # The question's (truncated) ids.
  index: int                # Of the window among the example's windows.
  offset: int               # First context token of the window.
  size: int                 # Context tokens in the window.


def _answer_tokens(example: dict, starts: np.ndarray, ends: np.ndarray
                   ) -> tuple[int, int]:
  """First and last context token of the first answer; (-1, -1) if none.

  If the answer is not at its offset, its first occurrence in the context is
  used (TFDS data is not validated like task files).
  """
  answers = example.get('answers') or []
  if not answers or not len(starts):
    return -1, -1
  text, start = answers[0]['text'], int(answers[0]['start'])
  context = example['context']
  if context[start:start + len(text)] != text:
    start = context.find(text)
    if start < 0 or not text:
      return -1, -1
  first = int(np.searchsorted(ends, start, 'right'))
  last = int(np.searchsorted(starts, start + len(text), 'left')) - 1
  if first > last or first >= len(ends) or last < 0:
    return -1, -1
  return first, last


def _doc_windows(num_tokens: int, max_doc: int, doc_stride: int
                 ) -> list[tuple[int, int]]:
  """run_squad's doc spans: (offset, size) of windows of at most ``max_doc``
  tokens, ``doc_stride`` apart, the last reaching the end; at least one
  (maybe empty)."""
  windows, offset = [], 0
  while True:
    size = min(num_tokens - offset, max_doc)
    windows.append((offset, size))
    if offset + size >= num_tokens:
      return windows
    offset += min(size, doc_stride)


def _best_windows(windows: list[tuple[int, int]], num_tokens: int
                  ) -> np.ndarray:
  """run_squad's _check_is_max_context for every token at once: the index of
  the window in which the token has the most context on its shorter side
  (+0.01 per window token); the first wins ties. int64 [num_tokens]."""
  position = np.arange(num_tokens)
  scores = np.full((len(windows), num_tokens), -np.inf)
  for w, (offset, size) in enumerate(windows):
    inside = (position >= offset) & (position < offset + size)
    score = np.minimum(position - offset, offset + size - 1 - position)
    scores[w, inside] = score[inside] + 0.01 * size
  return scores.argmax(0) if num_tokens else np.zeros(0, np.int64)


def _write_span_rows(windows: list[_Window], contexts: list[_Context],
                     length: int) -> dict[str, np.ndarray]:
  """The arrays of ``encode('span', ...)``, one row per window."""
  out = _empty_rows(len(windows), length)
  out['example_index'] = np.zeros(len(windows), np.int32)
  out['start_positions'] = np.zeros(len(windows), np.int32)
  out['end_positions'] = np.zeros(len(windows), np.int32)
  out['token_start_char'] = np.full((len(windows), length), -1, np.int32)
  out['token_end_char'] = np.full((len(windows), length), -1, np.int32)
  out['max_context'] = np.zeros((len(windows), length), bool)
  for row, (i, query, w, offset, size) in enumerate(windows):
    context = contexts[i]
    first, last = context.answer
    window = slice(offset, offset + size)
    _write_row(out, row, query, context.ids[window])
    doc = len(query) + 2  # Where the context starts in the row.
    out['example_index'][row] = i
    out['token_start_char'][row, doc:doc + size] = context.char_starts[window]
    out['token_end_char'][row, doc:doc + size] = context.char_ends[window]
    out['max_context'][row, doc:doc + size] = context.best_window[window] == w
    if first >= 0 and offset <= first and last < offset + size:
      out['start_positions'][row] = doc + first - offset
      out['end_positions'][row] = doc + last - offset
  return out


def _encode_spans(examples: list[dict], tokenizer, length: int,
                  doc_stride: int, max_query_length: int
                  ) -> dict[str, np.ndarray]:
  """SQuAD v1.1 features as google-research/bert's run_squad builds them."""
  if doc_stride < 1 or max_query_length < 1:
    raise base.TaskError(f'doc_stride={doc_stride} and max_query_length='
                         f'{max_query_length} must be >= 1.')
  questions = [corpus_lib.clean_text(str(_require(ex, 'question', i)))
               for i, ex in enumerate(examples)]
  texts = [str(_require(ex, 'context', i)) for i, ex in enumerate(examples)]
  query_ids = tokenizer.encode(questions) if questions else []
  context_ids = tokenizer.encode_with_offsets(texts) if texts else []
  windows, contexts = [], []
  for i, (query, (ids, ends)) in enumerate(zip(query_ids, context_ids)):
    query = query[:max_query_length]
    max_doc = length - len(query) - 3
    if max_doc < 1:
      raise base.TaskError(
          f'max_seq_length={length} leaves no room for the context after a '
          f'question of {len(query)} tokens; raise max_seq_length or lower '
          f'max_query_length={max_query_length}.')
    starts, ends = token_char_spans(texts[i], ends)
    doc_windows = _doc_windows(len(ids), max_doc, doc_stride)
    contexts.append(_Context(ids, starts, ends,
                             _answer_tokens(examples[i], starts, ends),
                             _best_windows(doc_windows, len(ids))))
    windows.extend(_Window(i, query, w, offset, size)
                   for w, (offset, size) in enumerate(doc_windows))
  return _write_span_rows(windows, contexts, length)


def encode(task_kind: str, examples: list[dict], tokenizer,
           max_seq_length: int, doc_stride: int = 128,
           max_query_length: int = 64) -> dict[str, np.ndarray]:
  """Fixed-shape arrays for a list of examples (N rows of L tokens).

  Every kind gives ``input_ids``, ``token_type_ids`` and ``attention_mask``,
  int32 [N, L] with L = ``max_seq_length``: [CLS] A [SEP] (B [SEP]) then
  [PAD] (id 0, mask 0); type ids are 0 up to the first [SEP] and 1 after.
  Pairs are truncated longest-first (``truncate_pair``), single texts from
  the end. Texts are ``corpus.clean_text``-ed, as pretraining text was.

  Plus, per kind:
    classification: ``label`` int32 [N]. regression: ``label`` float32 [N].
    token: ``labels`` int32 [N, L], each word's label on its first sub-token
      and -1 elsewhere (later sub-tokens, specials, padding, words cut by
      truncation); ``words_kept`` int32 [N], the words that got a label.
    span (SQuAD v1.1, as run_squad): A is the question (its first
      ``max_query_length`` tokens), B a window of the context; a long context
      gives several rows, windows starting ``doc_stride`` tokens apart. N is
      the number of rows (features), not of examples:
        ``example_index`` int32 [N]: the example of each row.
        ``start_positions``, ``end_positions`` int32 [N]: the first answer's
          first and last token in the row, both 0 ([CLS]) unless the answer
          lies wholly inside the window.
        ``token_start_char``, ``token_end_char`` int32 [N, L]: the [start,
          end) characters of the context each context token covers; -1 at
          every other position.
        ``max_context`` bool [N, L]: this row is the token's best window
          (most context on its shorter side); False off the context.

  Raises:
    TaskError: an unknown kind, a missing field, or a length too small.
  """
  base.check_kind(task_kind)
  _check_lengths(max_seq_length)
  examples = list(examples)
  if task_kind in ('classification', 'regression'):
    return _encode_sentences(task_kind, examples, tokenizer, max_seq_length)
  if task_kind == 'token':
    return _encode_tokens(examples, tokenizer, max_seq_length)
  return _encode_spans(examples, tokenizer, max_seq_length, doc_stride,
                       max_query_length)


# ---------------------------------------------------------------------------
# Span decoding.


def _best_span_in_row(start_logits: np.ndarray, end_logits: np.ndarray,
                      is_context: np.ndarray, is_max_context: np.ndarray,
                      max_answer_length: int) -> tuple[float, int, int]:
  """(score, start, end) of the row's best allowed span; score -inf if none.

  Args:
    start_logits, end_logits: float32 [L].
    is_context, is_max_context: bool [L]; a span starts at a max-context
      token and ends at a context token.
    max_answer_length: in tokens.
  """
  span = max_answer_length
  starts = np.where(is_context & is_max_context, start_logits, -np.inf)
  ends = np.concatenate([np.where(is_context, end_logits, -np.inf),
                         np.full(span - 1, -np.inf, np.float32)])
  # [L, span]: the end logits of end = start + k for k < span.
  candidates = np.lib.stride_tricks.sliding_window_view(ends, span)
  k = candidates.argmax(1)
  totals = starts + candidates[np.arange(len(start_logits)), k]
  start = int(totals.argmax())
  return float(totals[start]), start, start + int(k[start])


def span_predictions(start_logits, end_logits, features: dict,
                     examples: list[dict], max_answer_length: int = 30
                     ) -> dict[str, str]:
  """The best answer text of each example from its rows' logits.

  Over all rows of an example, picks the (start, end) with the highest
  ``start_logit + end_logit`` such that both are context tokens, start <=
  end, the span has at most ``max_answer_length`` tokens and the row is the
  start token's best window (run_squad's rules, searched exhaustively rather
  than over the n-best). Ties go to the earlier row, start and end.

  Args:
    start_logits, end_logits: float [N, L], rows as ``encode`` made them.
    features: ``encode('span', examples, ...)``'s arrays.
    examples: the examples encoded (their 'id' and 'context').
    max_answer_length: in tokens.

  Returns:
    example id -> the context's characters of the best span ('' if none).
  """
  start_logits = np.asarray(start_logits, np.float32)
  end_logits = np.asarray(end_logits, np.float32)
  shape = features['token_start_char'].shape
  if start_logits.shape != shape or end_logits.shape != shape:
    raise base.TaskError(f'span logits of shapes {start_logits.shape} and '
                         f'{end_logits.shape}; the features are {shape}.')
  if max_answer_length < 1:
    raise base.TaskError(f'max_answer_length={max_answer_length} must be '
                         '>= 1.')
  best: dict[int, tuple[float, str]] = {}
  for row in range(shape[0]):
    i = int(features['example_index'][row])
    char_start = features['token_start_char'][row]
    char_end = features['token_end_char'][row]
    score, start, end = _best_span_in_row(
        start_logits[row], end_logits[row], char_start >= 0,
        features['max_context'][row], max_answer_length)
    if score == -np.inf or (i in best and best[i][0] >= score):
      continue
    context = _require(examples[i], 'context', i)
    best[i] = (score, context[char_start[start]:char_end[end]])
  return {str(_require(ex, 'id', i)): best.get(i, (0.0, ''))[1]
          for i, ex in enumerate(examples)}
