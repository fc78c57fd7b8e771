"""Bad data never crashes a run: it is skipped and counted, or it fails in
``prepare`` (or when the training stream is built, before compiling) with a
message that says what to change.

A small corpus of made-up words in a temp dir, with one file of every kind
of damage (``_BAD_FILE``), goes through the real path: tokenizer training,
``pretokenize.prepare`` and the pipeline's batches. The counts asserted are
exact: each is worked out next to the bytes that cause it.
"""

import collections
import copy
import itertools
import json
import os
import time

import numpy as np
import pytest

from bertjax import config_lib
from data_pipelines import corpus as corpus_lib
from data_pipelines import instances
from data_pipelines import mixture
from data_pipelines import pipeline
from data_pipelines import pretokenize

from fake_corpus import FakeCorpus

_SYLLABLES = 'ka to ri an mel so vu ne pa li ost er gan du ba'.split()
_LAYOUTS = ('nsp', 'sop', 'full_sentences')
_HUGE_LINE_WORDS = 40_000  # About 200 KB on one line, no full stop.
_NO_SPACE_RUN = 5_000      # One "word" of 5000 characters.

# One file of damage, in sentence_per_line format (a blank line ends a
# document), with what each part adds to the counts.
_BAD_FILE = b''.join([
    b'Good first sentence here.\nAnd a second one.\n',
    b'\n\n\n',          # Ends the document, then 2 empty documents.
    b'   \t \n',        # Whitespace only: blank, a 3rd empty document.
    b'\x00\x01\x02\n',  # No text once cleaned: an empty sentence (3 control
    b'\x1b[0m\n',       # characters), another (an escape, 4 characters),
    b'\n',              # and their document is the 4th empty one.
    b'Lonely sentence.\n\n',  # One sentence: kept.
    b'A\n\n',                 # One token: kept.
    b'Bad \xff\xfe bytes \xc3 here.\nSecond line is fine.\n\n',  # 3 invalid
    # bytes in 1 line; kept.
    b'\x80\x81\x82\n\n',  # 3 invalid bytes in 1 line, read as U+FFFD, which
    # SentencePiece removes: an empty sentence in the 5th empty document.
    b'Nul\x00 and esc \x1b[31mred\x1b[0m text.\n'  # 1 + 5 + 4 characters.
    b'Zero\xe2\x80\x8bwidth space.\n\n',
    b'\xe2\x80\x8b\xe2\x80\x8b\n\n',  # Zero-width spaces only: no token, an
    # empty sentence in the 6th empty document.
])
_BAD_FILE_SKIPPED = {
    'empty_documents': 6,
    'empty_sentences': 4,
    'invalid_utf8_bytes': 6,
    'invalid_utf8_lines': 2,
    'control_characters': 3 + 4 + 1 + 5 + 4,
    'long_sentences_split': 2,  # The huge line and the run with no space.
}
# Kept: the 5 above with text, the huge line and the run with no space.
_BAD_FILE_DOCUMENTS = 7


def _words(rng, n):
  return [''.join(rng.choice(_SYLLABLES, rng.integers(1, 4)))
          for _ in range(n)]


def _good_documents(num_docs, seed):
  """Documents of made-up words, each a list of sentences."""
  rng = np.random.default_rng(seed)
  words = _words(rng, 200)
  return [[' '.join(rng.choice(words, rng.integers(3, 12))).capitalize() + '.'
           for _ in range(rng.integers(3, 9))] for _ in range(num_docs)]


def _write_good(directory, num_docs, seed=0):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'good.txt'), 'w') as f:
    f.write('\n\n'.join('\n'.join(d) for d in _good_documents(num_docs, seed))
            + '\n')


def _huge_line(seed=1):
  rng = np.random.default_rng(seed)
  return ' '.join(rng.choice(_words(rng, 100), _HUGE_LINE_WORDS)).encode()


def _config(directory, corpus_dir, text_format='sentence_per_line',
            layout='nsp'):
  cfg = config_lib.base_config()
  cfg.seed = 5
  cfg.batch_size = 8
  cfg.data.corpus.source = 'files'
  cfg.data.corpus.path = str(corpus_dir)
  cfg.data.corpus.text_format = text_format
  cfg.data.data_dir = str(directory / 'data')
  cfg.data.tokenizer.vocab_size = 300
  cfg.data.eval_fraction = 0.2
  cfg.data.max_seq_length = 64
  cfg.data.layout = layout
  cfg.data.num_threads = 1
  cfg.data.prefetch_batches = 1
  cfg.masking.max_predictions_per_seq = 10
  cfg.eval.num_batches = 2
  if layout == 'full_sentences':
    cfg.objective.nsp_weight = 0.0
  return cfg


