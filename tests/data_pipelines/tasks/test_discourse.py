"""ERNIE 2.0's discourse relation layout and task (data_pipelines/discourse.py
and the ``discourse`` layout of instances.py): the marker list, its token
sequences, the candidate scan against hand-built documents and a loop,
the materialized instances, the no-marker error, determinism and config
checks."""

import pickle

import numpy as np
import pytest

from data_pipelines import discourse
from data_pipelines import instances
from data_pipelines import pretokenize
from data_pipelines import tasks
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.tokenizer import CLS_ID, SEP_ID, UNK_ID

MAX_SEQ_LENGTH = 64
# Tokens that do not start a word: a comma, and a word's second piece.
COMMA, PIECE = 7, 9
# Per marker (label = index), its token sequences: 3 ('still more') is a
# longer match than 2 ('still') where both fit.
MARKERS = (
    ((100,), (100, COMMA)),
    ((101, 102), (101, 102, COMMA)),
    ((103,), (103, COMMA)),
    ((103, 104),),
)
DOCS = [
    [[200, 201], [100, COMMA, 202, 203], [101, 102, 204], [100, PIECE, 205],
     [100], [100, COMMA], [101, 205], [103, 104, 206], [103, 206],
     [103, COMMA, 104, 207]],
    [[100, COMMA, 208], [209], [101, 102, COMMA, 210, 211]],
    [[212, 213, 214]],
]
# (global sentence s, label, marker tokens) of DOCS, by hand: 3 is no
# match (the marker runs into a word's second piece), 4 and 5 have nothing
# after the marker, 6 holds half a marker, 10 is its document's first.
EXPECTED = [(1, 0, 2), (2, 1, 2), (7, 3, 2), (8, 2, 1), (9, 2, 2),
            (12, 1, 3)]


class TokenCorpus:
  """Documents as lists of sentences of explicit token ids, as records and
  a ``DocumentIndex``; counts the records read."""

  def __init__(self, docs):
    self.docs = docs
    lengths = [len(s) for d in docs for s in d]
    offsets = np.cumsum([0] + [len(d) for d in docs])
    self.index = pretokenize.DocumentIndex(
        np.array(lengths, np.int32), offsets.astype(np.int64),
        np.zeros(8, np.int64))
    self.records = []
    for d in docs:
      ids = np.array([t for s in d for t in s], np.int32)
      self.records.append({
          'token_ids': ids,
          'sentence_lengths': np.array([len(s) for s in d], np.int32),
          'word_starts': ~np.isin(ids, [COMMA, PIECE]),
          'unit_labels': np.zeros(len(ids), np.int8),
          'capitalized': np.zeros(len(ids), bool)})
    self.reads = 0
    self.sentences = [s for d in docs for s in d]

  def __len__(self):
    return len(self.records)

  def __getitem__(self, d):
    self.reads += 1
    return self.records[d]


def builder(corpus, markers=MARKERS, seed=0, path=''):
  return instances.InstanceBuilder(
      corpus, corpus.index,
      instances.InstanceConfig('discourse', MAX_SEQ_LENGTH,
                               discourse_markers=markers,
                               discourse_markers_path=path), seed)


def brute_force(docs, markers):
  """(global sentence, label, marker tokens) by a loop over sentences."""
  sequences = sorted(((len(s), label, s) for label, ss in enumerate(markers)
                      for s in ss), key=lambda row: -row[0])
  found, g = [], 0
  for doc in docs:
    for i, sentence in enumerate(doc):
      for n, label, sequence in sequences:
        if (i > 0 and len(sentence) > n and tuple(sentence[:n]) == sequence
            and sentence[n] not in (COMMA, PIECE)):
          found.append((g, label, n))
          break
      g += 1
  return found


# ---------------------------------------------------------------------------
# The candidates.


def test_candidates_of_hand_built_documents():
  corpus = TokenCorpus(DOCS)
  found = discourse.find_candidates(corpus, corpus.index, MARKERS)
  assert list(zip(found.sentence.tolist(), found.label.tolist(),
                  found.marker_length.tolist())) == EXPECTED
  assert found.sentences_scanned == 9 + 2 + 0
  assert corpus.reads == len(DOCS)   # One read of the split.
  assert brute_force(DOCS, MARKERS) == EXPECTED


