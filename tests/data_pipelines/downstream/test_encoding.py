"""Tests for data_pipelines.downstream.encoding: encoding and span decoding."""

import collections

import numpy as np
import pytest

from data_pipelines import annotations
from data_pipelines import corpus as corpus_lib
from data_pipelines import downstream
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.downstream import Task, TaskError

CLS, SEP, PAD = (tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID,
                 tokenizer_lib.PAD_ID)


@pytest.fixture(scope='module')
def tok(task):
  sentences = [s for ex in task.train for s in
               corpus_lib.split_sentences(ex['text'])]
  return tokenizer_lib.train(sentences, 400, 'unigram', num_threads=2)


@pytest.fixture(scope='module')
def long_context(task):
  # Prose the tokenizer knows (ASCII words), long enough for many windows.
  text = ' '.join(ex['text'] for ex in task.eval[:12])
  return ''.join(c for c in text if c.isascii())


def _segments(ids, types, mask):
  """Token ids of segments A and B of one encoded row (B None if single)."""
  n = int(mask.sum())
  assert ids[0] == CLS and ids[n - 1] == SEP
  assert (ids[n:] == PAD).all() and (types[n:] == 0).all()
  assert (mask[:n] == 1).all() and (mask[n:] == 0).all()
  first_sep = int(np.flatnonzero(ids[:n] == SEP)[0])
  assert (types[:first_sep + 1] == 0).all()
  a = ids[1:first_sep]
  if first_sep == n - 1:
    return a, None
  assert (types[first_sep + 1:n] == 1).all()
  return a, ids[first_sep + 1:n - 1]


def test_encode_classification_layout(tok):
  examples = [{'text': 'Return the  value.', 'text_pair': None, 'label': 2},
              {'text': 'Open a file.', 'text_pair': 'Close the socket.',
               'label': 0}]
  out = downstream.encode('classification', examples, tok, 32)
  assert set(out) == {'input_ids', 'token_type_ids', 'attention_mask',
                      'label'}
  for key in ('input_ids', 'token_type_ids', 'attention_mask'):
    assert out[key].shape == (2, 32) and out[key].dtype == np.int32
  assert out['label'].dtype == np.int32 and out['label'].tolist() == [2, 0]
  a, b = _segments(out['input_ids'][0], out['token_type_ids'][0],
                   out['attention_mask'][0])
  assert b is None and a.tolist() == tok.encode(['Return the value.'])[0]\
      .tolist()
  a, b = _segments(out['input_ids'][1], out['token_type_ids'][1],
                   out['attention_mask'][1])
  assert a.tolist() == tok.encode(['Open a file.'])[0].tolist()
  assert b.tolist() == tok.encode(['Close the socket.'])[0].tolist()


def _reference_truncate(a, b, budget):
  """google-research/bert's _truncate_seq_pair, one pop at a time."""
  a, b = list(a), list(b)
  while len(a) + len(b) > budget:
    (a if len(a) > len(b) else b).pop()
  return len(a), len(b)


def test_truncate_pair_matches_bert():
  for la in range(0, 14):
    for lb in range(0, 14):
      for budget in range(1, 20):
        assert downstream.truncate_pair(la, lb, budget) == \
            _reference_truncate(range(la), range(lb), budget), (la, lb, budget)


def test_encode_truncates_longest_first(tok, task):
  long_a, short_b = task.train[0]['text'] * 4, 'Open a file.'
  examples = [{'text': long_a, 'text_pair': short_b, 'label': 0},
              {'text': short_b, 'text_pair': long_a, 'label': 0},
              {'text': long_a, 'text_pair': long_a + ' x', 'label': 0},
              {'text': long_a, 'text_pair': None, 'label': 0}]
  length = 24
  out = downstream.encode('classification', examples, tok, length)
  for row, ex in enumerate(examples):
    a_full = tok.encode([corpus_lib.clean_text(ex['text'])])[0]
    a, b = _segments(out['input_ids'][row], out['token_type_ids'][row],
                     out['attention_mask'][row])
    if ex['text_pair'] is None:
      assert a.tolist() == a_full[:length - 2].tolist()
      continue
    b_full = tok.encode([ex['text_pair']])[0]
    keep_a, keep_b = _reference_truncate(a_full, b_full, length - 3)
    assert a.tolist() == a_full[:keep_a].tolist()
    assert b.tolist() == b_full[:keep_b].tolist()
    assert out['attention_mask'][row].sum() == length  # Full after cutting.
  # The short segment is untouched.
  a, b = _segments(out['input_ids'][0], out['token_type_ids'][0],
                   out['attention_mask'][0])
  assert b.tolist() == tok.encode([short_b])[0].tolist()