@pytest.fixture(scope='module')
def bad_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp('bad')
  _write_good(directory / 'corpus', 60)
  with open(directory / 'corpus' / 'bad.txt', 'wb') as f:
    f.write(_BAD_FILE + _huge_line() + b'\n\n' + b'x' * _NO_SPACE_RUN + b'\n')
  return directory


@pytest.fixture(scope='module')
def prepared(bad_dir):
  # The tokenizer is trained on the bad corpus too: the damage goes through
  # SentencePiece's trainer as well as its encoder.
  cfg = _config(bad_dir, bad_dir / 'corpus')
  return pretokenize.prepare(cfg.data, num_threads=1)


def _assert_batch_shapes(cfg, batch, vocab_size):
  for key, (shape, dtype) in pipeline.batch_spec(cfg).items():
    assert batch[key].shape == shape, key
    assert batch[key].dtype == dtype, key
  assert 0 <= batch['input_ids'].min() and (
      batch['input_ids'].max() < vocab_size)


# ---------------------------------------------------------------------------
# A corpus with every kind of damage trains.


def test_counts_are_exact(prepared):
  assert prepared.skipped == _BAD_FILE_SKIPPED
  assert set(prepared.skipped) == set(corpus_lib.SKIP_COUNTERS)
  num_documents = (prepared.train_index.num_documents +
                   prepared.eval_index.num_documents)
  assert num_documents == 60 + _BAD_FILE_DOCUMENTS


def test_short_and_long_documents_are_kept(prepared):
  records = [source[i] for source in (prepared.train_source,
                                      prepared.eval_source)
             for i in range(len(source))]
  sentences = [len(r['sentence_lengths']) for r in records]
  tokens = [len(r['token_ids']) for r in records]
  assert min(sentences) == 1 and min(tokens) <= 2  # "Lonely", "A".
  # The huge line is one document of pieces of at most MAX_SENTENCE_CHARS,
  # many longer than an instance.
  huge = int(np.argmax(sentences))
  assert sentences[huge] > _HUGE_LINE_WORDS * 3 // (
      corpus_lib.MAX_SENTENCE_CHARS)
  assert records[huge]['sentence_lengths'].max() > 64


@pytest.mark.parametrize('layout', _LAYOUTS)
def test_batches_from_the_bad_corpus(prepared, bad_dir, layout):
  cfg = _config(bad_dir, bad_dir / 'corpus', layout=layout)
  vocab_size = prepared.tokenizer.vocab_size
  # Enough batches to cross a training epoch (about 60 documents).
  for batch in itertools.islice(iter(pipeline.train_dataset(prepared, cfg)),
                                12):
    _assert_batch_shapes(cfg, batch, vocab_size)
  evals = pipeline.eval_batches(prepared, cfg)
  assert len(evals) >= 1
  for batch in evals:
    _assert_batch_shapes(cfg, batch, vocab_size)


def test_reused_data_reports_the_same_counts(prepared, bad_dir,
                                             monkeypatch):
  def no_reading(*args, **kwargs):
    raise AssertionError('the corpus was read again')

  monkeypatch.setattr(corpus_lib, 'read_documents', no_reading)
  again = pretokenize.prepare(
      _config(bad_dir, bad_dir / 'corpus').data, num_threads=1)
  assert again.directory == prepared.directory
  assert again.skipped == prepared.skipped


def test_same_input_same_bytes(prepared, bad_dir, tmp_path):
  cfg = _config(tmp_path, bad_dir / 'corpus')
  again = pretokenize.prepare(cfg.data, num_threads=1,
                              tokenizer=prepared.tokenizer)
  assert again.directory != prepared.directory
  assert again.skipped == prepared.skipped
  for a, b in ((prepared.train_source, again.train_source),
               (prepared.eval_source, again.eval_source)):
    assert len(a) == len(b)
    for i in range(len(a)):
      for key in pretokenize.FEATURES:
        assert a[i][key].tobytes() == b[i][key].tobytes(), (i, key)


def test_mixture_sums_its_components(prepared):
  both = mixture.MixturePrepared(('a', 'b'), (prepared, prepared),
                                 prepared.tokenizer, 0.7)
  assert both.skipped == {k: 2 * v for k, v in _BAD_FILE_SKIPPED.items()}


# ---------------------------------------------------------------------------
# Other formats.


