"""Tests for ERNIE 2.0's capitalization prediction: the case-folding
tokenizer, the records' ``capitalized`` flags against the words of known
text, and the task's fields and checks."""

import numpy as np
import pytest

from bertjax import config_lib
from data_pipelines import corpus as corpus_lib
from data_pipelines import instances
from data_pipelines import pipeline
from data_pipelines import pretokenize
from data_pipelines import shards
from data_pipelines import tasks
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.tasks import capitalization

from fake_corpus import MAX_SEQ_LENGTH, random_corpus

_WORDS = ('paris berlin river city the of and is was über éclair ärger '
          'nasa iphone mcdonald second 2nd (london) york new').split()


def _sentences(n: int, seed: int) -> list[str]:
  """Words lower case, Capitalized, UPPER or iNverted at random."""
  rng = np.random.default_rng(seed)
  styles = (str.lower, str.capitalize, str.upper,
            lambda w: w[:1].lower() + w[1:].upper())
  return [' '.join(styles[rng.integers(4)](w) for w in
                   rng.choice(_WORDS, size=rng.integers(3, 10))) + '.'
          for _ in range(n)]


def _is_capitalized(word: str) -> bool:
  """The first cased character of ``word`` is upper (or title) case."""
  first = next((c for c in word if c.isupper() or c.islower()
                or c.istitle()), '')
  return first.isupper() or first.istitle()


@pytest.fixture(scope='module')
def text():
  return _sentences(400, seed=0)


@pytest.fixture(scope='module')
def tok(text):
  return tokenizer_lib.train(text, 120, 'unigram', num_threads=1,
                             lowercase=True)


@pytest.fixture(scope='module')
def cased(text):
  return tokenizer_lib.train(text, 120, 'unigram', num_threads=1)


def test_a_lowercasing_model_hides_the_case(tok, cased):
  assert tok.lowercases and not cased.lowercases
  assert tokenizer_lib.Tokenizer(tok.model_proto).lowercases
  upper, lower = tok.encode(['Paris ÄRGER Über.', 'paris ärger über.'])
  np.testing.assert_array_equal(upper, lower)
  upper, lower = cased.encode(['Paris ÄRGER Über.', 'paris ärger über.'])
  assert upper.tolist() != lower.tolist()


def _records(tokenizer, documents):
  return [record for _, record in shards.tokenize_documents(
      enumerate(documents), tokenizer, num_threads=1)]


def test_records_flag_the_first_token_of_each_capitalized_word(tok):
  documents = [_sentences(5, seed=s) for s in range(1, 30)]
  flagged = 0
  for document, record in zip(documents, _records(tok, documents)):
    assert record['capitalized'].dtype == bool
    word_starts = record['word_starts']
    assert not record['capitalized'][~word_starts].any()
    ends = np.cumsum(record['sentence_lengths'])
    for sentence, a, b in zip(document, ends - record['sentence_lengths'],
                              ends):
      words = sentence.split()
      assert word_starts[a:b].sum() == len(words)   # No [UNK] splits one.
      assert record['capitalized'][a:b][word_starts[a:b]].tolist() == [
          _is_capitalized(w) for w in words]
      flagged += sum(map(_is_capitalized, words))
  assert flagged > 100


def test_annotated_words_are_flagged_as_the_spans_make_them(tok):
  document = corpus_lib.Document(
      ['new York is NASA', 'The iphone'],
      spans=[[(0, 8, 'word'), (12, 16, 'entity')], []])
  record, = _records(tok, [document])
  starts = record['word_starts']
  # "new York" is one word, not capitalized; NASA and The are.
  assert record['capitalized'][starts].tolist() == [False, False, True,
                                                    True, False]


def test_a_cased_tokenizer_records_no_capitalization(cased):
  record, = _records(cased, [['Paris and Berlin.']])
  assert record['capitalized'].dtype == bool
  assert not record['capitalized'].any()


def test_capitalized_words_in_any_script():
  # Offsets as SentencePiece gives them: a word begins at the space before.
  sentences = ['𐐀x 𐐨y ǅz Ωmega ωmega 42 (Élan) ßX', '', 'iPhone McD']
  words = [s.split() for s in sentences]
  begins, starts = [], []
  for sentence in sentences:
    at = [i for i, c in enumerate(sentence)
          if not c.isspace() and (i == 0 or sentence[i - 1].isspace())]
    begins.append(np.array([len(sentence[:max(i - 1, 0)].encode())
                            for i in at], np.int64))
    starts.append(np.ones(len(at), bool))
  flags = tokenizer_lib.capitalized_words(sentences, begins, starts)
  assert [f.tolist() for f in flags] == [
      [_is_capitalized(w) for w in ws] for ws in words]
  assert flags[0].tolist() == [True, False, True, True, False, False, True,
                               False]
  assert tokenizer_lib.capitalized_words([], [], []) == []