def test_candidates_match_a_loop_across_blocks(monkeypatch):
  monkeypatch.setattr(discourse, '_BLOCK_SENTENCES', 100)
  rng = np.random.default_rng(0)
  firsts = [100, 101, 103, 200, 201, PIECE, COMMA]
  rest = [102, 104, COMMA, PIECE, 205, 206, 100]
  docs = [[[int(rng.choice(firsts))] + rng.choice(
      rest, size=rng.integers(0, 5)).tolist()
           for _ in range(rng.integers(1, 9))] for _ in range(700)]
  docs[5] = [[200]] * 250   # A document longer than a block.
  corpus = TokenCorpus(docs)
  found = discourse.find_candidates(corpus, corpus.index, MARKERS)
  expected = brute_force(docs, MARKERS)
  assert len(expected) > 300
  assert corpus.reads == len(docs)
  assert list(zip(found.sentence.tolist(), found.label.tolist(),
                  found.marker_length.tolist())) == expected


def test_no_marker_raises_data_error_naming_the_list(tmp_path):
  corpus = TokenCorpus([[[200, 201], [202], [203, 204]], [[205], [206]]])
  with pytest.raises(pretokenize.DataError) as error:
    discourse.find_candidates(corpus, corpus.index, MARKERS)
  message = str(error.value)
  assert discourse.SHIPPED_MARKERS in message
  assert 'none of the 3 sentences scanned' in message
  assert 'a discourse task on a corpus with no markers found' in (
      message.lower())
  assert 'tasks.discourse_relation.markers_path' in message
  path = str(tmp_path / 'markers.txt')
  with pytest.raises(pretokenize.DataError, match=path):
    builder(corpus, path=path).plan(0)


# ---------------------------------------------------------------------------
# The instances.


def expected_instance(corpus, s, label, skip):
  a, b = corpus.sentences[s - 1], corpus.sentences[s][skip:]
  ids = [CLS_ID, *a, SEP_ID, *b, SEP_ID]
  types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
  return ids, types, label


def test_instances_of_hand_built_documents():
  corpus = TokenCorpus(DOCS)
  b = builder(corpus)
  plan = b.plan(0)
  assert len(plan) == len(EXPECTED)
  for k, (s, label, skip) in enumerate(EXPECTED):
    instance = b.materialize(plan, k, 0)
    ids, types, label = expected_instance(corpus, s, label, skip)
    assert instance['input_ids'].tolist() == ids
    assert instance['token_type_ids'].tolist() == types
    assert instance['next_sentence_label'] == label
    assert instance['next_sentence_label'].dtype == np.int32


def test_a_long_pair_is_truncated_as_nsp():
  a = list(range(300, 350))                  # 50 tokens.
  b = [100, COMMA] + list(range(400, 440))   # 40 after the marker.
  corpus = TokenCorpus([[a, b]])             # One document is enough.
  bld = builder(corpus)
  instance = bld.materialize(bld.plan(0), 0, 0)
  ids = instance['input_ids'].tolist()
  sep = ids.index(SEP_ID)
  a_kept, b_kept = ids[1:sep], ids[sep + 1:-1]
  assert (len(a) - len(a_kept), 40 - len(b_kept)) == (
      instances.truncation_counts(50, 40, MAX_SEQ_LENGTH - 3))
  assert len(ids) == MAX_SEQ_LENGTH
  # Truncation cuts the ends only; the marker stays out.
  assert a_kept == list(range(a_kept[0], a_kept[0] + len(a_kept)))
  assert b_kept == list(range(b_kept[0], b_kept[0] + len(b_kept)))
  assert 400 <= b_kept[0] and b_kept[-1] < 440


def test_the_split_is_read_once_for_every_epoch():
  corpus = TokenCorpus(DOCS)
  b = builder(corpus)
  plans = [b.plan(e) for e in (0, 1, 2, 3, 0)]
  assert corpus.reads == len(DOCS)
  assert all(p is plans[0] for p in plans)
  # A worker's copy keeps the pairs: it reads only what it materializes.
  copy = pickle.loads(pickle.dumps(b))
  copy.plan(7)
  assert copy.source.reads == len(DOCS)


def test_same_seed_same_bytes():
  docs = [d for _ in range(20) for d in DOCS]
  def batch(seed, epoch):
    ds = instances.InstanceDataset(builder(TokenCorpus(docs), seed=seed),
                                   seed=seed, dupe_factor=1, dynamic=True)
    size = ds.epoch_size(0)
    return ds.get_batch(np.arange(epoch * size, (epoch + 1) * size))

  first, again = batch(0, 0), batch(0, 0)
  for key in first:
    assert first[key].tobytes() == again[key].tobytes(), key
  # Each epoch is the same pairs in a new order.
  second = batch(0, 1)
  assert first['input_ids'].tobytes() != second['input_ids'].tobytes()
  assert sorted(map(bytes, first['input_ids'])) == sorted(
      map(bytes, second['input_ids']))


def test_builder_needs_the_markers():
  with pytest.raises(ValueError, match='discourse_marker_ids'):
    builder(TokenCorpus(DOCS), markers=())


# ---------------------------------------------------------------------------
# The marker list and its token sequences.


