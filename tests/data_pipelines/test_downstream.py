"""Tests for data_pipelines.downstream: tasks, encoding, metrics."""

import collections
import csv
import functools
import json
import math

import numpy as np
import pytest
from scipy import stats

from data_pipelines import corpus as corpus_lib
from data_pipelines import downstream
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.downstream import Task, TaskError

CLS, SEP, PAD = (tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID,
                 tokenizer_lib.PAD_ID)


@pytest.fixture(scope='module')
def task():
  return downstream.embedded_task()


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


# ---------------------------------------------------------------------------
# Metrics, against hand-computed values.


def test_accuracy_skips_ignored_positions():
  assert downstream.accuracy([1, 0, 2, 2], [1, 1, 2, 0]) == pytest.approx(0.5)
  predictions = np.array([[3, 1, 0], [2, 2, 2]])
  labels = np.array([[3, -1, 1], [2, -1, -1]])
  # 3 scored positions, 2 right.
  assert downstream.accuracy(predictions, labels) == pytest.approx(2 / 3)
  assert downstream.METRICS['token_accuracy'](predictions, labels) == \
      pytest.approx(2 / 3)


def test_accuracy_rejects_mismatched_shapes():
  with pytest.raises(TaskError, match='shape'):
    downstream.accuracy([1, 0], [1, 0, 1])


def test_f1_binary_is_f1_of_class_one():
  # tp=2 (0, 4), fp=1 (3), fn=1 (1): F1 = 2*2 / (2*2 + 1 + 1).
  y = [1, 1, 0, 0, 1]
  p = [1, 0, 0, 1, 1]
  assert downstream.f1(p, y, ('no', 'yes')) == pytest.approx(4 / 6)
  # No positives at all: 0, not NaN.
  assert downstream.f1([0, 0], [0, 0], ('no', 'yes')) == 0.0


def test_f1_macro_over_classes():
  y = [0, 0, 0, 1, 1, 2, 2, 2]
  p = [0, 0, 1, 1, 2, 2, 2, 0]
  # Class 0: tp 2, fp 1, fn 1 -> 4/6. Class 1: tp 1, fp 1, fn 1 -> 2/4.
  # Class 2: tp 2, fp 1, fn 1 -> 4/6.
  expected = (4 / 6 + 2 / 4 + 4 / 6) / 3
  assert downstream.f1(p, y, ('a', 'b', 'c')) == pytest.approx(expected)


def test_matthews_binary_and_multiclass_by_hand():
  # tp 3, tn 3, fp 1, fn 1: (9 - 1) / sqrt(4 * 4 * 4 * 4) = 0.5.
  y = [1, 1, 1, 0, 0, 0, 0, 1]
  p = [1, 1, 0, 0, 0, 1, 0, 1]
  assert downstream.matthews(p, y) == pytest.approx(0.5)
  # Confusion [[2,1,0],[0,1,1],[1,0,2]]: c=5, s=8, t=p=(3,2,3), t.p=22:
  # (5*8 - 22) / sqrt((64 - 22) * (64 - 22)) = 18 / 42.
  y = [0, 0, 0, 1, 1, 2, 2, 2]
  p = [0, 0, 1, 1, 2, 2, 2, 0]
  assert downstream.matthews(p, y) == pytest.approx(18 / 42)
  assert downstream.matthews([1, 1, 1], [0, 1, 0]) == 0.0  # Undefined.
  assert downstream.matthews(y, y) == pytest.approx(1.0)