def test_encode_regression_labels_are_float(tok):
  out = downstream.encode('regression', [
      {'text': 'a b', 'text_pair': 'c', 'label': 3.25},
      {'text': 'd', 'label': -1.5}], tok, 16)
  assert out['label'].dtype == np.float32
  assert out['label'].tolist() == [3.25, -1.5]
  assert out['token_type_ids'][1].sum() == 0  # No text_pair: one segment.


def test_encode_errors(tok):
  with pytest.raises(TaskError, match='kind'):
    downstream.encode('ranking', [], tok, 16)
  with pytest.raises(TaskError, match='max_seq_length=3'):
    downstream.encode('classification', [], tok, 3)
  with pytest.raises(TaskError, match="example 0 has no field 'text'"):
    downstream.encode('classification', [{'label': 1}], tok, 16)
  with pytest.raises(TaskError, match='3 words but 2 labels'):
    downstream.encode('token', [{'words': ['a', 'b', 'c'],
                                 'labels': [0, 1]}], tok, 16)


def test_encode_tokens_first_subtoken_labels(tok, task):
  # ASCII words: the tokenizer has pieces for them all (no [UNK]).
  sentences = [ex['text'].split() for ex in task.eval
               if ex['text'].isascii()][:20]
  examples = [{'words': words, 'labels': [i % 5 for i in range(len(words))]}
              for words in sentences]
  length = 48
  out = downstream.encode('token', examples, tok, length)
  assert out['labels'].shape == (20, length)
  assert out['labels'].dtype == np.int32 and out['words_kept'].dtype == np.int32
  truncated = 0
  for row, ex in enumerate(examples):
    ids, labels = out['input_ids'][row], out['labels'][row]
    n = int(out['attention_mask'][row].sum())
    assert ids[0] == CLS and ids[n - 1] == SEP
    assert labels[0] == -1 and labels[n - 1] == -1 and (labels[n:] == -1).all()
    positions = np.flatnonzero(labels != -1)
    kept = int(out['words_kept'][row])
    assert len(positions) == kept
    truncated += kept < len(ex['words'])
    # Labels of the kept words, in order.
    assert labels[positions].tolist() == ex['labels'][:kept]
    # Each labelled token starts its word; the tokens up to the next word's
    # first token decode to the word (the last kept word's to a prefix of it
    # when the row is full: truncation may cut a word after its first
    # token, as 'written.' = '▁' 'w' 'r' 'it' 't' 'en' '.').
    bounds = list(positions) + [n - 1]
    for k in range(kept):
      piece = tok.id_to_piece(ids[positions[k]])
      assert piece.startswith('\u2581')
      assert ex['words'][k].startswith(piece.lstrip('\u2581'))
      decoded = tok.decode(ids[bounds[k]:bounds[k + 1]]).strip()
      if k + 1 < kept or n < length:
        assert decoded == ex['words'][k]
      else:
        assert ex['words'][k].startswith(decoded)
  assert truncated > 0  # Some sentences are longer than 46 tokens.
  # Scored per word: every word of every sentence, the rows' lost ones too.
  # (The rows' own labels as the predictions: right on every kept word.)
  predicted, gold = downstream.word_tags(out['labels'], out, examples)
  assert gold.shape == (20, max(len(ex['words']) for ex in examples))
  for row, ex in enumerate(examples):
    kept, n = int(out['words_kept'][row]), len(ex['words'])
    assert gold[row, :n].tolist() == ex['labels'] and (gold[row, n:] == -1
                                                       ).all()
    # No 'O' among the tags: a lost word's prediction is always wrong.
    assert predicted[row, :n].tolist() == ex['labels'][:kept] + [-2] * (
        n - kept)


def test_truncated_words_count_as_missed_entities(tok):
  """A row cut by max_seq_length keeps 'Ann' but not 'John Smith': with
  the kept word right, recall is 1/2 (conlleval over the sentence), not
  1 (over the row's labels alone)."""
  names = ('B-PER', 'I-PER', 'O')
  example = {'words': ['Ann', 'the', 'the', 'the', 'John', 'Smith'],
             'labels': [0, 2, 2, 2, 0, 1]}
  out = downstream.encode('token', [example], tok, 8)
  assert 0 < int(out['words_kept'][0]) < 5
  predicted, gold = downstream.word_tags(out['labels'], out, [example], names)
  assert predicted[0, 4:].tolist() == [2, 2]   # Lost: predicted 'O'.
  assert downstream.entity_f1(out['labels'], out['labels'], names) == 1.0
  assert downstream.entity_f1(predicted, gold, names) == pytest.approx(
      2 * 1 * 0.5 / 1.5)