def test_the_tokenizer_cache_covers_lowercase(tmp_path, text):
  data = config_lib.base_config().data
  data.data_dir = str(tmp_path)
  data.tokenizer.vocab_size = 100
  made = {}
  for lowercase in (False, True, False):
    data.tokenizer.lowercase = lowercase
    made.setdefault(lowercase, []).append(pretokenize.cached_tokenizer(
        data, ('text',), lambda k, seed: text, method='test'))
  assert [t.lowercases for t in made[False] + made[True]] == [
      False, False, True]
  assert made[False][0].sha256 == made[False][1].sha256
  assert len(list((tmp_path / 'tokenizers').iterdir())) == 2


def test_check_refuses_an_input_that_shows_the_case():
  data = config_lib.base_config().data
  errors = []
  tasks.get('capitalization').check({}, data, errors)
  assert len(errors) == 1
  assert '--config.data.tokenizer.lowercase=True' in errors[0]
  assert 'model_path' in errors[0]
  data.tokenizer.lowercase = True
  errors = []
  tasks.get('capitalization').check({}, data, errors)
  assert not errors


@pytest.fixture(scope='module')
def batch():
  corpus = random_corpus(20, seed=5)
  builder = instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig('nsp', MAX_SEQ_LENGTH), seed=0)
  return builder.materialize_batch(builder.plan(0), np.arange(16), 0)


def test_labels_and_weights_are_per_word(batch):
  out = capitalization.capitalization_fields(batch, {}, seed=0)
  labels, weights = (out['capitalization_labels'],
                     out['capitalization_weights'])
  assert labels.dtype == np.int32 and weights.dtype == np.float32
  real = batch['input_ids'] >= tokenizer_lib.NUM_SPECIAL
  # fake_corpus: token t starts a word when 3 | t, is capitalized when 5 | t.
  np.testing.assert_array_equal(
      weights, real & (batch['input_ids'] % 3 == 0))
  np.testing.assert_array_equal(labels, real & (batch['input_ids'] % 5 == 0))
  assert 'capitalization_labels' not in batch


def test_check_has_case(batch):
  out = capitalization.capitalization_fields(batch, {}, seed=0)
  expected = int((out['capitalization_labels']
                  * out['capitalization_weights']).sum())
  assert expected > 0
  assert capitalization.check_has_case(out) == expected
  assert capitalization.check_has_case([batch, batch]) == 2 * expected
  lower = dict(batch, capitalized=np.zeros_like(batch['capitalized']))
  with pytest.raises(pretokenize.DataError,
                     match='capitalization prediction on a lower-cased '
                     'corpus.*tasks.capitalization.weight=0'):
    capitalization.check_has_case([lower])


def test_a_multi_host_check_fails_only_where_no_host_has_case(batch):
  # Each process checks its rows of the eval batches; a process whose rows
  # hold no capitalized word must not fail alone (the others would wait
  # on it at the next collective), and with none, every one fails.
  lower = dict(batch, capitalized=np.zeros_like(batch['capitalized']))
  check = capitalization.check_has_case
  other_passed = lambda passed: passed + 1   # One more process, whose
  other_failed = lambda passed: passed       # rows pass / fail.
  pipeline.check_task_data(check, [lower], other_passed)
  pipeline.check_task_data(check, [batch], other_failed)
  for total in (other_failed, None):
    with pytest.raises(pretokenize.DataError, match='lower-cased'):
      pipeline.check_task_data(check, [lower], total)


def test_the_task_is_registered():
  task = tasks.get('capitalization')
  assert (task.head, task.num_classes({}, 128), task.label_field,
          task.weight_field, task.corrupts, task.instance_flags) == (
              'token', 2, 'capitalization_labels', 'capitalization_weights',
              False, ())
  assert task.fields({}, 128) == {
      'capitalization_labels': ((128,), np.int32),
      'capitalization_weights': ((128,), np.float32)}