def test_paragraphs_format(prepared, tmp_path):
  corpus_dir = tmp_path / 'corpus'
  corpus_dir.mkdir()
  for i, document in enumerate(_good_documents(12, seed=3)):
    (corpus_dir / f'good-{i:02d}.txt').write_text(' '.join(document))
  (corpus_dir / 'blank.txt').write_bytes(b' \n\n\t\n')  # 1 empty document.
  (corpus_dir / 'controls.txt').write_bytes(b'\x00\x07\x1b[1m\n\n\x0c\n')
  # ^ Empty once cleaned: a 2nd empty document, of 2 + 4 control characters
  #   (the form feed is whitespace).
  (corpus_dir / 'mixed.txt').write_bytes(
      b'Ka to ri.\x0cAn mel so.\n\nVu\x00 ne \xffpa. ' + _huge_line(2))
  # ^ Kept: 1 control character, 1 invalid byte in 1 line, a long sentence.
  cfg = _config(tmp_path, corpus_dir, text_format='paragraphs')
  cfg.data.eval_fraction = 0.3
  data = pretokenize.prepare(cfg.data, num_threads=1,
                             tokenizer=prepared.tokenizer)
  assert data.skipped == {
      'empty_documents': 2, 'empty_sentences': 0, 'invalid_utf8_bytes': 1,
      'invalid_utf8_lines': 1, 'control_characters': 7,
      'long_sentences_split': 1}
  assert (data.train_index.num_documents + data.eval_index.num_documents
          == 13)
  batch = next(iter(pipeline.train_dataset(data, cfg)))
  _assert_batch_shapes(cfg, batch, prepared.tokenizer.vocab_size)


def test_jsonl_surrogates_empty_records_and_long_annotated_text(prepared,
                                                                tmp_path):
  corpus_dir = tmp_path / 'corpus'
  corpus_dir.mkdir()
  long_text = _huge_line(3).decode()[:3 * corpus_lib.MAX_SENTENCE_CHARS]
  first_word = long_text.split(' ')[0]
  records = [{'text': ' '.join(d)} for d in _good_documents(12, seed=4)]
  records += [
      # Lone surrogates, from JSON escapes, cannot be encoded for
      # SentencePiece: removed, 2 control characters.
      {'text': 'Ka \ud800to ri. An mel \udfff so.'},
      {'text': ' \n '},                     # An empty document.
      {'sentences': ['Vu ne.', '', '\x1b[2J']},  # 2 empty sentences (the
      # escape: 4 characters).
      {'text': long_text,                   # A long sentence, cut.
       'spans': [[0, len(first_word), 'entity']]},
  ]
  with open(corpus_dir / 'data.jsonl', 'w') as f:
    for record in records:
      f.write(json.dumps(record) + '\n')  # ensure_ascii: \ud800 escapes.
  cfg = _config(tmp_path, corpus_dir, text_format='jsonl')
  cfg.data.eval_fraction = 0.3
  data = pretokenize.prepare(cfg.data, num_threads=1,
                             tokenizer=prepared.tokenizer)
  assert data.skipped == {
      'empty_documents': 1, 'empty_sentences': 2, 'invalid_utf8_bytes': 0,
      'invalid_utf8_lines': 0, 'control_characters': 2 + 4,
      'long_sentences_split': 1}
  long_document = list(corpus_lib.read_text_files(str(corpus_dir),
                                                  'jsonl'))[-1]
  assert long_document == corpus_lib.split_long_sentence(
      corpus_lib.clean_text(long_text))
  assert len(long_document) >= 3
  # The entity stays on the first piece's first word.
  assert long_document.spans[0] == [(0, len(first_word), 'entity')]
  batch = next(iter(pipeline.train_dataset(data, cfg)))
  _assert_batch_shapes(cfg, batch, prepared.tokenizer.vocab_size)


# ---------------------------------------------------------------------------
# Unusable input: a clear error before training.


def _write_unusable(corpus_dir):
  corpus_dir.mkdir(parents=True)
  (corpus_dir / 'a.txt').write_bytes(b'\n\n   \n\x00\x1b[0m\n\n')
  (corpus_dir / 'b.txt').write_bytes(b'\xff\xfe\n\n\x80\n')


def test_all_unusable_corpus_fails_in_prepare(prepared, tmp_path):
  corpus_dir = tmp_path / 'corpus'
  _write_unusable(corpus_dir)
  cfg = _config(tmp_path, corpus_dir)
  with pytest.raises(pretokenize.DataError,
                     match=r"corpus.path='.*corpus'.*no document has text.*"
                     r'empty_documents=6, empty_sentences=3, '
                     r'invalid_utf8_bytes=3, invalid_utf8_lines=2, '
                     r'control_characters=5'):
    pretokenize.prepare(cfg.data, num_threads=1,
                        tokenizer=prepared.tokenizer)