def test_token_char_spans(tok):
  for text in ['When the socket closes.', '  Two  spaces, then é and 1\u00bd.',
               'x', '']:
    ids, ends = tok.encode_with_offsets([text])[0]
    starts, ends = downstream.token_char_spans(text, ends)
    assert len(starts) == len(ids)
    assert (starts < ends).all() or not len(ids)
    assert (np.diff(starts) >= 0).all() and (np.diff(ends) >= 0).all()
    for i, (a, b) in enumerate(zip(starts, ends)):
      assert not text[a].isspace() and not text[b - 1].isspace()
      piece = tok.id_to_piece(ids[i]).lstrip('\u2581')
      if piece and piece != '[UNK]' and text.isascii():
        assert text[a:b] == piece
  # The dummy "▁" before the first word shares the first letter's span.
  text = 'When the socket closes.'
  ids, ends = tok.encode_with_offsets([text])[0]
  starts, ends = downstream.token_char_spans(text, ends)
  assert starts[0] == 0 and ends[0] >= 1
  # Also in a sentence with a character of several bytes after it: the
  # spans before that character are the ASCII sentence's.
  text, twin = 'able sockets close.', 'able sockets close \u00e9.'
  ids, ends = tok.encode_with_offsets([text])[0]
  starts, ends = downstream.token_char_spans(text, ends)
  twin_ids, twin_ends = tok.encode_with_offsets([twin])[0]
  twin_starts, twin_ends = downstream.token_char_spans(twin, twin_ends)
  assert tok.id_to_piece(int(ids[0])) == '\u2581'   # Bare, before 'able'.
  assert twin_ids[:4].tolist() == ids[:4].tolist()
  assert twin_starts[:4].tolist() == starts[:4].tolist()
  assert twin_ends[:4].tolist() == ends[:4].tolist()


def test_a_leading_bare_piece_joins_the_first_word_span(tok):
  # Pretraining data with word spans places tokens by these offsets too.
  text = 'able sockets close.'
  ids, ends = tok.encode_with_offsets([text])[0]
  assert tok.id_to_piece(int(ids[0])) == '\u2581'
  spans = [(0, 4, 'word'), (5, 12, 'word'), (13, 19, 'word')]
  word_starts, _ = annotations.token_labels(ends, spans,
                                            tok.word_starts(ids))
  assert word_starts[:2].tolist() == [True, False]   # "▁" + "able".
  assert word_starts.sum() == 3


def test_encode_tokens_labels_the_first_word(tok):
  # 'Quiet' starts with a bare "▁" piece in this vocabulary: it gets the
  # label.
  out = downstream.encode('token', [{'words': ['Quiet', 'the', 'socket'],
                                     'labels': [4, 5, 6]}], tok, 16)
  positions = np.flatnonzero(out['labels'][0] != -1)
  assert out['labels'][0][positions].tolist() == [4, 5, 6]
  assert positions[0] == 1 and out['words_kept'].tolist() == [3]


def _span_examples(long_context):
  words = long_context.split(' ')
  examples = []
  for i, (first, size) in enumerate([(3, 2), (150, 3), (len(words) - 4, 2),
                                     (40, 1)]):
    # Plain words (no articles, no punctuation), so SQuAD F1 is defined.
    while not all(w.isalpha() and len(w) > 3
                  for w in words[first:first + size]):
      first -= 1
    start = len(' '.join(words[:first])) + 1
    text = ' '.join(words[first:first + size])
    assert long_context[start:start + len(text)] == text
    examples.append({'id': f'q{i}', 'question': f'What is item {i} of the '
                     'list of things here?', 'context': long_context,
                     'answers': [{'text': text, 'start': start}]})
  examples.append({'id': 'short', 'question': 'Who?',
                   'context': 'The socket closes.',
                   'answers': [{'text': 'socket', 'start': 4}]})
  return examples