def test_pearson_and_spearman_with_ties():
  assert downstream.pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.5]) == \
      pytest.approx(stats.pearsonr([1, 2, 3], [2, 4, 6.5])[0], abs=1e-12)
  assert downstream.pearson([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == \
      pytest.approx(-1.0)
  # Ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5).
  p, y = [1.0, 2.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0]
  assert downstream.spearman(p, y) == pytest.approx(4.5 / math.sqrt(22.5),
                                                    abs=1e-12)
  assert downstream.spearman(p, y) == pytest.approx(
      stats.spearmanr(p, y).statistic, abs=1e-12)
  # Constant predictions: 0, not NaN.
  assert downstream.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
  assert downstream.spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0


def test_squad_exact_match_and_f1():
  examples = [
      {'id': 'q1', 'answers': [{'text': 'Denver Broncos', 'start': 0}]},
      {'id': 'q2', 'answers': [{'text': 'Carolina Panthers', 'start': 0},
                               {'text': 'the Panthers', 'start': 0}]},
      {'id': 'q3', 'answers': [{'text': '1990s.', 'start': 0}]},
      {'id': 'q4', 'answers': [{'text': 'Santa Clara', 'start': 0}]},
  ]
  predictions = {'q1': 'The  Denver, Broncos!', 'q2': 'Carolina',
                 'q3': 'in 1990s'}  # q4 is missing: it scores 0.
  # q1: exact after normalization. q2: P 1, R 1/2 vs gold 1 -> 2/3 (gold 2
  # 'panthers' shares nothing). q3: P 1/2, R 1 -> 2/3.
  assert downstream.exact_match(predictions, examples) == pytest.approx(0.25)
  assert downstream.span_f1(predictions, examples) == pytest.approx(
      (1 + 2 / 3 + 2 / 3 + 0) / 4)
  assert downstream.normalize_answer('An  Apple, a day.') == 'apple day'


def test_entity_f1_conlleval_style():
  names = ('O', 'B-PER', 'I-PER', 'B-LOC', 'I-LOC')
  o, bp, ip, bl, il = range(5)
  labels = np.array([[bp, ip, o, bl, o],
                     [bl, -1, il, -1, -1]])
  predictions = np.array([[bp, o, o, bl, o],      # PER cut short: wrong.
                          [bl, bp, il, o, ip]])   # -1 positions ignored.
  # Gold: PER(0,2), LOC(3,4); LOC(0,2). Found: PER(0,1), LOC(3,4); LOC(0,2).
  # 2 of 3 right both ways: P = R = F1 = 2/3.
  assert downstream.entity_f1(predictions, labels, names) == pytest.approx(
      2 / 3)
  assert downstream.accuracy(predictions, labels) == pytest.approx(6 / 7)
  assert downstream.entity_f1(labels, labels, names) == pytest.approx(1.0)
  with pytest.raises(TaskError, match='tag names'):
    downstream.entity_f1(labels, labels, ())


def test_entity_chunks_bio_and_iob1():
  chunks = downstream.entity_chunks
  # IOB1: I- starts an entity; B- only separates two of the same type.
  assert chunks(['I-PER', 'I-PER', 'B-PER', 'O']) == {(0, 2, 'PER'),
                                                      (2, 3, 'PER')}
  # A type change ends one entity and starts another.
  assert chunks(['B-PER', 'I-LOC', 'I-LOC']) == {(0, 1, 'PER'),
                                                 (1, 3, 'LOC')}
  assert chunks(['O', 'B-ORG', 'I-ORG', 'I-ORG']) == {(1, 4, 'ORG')}
  assert chunks(['O', 'MISC', 'O']) == set()  # Unprefixed tags are O.


def test_evaluate_returns_every_metric_as_float(task):
  labels = np.array([e['label'] for e in task.eval])
  result = downstream.evaluate(task, labels, labels)
  assert set(result) == set(task.metrics) == {'accuracy', 'f1'}
  assert all(type(v) is float and v == pytest.approx(1.0)
             for v in result.values())
  span_task = Task('s', 'span', (), ('exact_match', 'span_f1'), [], [
      {'id': 'a', 'question': 'q', 'context': 'x y',
       'answers': [{'text': 'y', 'start': 2}]}])
  assert downstream.evaluate(span_task, {'a': 'y'}) == {
      'exact_match': 1.0, 'span_f1': 1.0}
  assert span_task.num_labels == 2


# ---------------------------------------------------------------------------
# The embedded task.


def test_embedded_task_classes_and_split(task):
  assert task.kind == 'classification'
  assert len(task.label_names) >= 2
  assert list(task.label_names) == sorted(task.label_names)
  assert task.metrics == ('accuracy', 'f1')
  assert task.num_labels == len(task.label_names)
  train_texts = [e['text'] for e in task.train]
  eval_texts = [e['text'] for e in task.eval]
  # Unique texts, disjoint splits, about 80/20.
  assert len(set(train_texts)) == len(train_texts)
  assert len(set(eval_texts)) == len(eval_texts)
  assert not set(train_texts) & set(eval_texts)
  assert 0.12 < len(eval_texts) / (len(train_texts) + len(eval_texts)) < 0.28
  counts = collections.Counter(e['label'] for e in task.train + task.eval)
  assert set(counts) == set(range(len(task.label_names)))
  assert min(counts.values()) >= 40
  for e in task.train[:50]:
    assert e['text_pair'] is None and e['text'] == e['text'].strip()
    assert '\n' not in e['text'] and len(e['text']) >= 20


def test_embedded_task_is_deterministic(task):
  assert downstream.embedded_task() == task


def test_embedded_examples_per_class(task):
  small = downstream.embedded_task(examples_per_class=5, seed=1)
  counts = collections.Counter(e['label'] for e in small.train)
  assert counts == {i: 5 for i in range(len(task.label_names))}
  assert small.eval == task.eval  # Never subsampled.
  train_texts = {e['text'] for e in task.train}
  assert all(e['text'] in train_texts for e in small.train)
  # The choice depends on the seed only.
  assert downstream.embedded_task(examples_per_class=5, seed=1) == small
  other = downstream.embedded_task(examples_per_class=5, seed=2)
  assert other.train != small.train
  # More than a class holds: all of it.
  big = downstream.embedded_task(examples_per_class=10**6)
  assert big.train == task.train
  with pytest.raises(TaskError, match='>= 0'):
    downstream.embedded_task(examples_per_class=-1)


def test_embedded_task_on_a_stripped_python(monkeypatch):
  # The stdlib parse is cached per process: give this test a fresh cache,
  # so it sees the stripped install and later tests never see its result.
  monkeypatch.setattr(downstream, '_package_paragraphs', functools.cache(
      downstream._package_paragraphs.__wrapped__))
  monkeypatch.setattr(corpus_lib, 'stdlib_files', lambda: [])
  with pytest.raises(TaskError, match='found 0 standard-library packages.*'
                     'needs 2'):
    downstream.embedded_task()


# ---------------------------------------------------------------------------
# Encoding.


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
    # first token decode to the word.
    bounds = list(positions) + [n - 1]
    for k in range(kept):
      piece = tok.id_to_piece(ids[positions[k]])
      assert piece.startswith('\u2581')
      assert ex['words'][k].startswith(piece.lstrip('\u2581'))
      if k + 1 < kept or kept == len(ex['words']):
        assert tok.decode(ids[bounds[k]:bounds[k + 1]]).strip() == \
            ex['words'][k]
  assert truncated > 0  # Some sentences are longer than 46 tokens.


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


def test_encode_tokens_labels_the_first_word(tok):
  # 'When' starts with a bare "▁" piece in this vocabulary: it gets the label.
  out = downstream.encode('token', [{'words': ['When', 'the', 'socket'],
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


# ---------------------------------------------------------------------------
# Task files.


def _jsonl(path, records):
  path.write_text(''.join(json.dumps(r) + '\n' for r in records))
  return str(path)


def _csv(path, header, rows):
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  return str(path)


def test_load_jsonl_classification_with_string_labels(tmp_path):
  train = _jsonl(tmp_path / 'train.jsonl', [
      {'s': 'good film', 'p': 'yes', 'y': 'pos'},
      {'s': 'bad film', 'p': 'no', 'y': 'neg'},
      {'s': 'fine', 'p': '', 'y': 'pos'}])
  dev = _jsonl(tmp_path / 'dev.jsonl', [{'s': 'meh', 'p': 'x', 'y': 'neg'}])
  task = downstream.load_files('classification', train, dev, text_field='s',
                               pair_field='p', label_field='y')
  assert task.label_names == ('neg', 'pos') and task.num_labels == 2
  assert task.metrics == ('accuracy', 'f1')
  assert task.train == [
      {'text': 'good film', 'text_pair': 'yes', 'label': 1},
      {'text': 'bad film', 'text_pair': 'no', 'label': 0},
      {'text': 'fine', 'text_pair': '', 'label': 1}]
  assert task.eval == [{'text': 'meh', 'text_pair': 'x', 'label': 0}]
  # Explicit names fix the ids.
  task = downstream.load_files('classification', train, dev, text_field='s',
                               label_field='y', label_names=('pos', 'neg'))
  assert [e['label'] for e in task.train] == [0, 1, 0]
  assert task.train[0]['text_pair'] is None


def test_load_csv_classification_and_regression(tmp_path):
  train = _csv(tmp_path / 'train.csv', ['text', 'label', 'score'],
               [['a, quoted "x"', '2', '0.5'], ['b', '0', '4'],
                ['c', '10', '-1e-1']])
  dev = _csv(tmp_path / 'dev.csv', ['text', 'label', 'score'],
             [['d', '10', '3.5']])
  task = downstream.load_files('classification', train, dev)
  # Integer labels keep their values as ids (not '10' < '2' string order).
  assert [e['label'] for e in task.train] == [2, 0, 10]
  assert task.label_names == tuple(str(i) for i in range(11))
  assert task.train[0]['text'] == 'a, quoted "x"'
  task = downstream.load_files('regression', train, dev, label_field='score')
  assert task.label_names == () and task.num_labels == 1
  assert [e['label'] for e in task.train] == [0.5, 4.0, -0.1]
  assert task.eval[0]['label'] == 3.5
  assert task.metrics == ('pearson', 'spearman')


def test_load_token_files(tmp_path):
  train = _jsonl(tmp_path / 'train.jsonl', [
      {'words': ['John', 'lives', 'in', 'Paris'],
       'labels': ['B-PER', 'O', 'O', 'B-LOC']},
      {'words': ['New', 'York'], 'labels': ['B-LOC', 'I-LOC']}])
  dev = _csv(tmp_path / 'dev.csv', ['words', 'labels'],
             [['Mary sleeps', '["B-PER", "O"]']])
  task = downstream.load_files('token', train, dev)
  assert task.label_names == ('B-LOC', 'B-PER', 'I-LOC', 'O')
  assert task.metrics == ('entity_f1', 'accuracy')
  assert task.train[0] == {'words': ['John', 'lives', 'in', 'Paris'],
                           'labels': [1, 3, 3, 0]}
  assert task.eval == [{'words': ['Mary', 'sleeps'], 'labels': [1, 3]}]


def test_load_span_files(tmp_path):
  context = 'The socket closes after the timeout.'
  train = _jsonl(tmp_path / 'train.jsonl', [
      {'id': 'a', 'question': 'What closes?', 'context': context,
       'answers': [{'text': 'socket', 'answer_start': 4}]},
      {'question': 'When?', 'context': context,   # HF layout, no id.
       'answers': {'text': ['after the timeout'], 'answer_start': [18]}}])
  dev = _jsonl(tmp_path / 'dev.jsonl', [
      {'id': 'c', 'question': 'What?', 'context': context,
       'answers': [{'text': 'timeout', 'start': 28}]}])
  task = downstream.load_files('span', train, dev)
  assert task.metrics == ('exact_match', 'span_f1') and task.label_names == ()
  assert task.train[0]['answers'] == [{'text': 'socket', 'start': 4}]
  assert task.train[1]['id'] == f'{train}:2'
  assert task.train[1]['answers'] == [{'text': 'after the timeout',
                                       'start': 18}]
  bad = _jsonl(tmp_path / 'bad.jsonl', [
      {'id': 'c', 'question': 'What?', 'context': context,
       'answers': [{'text': 'timeout', 'start': 3}]}])
  with pytest.raises(TaskError, match="'timeout' is not at character 3"):
    downstream.load_files('span', train, bad)


@pytest.mark.parametrize('kind, train, dev, kwargs, message', [
    ('classification', [{'text': 'a', 'label': 0}, {'text': 'b', 'label': 1}],
     None, {}, r'does not exist'),
    ('classification', [{'text': 'a', 'label': 0}, {'txt': 'b', 'label': 1}],
     [{'text': 'c', 'label': 0}], {},
     r"train\.jsonl:2: no field 'text' .*Set text_field"),
    ('classification', [{'text': 'a', 'label': 'x'}],
     [{'text': 'c', 'label': 'y'}], {},
     r"dev\.jsonl:1: label 'y' never occurs in the training file"),
    ('classification', [{'text': 'a', 'label': 0}],
     [{'text': 'c', 'label': 1}], {}, r'label 1 never occurs'),
    ('classification', [{'text': 'a', 'label': 'x'}, {'text': 'b',
                                                      'label': 'x'}],
     [{'text': 'c', 'label': 'x'}], {}, r"label 'x'; classification needs at "
     'least two classes'),
    ('classification', [{'text': 'a', 'label': 'x'}],
     [{'text': 'c', 'label': 'x'}], {'label_names': ('p', 'q')},
     r"label 'x' is not one of the labels \('p', 'q'\)"),
    ('token', [{'words': ['a', 'b'], 'labels': ['O']}],
     [{'words': ['a'], 'labels': ['O']}], {},
     r'train\.jsonl:1: 2 words but 1 labels'),
    ('regression', [{'text': 'a', 'label': 'high'}],
     [{'text': 'c', 'label': 1}], {}, r"regression label 'high'"),
    ('span', [{'question': 'q', 'context': 'c', 'answers': [], 'id': 'a'}],
     [{'question': 'q', 'context': 'c',
       'answers': [{'text': 'c', 'start': 0}]}], {}, r'non-empty list'),
])
def test_load_files_errors(tmp_path, kind, train, dev, kwargs, message):
  train_path = _jsonl(tmp_path / 'train.jsonl', train)
  dev_path = (str(tmp_path / 'missing.jsonl') if dev is None else
              _jsonl(tmp_path / 'dev.jsonl', dev))
  with pytest.raises(TaskError, match=message):
    downstream.load_files(kind, train_path, dev_path, **kwargs)


def test_load_files_format_errors(tmp_path):
  good = _jsonl(tmp_path / 'good.jsonl', [{'text': 'a', 'label': 0}])
  empty = tmp_path / 'empty.jsonl'
  empty.write_text('\n\n')
  with pytest.raises(TaskError, match='empty.jsonl.* holds no examples'):
    downstream.load_files('classification', good, str(empty))
  header_only = _csv(tmp_path / 'h.csv', ['text', 'label'], [])
  with pytest.raises(TaskError, match='holds no examples'):
    downstream.load_files('classification', header_only, good)
  tsv = tmp_path / 'x.tsv'
  tsv.write_text('a\t0\n')
  with pytest.raises(TaskError, match="unknown format '.tsv'"):
    downstream.load_files('classification', str(tsv), good)
  not_json = tmp_path / 'n.jsonl'
  not_json.write_text('{"text": "a", "label": 0}\n{oops\n')
  with pytest.raises(TaskError, match=r'n\.jsonl:2: not JSON'):
    downstream.load_files('classification', str(not_json), good)
  short_row = _csv(tmp_path / 's.csv', ['text', 'label'], [['a', '0'], ['b']])
  with pytest.raises(TaskError, match=r"s\.csv:3: no field 'label'"):
    downstream.load_files('classification', short_row, good)
  with pytest.raises(TaskError, match='kind'):
    downstream.load_files('ranking', good, good)


# ---------------------------------------------------------------------------
# TFDS (no network: the reads are faked).


def test_load_tfds_unknown_name_fails_before_reading(monkeypatch):
  def fail(*args):
    raise AssertionError(f'read {args} before validating the name')
  monkeypatch.setattr(downstream, '_read_tfds_split', fail)
  monkeypatch.setattr(downstream, '_tfds_label_names', fail)
  with pytest.raises(TaskError, match=r"unknown TFDS task 'glue/sst3'.*"
                     r"'glue/sst2'.*'squad'.*'conll2003'"):
    downstream.load_tfds('glue/sst3')


def _fake_tfds(monkeypatch, records, names=()):
  calls = []

  def read(name, split, data_dir):
    calls.append((name, split, data_dir))
    return records[split]

  monkeypatch.setattr(downstream, '_read_tfds_split', read)
  monkeypatch.setattr(downstream, '_tfds_label_names',
                      lambda name, feature, data_dir: names)
  return calls


def test_load_tfds_glue_pairs(monkeypatch):
  record = {'idx': np.int32(0), 'sentence1': b'He said hi.',
            'sentence2': np.array(b'He greeted.'), 'label': np.int64(1)}
  calls = _fake_tfds(monkeypatch, {'train': [record] * 2,
                                   'validation': [record]},
                     ('not_equivalent', 'equivalent'))
  task = downstream.load_tfds('glue/mrpc', '/data')
  assert calls == [('glue/mrpc', 'train', '/data'),
                   ('glue/mrpc', 'validation', '/data')]
  assert task.metrics == ('f1', 'accuracy') and task.num_labels == 2
  assert task.train[0] == {'text': 'He said hi.', 'text_pair': 'He greeted.',
                           'label': 1}
  assert type(task.train[0]['label']) is int


def test_load_tfds_mnli_stsb_cola(monkeypatch):
  mnli = {'premise': b'A', 'hypothesis': b'B', 'label': np.int64(2)}
  calls = _fake_tfds(monkeypatch, {'train': [mnli],
                                   'validation_matched': [mnli]},
                     ('entailment', 'neutral', 'contradiction'))
  task = downstream.load_tfds('glue/mnli')
  assert calls[1] == ('glue/mnli', 'validation_matched', None)
  assert task.eval == [{'text': 'A', 'text_pair': 'B', 'label': 2}]
  assert task.num_labels == 3
  stsb = {'sentence1': b'x', 'sentence2': b'y', 'label': np.float32(3.8)}
  _fake_tfds(monkeypatch, {'train': [stsb], 'validation': [stsb]})
  task = downstream.load_tfds('glue/stsb')
  assert task.kind == 'regression' and task.metrics == ('pearson', 'spearman')
  assert task.train[0]['label'] == pytest.approx(3.8)
  cola = {'sentence': b'Him went.', 'label': np.int64(0)}
  _fake_tfds(monkeypatch, {'train': [cola], 'validation': [cola]},
             ('unacceptable', 'acceptable'))
  task = downstream.load_tfds('glue/cola')
  assert task.metrics[0] == 'matthews'
  assert task.train[0] == {'text': 'Him went.', 'text_pair': None,
                           'label': 0}


def test_load_tfds_squad_and_conll(monkeypatch):
  squad = {'id': b'5733be284776f41900661182', 'title': b'T',
           'question': b'What closes?',
           'context': 'The socket closes.'.encode(),
           'answers': {'text': np.array([b'socket', b'The socket']),
                       'answer_start': np.array([4, 0], np.int32)}}
  calls = _fake_tfds(monkeypatch, {'train': [squad], 'validation': [squad]})
  task = downstream.load_tfds('squad')
  assert calls[0][:2] == ('squad/v1.1', 'train')
  assert task.kind == 'span' and task.metrics == ('exact_match', 'span_f1')
  assert task.eval[0] == {
      'id': '5733be284776f41900661182', 'question': 'What closes?',
      'context': 'The socket closes.',
      'answers': [{'text': 'socket', 'start': 4},
                  {'text': 'The socket', 'start': 0}]}
  names = ('O', 'B-PER', 'I-PER', 'B-ORG', 'I-ORG', 'B-LOC', 'I-LOC',
           'B-MISC', 'I-MISC')
  conll = {'tokens': np.array([b'EU', b'rejects', b'German']),
           'pos': np.array([1, 2, 3]), 'chunks': np.array([1, 2, 3]),
           'ner': np.array([3, 0, 7])}
  calls = _fake_tfds(monkeypatch, {'train': [conll], 'dev': [conll]}, names)
  task = downstream.load_tfds('conll2003')
  assert calls[1][:2] == ('conll2003', 'dev')
  assert task.label_names == names and task.metrics[0] == 'entity_f1'
  assert task.train[0] == {'words': ['EU', 'rejects', 'German'],
                           'labels': [3, 0, 7]}