def test_the_shipped_list():
  with open(discourse.SHIPPED_MARKERS, encoding='utf-8') as f:
    assert f.readline().startswith('#')
  markers = discourse.read_markers()
  assert 30 <= len(markers) <= 60
  assert all(m == m.lower() and m.strip() == m for m in markers)
  assert len(set(markers)) == len(markers)
  assert {'however', 'for example', 'in addition', 'therefore'} <= set(
      markers)


def test_read_markers_errors(tmp_path):
  with pytest.raises(ValueError, match='does not exist'):
    discourse.read_markers(str(tmp_path / 'missing.txt'))
  empty = tmp_path / 'empty.txt'
  empty.write_text('# only a comment\n\n')
  with pytest.raises(ValueError, match='holds no marker'):
    discourse.read_markers(str(empty))
  twice = tmp_path / 'twice.txt'
  twice.write_text('however\nthus\nHowever\n')
  with pytest.raises(ValueError, match='more than once'):
    discourse.read_markers(str(twice))


class WordTokenizer:
  """Splits on spaces, a trailing comma its own token; unknown words are
  [UNK]."""
  VOCAB = {'However': 10, 'however': 11, ',': 12, 'For': 13, 'for': 14,
           'example': 15}

  def encode(self, texts):
    out = []
    for text in texts:
      words = [w for word in text.split() for w in (
          [word[:-1], ','] if word.endswith(',') else [word])]
      out.append(np.array([self.VOCAB.get(w, UNK_ID) for w in words]))
    return out


def test_marker_ids_of_a_word_tokenizer(tmp_path):
  path = tmp_path / 'markers.txt'
  path.write_text('# a list\nhowever\nnever heard\nfor example\n')
  ids, markers = discourse.discourse_marker_ids(WordTokenizer(), str(path))
  assert markers == ('however', 'never heard', 'for example')
  assert ids == (((10, 12), (10,), (11, 12), (11,)),
                 (),   # [UNK]: never matched, and the labels still count it.
                 ((13, 15, 12), (13, 15), (14, 15, 12), (14, 15)))


def test_a_real_tokenizer_end_to_end(tmp_path):
  text = [['The weather was cold.', 'However, the cat sat outside.',
           'So the dog barked.', 'Sometimes birds sing.', 'So, it rained.'],
          ['For example, dogs bark.', 'Still nothing happened.']]
  tok = tokenizer_lib.train([s for d in text for s in d] * 10, 80,
                            'unigram')
  path = tmp_path / 'markers.txt'
  path.write_text('however\nfor example\nso\n')
  markers, _ = discourse.discourse_marker_ids(tok, str(path))
  corpus = TokenCorpus([[tok.encode([s])[0].tolist() for s in d]
                        for d in text])
  for record in corpus.records:
    record['word_starts'] = tok.word_starts(record['token_ids'])
  b = builder(corpus, markers=markers)
  plan = b.plan(0)
  # 'Sometimes' is not 'So'; 'For example' opens its document.
  assert plan.a_end.tolist() == [1, 2, 4]
  assert plan.label.tolist() == [0, 2, 2]
  decoded = []
  for k in range(len(plan)):
    instance = b.materialize(plan, k, 0)
    ids = instance['input_ids']
    sep = np.flatnonzero(ids == SEP_ID)[0]
    decoded.append((tok.decode(ids[1:sep]), tok.decode(ids[sep + 1:-1])))
  assert decoded == [
      ('The weather was cold.', 'the cat sat outside.'),
      ('However, the cat sat outside.', 'the dog barked.'),
      ('Sometimes birds sing.', 'it rained.')]


# ---------------------------------------------------------------------------
# The task.


def test_task_declaration_and_checks(tmp_path):
  task = tasks.get('discourse_relation')
  assert (task.head, task.label_field, task.weight_field, task.layout) == (
      'sentence', 'next_sentence_labels', '', 'discourse')
  assert task.apply is None and not task.corrupts
  params = task.defaults()
  assert params == {'markers_path': ''}
  assert task.num_classes(params, 128) == len(discourse.read_markers())
  path = tmp_path / 'three.txt'
  path.write_text('however\nthus\nso\n')
  assert task.num_classes({'markers_path': str(path)}, 128) == 3
  errors = []
  task.check(params, None, errors)
  assert not errors
  empty = tmp_path / 'empty.txt'
  empty.write_text('\n')
  for bad, says in ((str(tmp_path / 'missing.txt'), 'does not exist'),
                    (str(empty), 'holds no marker'), (3, 'a string')):
    errors = []
    task.check({'markers_path': bad}, None, errors)
    assert len(errors) == 1
    assert errors[0].startswith('tasks.discourse_relation.markers_path=')
    assert says in errors[0]