def test_encode_spans_windows_and_answers(tok, long_context):
  examples = _span_examples(long_context)
  length, stride, max_query = 64, 20, 8
  out = downstream.encode('span', examples, tok, length, doc_stride=stride,
                          max_query_length=max_query)
  n = len(out['example_index'])
  for key in ('input_ids', 'token_type_ids', 'attention_mask',
              'token_start_char', 'token_end_char', 'max_context'):
    assert out[key].shape == (n, length)
  assert out['max_context'].dtype == bool
  context_tokens = tok.encode_with_offsets([long_context])[0][0]
  per_example = collections.Counter(out['example_index'].tolist())
  assert per_example[4] == 1 and per_example[0] > 5
  for i, ex in enumerate(examples):
    rows = np.flatnonzero(out['example_index'] == i)
    query = tok.encode([ex['question']])[0][:max_query]
    windows = []
    answer = ex['answers'][0]
    answer_end = answer['start'] + len(answer['text'])
    for k, row in enumerate(rows):
      a, b = _segments(out['input_ids'][row], out['token_type_ids'][row],
                       out['attention_mask'][row])
      assert a.tolist() == query.tolist()
      doc = len(query) + 2
      chars = out['token_start_char'][row]
      is_context = chars >= 0
      assert np.flatnonzero(is_context).tolist() == list(range(
          doc, doc + len(b)))
      assert not out['max_context'][row][~is_context].any()
      windows.append((k * stride, len(b)))
      if i < 4:  # Windows start doc_stride tokens apart.
        assert b.tolist() == context_tokens[k * stride:k * stride + len(b)]\
            .tolist()
      # Every window that holds the whole answer points at it.
      start, end = out['start_positions'][row], out['end_positions'][row]
      covers = (chars[is_context].min() <= answer['start'] and
                out['token_end_char'][row][is_context].max() >= answer_end)
      if covers:
        assert 0 < start <= end
        assert ex['context'][out['token_start_char'][row, start]:
                             out['token_end_char'][row, end]] == answer['text']
      else:
        assert start == end == 0
    assert any(out['start_positions'][rows] > 0)
    # Each context token is in its best window exactly once.
    total = len(tok.encode_with_offsets([ex['context']])[0][0])
    hits = np.zeros(total, int)
    for (offset, size), row in zip(windows, rows):
      doc = len(query) + 2
      hits[offset:offset + size] += out['max_context'][row, doc:doc + size]
    assert (hits == 1).all()
    assert windows[-1][0] + windows[-1][1] == total  # The end is covered.


def test_max_context_prefers_centred_windows(tok, long_context):
  examples = _span_examples(long_context)[:1]
  out = downstream.encode('span', examples, tok, 64, doc_stride=20,
                          max_query_length=8)
  # A window's middle is its own best context (except in the first and last
  # windows, which have the document's edges).
  for row in range(1, len(out['example_index']) - 1):
    context = np.flatnonzero(out['token_start_char'][row] >= 0)
    middle = context[len(context) // 2]
    assert out['max_context'][row, middle]
    assert not out['max_context'][row, context[0]]


def test_span_predictions_recover_gold_answers(tok, long_context):
  examples = _span_examples(long_context)
  out = downstream.encode('span', examples, tok, 64, doc_stride=20,
                          max_query_length=8)
  start_logits = np.zeros(out['input_ids'].shape, np.float32)
  end_logits = np.zeros(out['input_ids'].shape, np.float32)
  for row in range(len(start_logits)):
    start, end = out['start_positions'][row], out['end_positions'][row]
    if start > 0 and out['max_context'][row, start]:
      start_logits[row, start] = end_logits[row, end] = 10.0
  answers = downstream.span_predictions(start_logits, end_logits, out,
                                        examples)
  assert answers == {ex['id']: ex['answers'][0]['text'] for ex in examples}
  task = Task('t', 'span', (), ('exact_match', 'span_f1'), [], examples)
  assert downstream.evaluate(task, answers, examples) == {
      'exact_match': 1.0, 'span_f1': 1.0}
  # An answer longer than max_answer_length is never chosen.
  short = downstream.span_predictions(start_logits, end_logits, out, examples,
                                      max_answer_length=1)
  assert all(len(tok.encode([a])[0]) <= 2 for a in short.values())
  with pytest.raises(TaskError, match='shapes'):
    downstream.span_predictions(start_logits[:, :3], end_logits, out,
                                examples)


def test_span_question_too_long_for_length(tok):
  with pytest.raises(TaskError, match='no room for the context'):
    downstream.encode('span', [{'id': 'a', 'question': 'what is it ' * 10,
                                'context': 'x', 'answers': []}], tok, 8,
                      max_query_length=64)