def test_all_unusable_corpus_fails_before_training_a_tokenizer(tmp_path):
  corpus_dir = tmp_path / 'corpus'
  _write_unusable(corpus_dir)
  cfg = _config(tmp_path, corpus_dir)
  with pytest.raises(corpus_lib.CorpusError, match='hold no text'):
    corpus_lib.validate(corpus_lib.CorpusSpec.from_config(cfg.data.corpus))
  with pytest.raises(pretokenize.DataError,
                     match=r"corpus.path='.*corpus'.*no text to train a "
                     r'tokenizer.*invalid_utf8_bytes=3'):
    pretokenize.prepare(cfg.data, num_threads=1)


@pytest.fixture(scope='module')
def tiny(prepared, tmp_path_factory):
  """A corpus of 6 short documents: fewer instances than a batch of 64."""
  directory = tmp_path_factory.mktemp('tiny')
  cfg = _config(directory, directory / 'corpus')
  _write_good(cfg.data.corpus.path, 6, seed=5)
  cfg.data.eval_fraction = 0.3
  cfg.batch_size = 64
  return cfg, pretokenize.prepare(cfg.data, num_threads=1,
                                  tokenizer=prepared.tokenizer)


@pytest.mark.parametrize('layout', _LAYOUTS)
def test_corpus_smaller_than_a_batch(tiny, layout):
  cfg, data = tiny
  cfg = copy.deepcopy(cfg)
  cfg.data.layout = layout
  documents = data.train_index.num_documents
  with pytest.raises(pretokenize.DataError,
                     match=rf'the split holds \d+ instances, from '
                     rf'{documents} documents .*fewer than one batch of '
                     r'batch_size=64. Use more text, or lower batch_size'):
    pipeline.train_dataset(data, cfg)
  with pytest.raises(pretokenize.DataError,
                     match='eval split has .* fewer than one batch of 64'):
    pipeline.eval_batches(data, cfg)
  # A batch it fills is fine.
  cfg.batch_size = 2
  next(iter(pipeline.train_dataset(data, cfg)))


def test_mixture_smaller_than_a_batch(tiny):
  cfg, data = tiny
  both = mixture.MixturePrepared(('a', 'b'), (data, data), data.tokenizer,
                                 0.7)
  with pytest.raises(pretokenize.DataError,
                     match=r'the 2 components of the mixture hold \d+ '
                     r'instances in all .*batch_size=64'):
    pipeline.train_dataset(both, cfg)


# ---------------------------------------------------------------------------
# Instances from degenerate documents; no quadratic text handling.


@pytest.mark.parametrize('layout', _LAYOUTS)
def test_instances_of_tiny_and_huge_documents(layout):
  max_seq_length = 32
  # One token, one sentence, sentences far longer than an instance.
  corpus = FakeCorpus([[1], [1], [1, 1], [500], [3, 400, 2], [7], [1]])
  builder = instances.InstanceBuilder(
      corpus.source, corpus.index,
      instances.InstanceConfig(layout, max_seq_length, 0.5), seed=0)
  for data_epoch in range(4):
    plan = builder.plan(data_epoch)
    if layout != 'full_sentences':  # Every document gives an instance.
      assert set(plan.document) == set(range(7))
    batch = builder.materialize_batch(plan, np.arange(len(plan)), data_epoch)
    lengths = batch['attention_mask'].sum(axis=1)
    assert lengths.max() <= max_seq_length and lengths.min() >= 3


def test_sentence_splitting_is_linear():
  # Every full stop follows an abbreviation, so no sentence ends: this took
  # time quadratic in the paragraph's length before.
  paragraph = 'Mr. Smith and Dr. Jones ' * 40_000  # About 1 MB.
  t0 = time.time()
  sentences = corpus_lib.split_sentences(paragraph)
  assert time.time() - t0 < 5
  assert all(len(s) <= corpus_lib.MAX_SENTENCE_CHARS for s in sentences)
  assert ' '.join(sentences) == paragraph.strip()


def test_split_long_sentence():
  limit = corpus_lib.MAX_SENTENCE_CHARS
  assert corpus_lib.split_long_sentence('a b') == ['a b']
  words = 'x' * (limit - 1) + ' ' + 'y' * 10 + ' ' + 'z' * (2 * limit + 5)
  counts = collections.Counter()
  pieces = corpus_lib.split_long_sentence(words, counts)
  # At the space while one fits; where none does, at the limit.
  assert [len(p) for p in pieces] == [limit - 1, 10, limit, limit, 5]
  assert counts == {'long_sentences_split': 1}
