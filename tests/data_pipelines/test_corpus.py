"""Tests for data_pipelines.corpus: readers, sentence splitting, validation."""

import collections
import glob
import itertools
import json
import os

import hypothesis
import numpy as np
from hypothesis import strategies as st
import pytest
import tensorflow_datasets as tfds

from data_pipelines import corpus
from data_pipelines.corpus import CorpusError, CorpusSpec


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(text, bytes):
    path.write_bytes(text)
  else:
    path.write_text(text, encoding='utf-8')
  return path


# ---------------------------------------------------------------------------
# Sentence splitting.


@pytest.mark.parametrize('paragraph, sentences', [
    ('The cat sat. The dog ran.', ['The cat sat.', 'The dog ran.']),
    ('Is it? Yes! Fine.', ['Is it?', 'Yes!', 'Fine.']),
    ('In 1990 it rained. 2000 was dry.', ['In 1990 it rained.',
                                          '2000 was dry.']),
    # Decimals and lower-case continuations never split.
    ('Prices rose 5.5 percent. It was odd.', ['Prices rose 5.5 percent.',
                                              'It was odd.']),
    ('see the list. then go.', ['see the list. then go.']),
    # Abbreviations.
    ('Dr. Smith went home. He slept.', ['Dr. Smith went home.', 'He slept.']),
    ('Mr. and Mrs. Jones arrived. They sat.',
     ['Mr. and Mrs. Jones arrived.', 'They sat.']),
    ('Use a tool, e.g. A hammer. Then stop.',
     ['Use a tool, e.g. A hammer.', 'Then stop.']),
    ('See Fig. 3 for details. It is clear.',
     ['See Fig. 3 for details.', 'It is clear.']),
    ('Acme Inc. Builds things. Really.', ['Acme Inc. Builds things.',
                                          'Really.']),
    ('(cf. Table 2) Fine. Done.', ['(cf. Table 2) Fine.', 'Done.']),
    # Initials.
    ('J. R. R. Tolkien wrote books. They sold.',
     ['J. R. R. Tolkien wrote books.', 'They sold.']),
    ('It was written by A. Turing. He was clever.',
     ['It was written by A. Turing.', 'He was clever.']),
    # Quotes and brackets after the full stop stay with the sentence.
    ('He said "Stop." Then he left.', ['He said "Stop."', 'Then he left.']),
    ("She wrote 'Never.' Then 'Yes.' Done.",
     ["She wrote 'Never.'", "Then 'Yes.'", 'Done.']),
    ('He said "Hi." "Bye," she said.', ['He said "Hi."', '"Bye," she said.']),
    ('It ended (finally.) Next came rain.',
     ['It ended (finally.)', 'Next came rain.']),
])
def test_split_sentences(paragraph, sentences):
  assert corpus.split_sentences(paragraph) == sentences


def test_split_sentences_normalizes_whitespace_and_controls():
  assert corpus.split_sentences('  One\x00 two.\n\n\tThree\x07  four.  ') == [
      'One two.', 'Three four.']
  assert corpus.split_sentences('') == []
  assert corpus.split_sentences(' \n\t\x01 ') == []


def test_split_sentences_keeps_every_character():
  paragraph = ('Dr. A. Smith (cf. Fig. 2) said "Yes." Then, e.g. Mrs. Jones '
               'left! Why? 42 is the answer. End')
  sentences = corpus.split_sentences(paragraph)
  assert ' '.join(sentences) == paragraph
  assert len(sentences) == 5


# ---------------------------------------------------------------------------
# Text files.


def test_sentence_per_line(tmp_path):
  _write(tmp_path / 'a.txt',
         'Doc one, sentence one.\nDoc one, sentence two.\n\n'
         'Doc two.\n\n\n\n'          # Several blank lines: one boundary.
         '  \t \n'                    # A whitespace-only line is blank too.
         'Doc three, first.\r\nDoc three, second.')  # No trailing newline.
  docs = list(corpus.read_text_files(str(tmp_path), 'sentence_per_line'))
  assert docs == [['Doc one, sentence one.', 'Doc one, sentence two.'],
                  ['Doc two.'],
                  ['Doc three, first.', 'Doc three, second.']]


def test_sentence_per_line_leading_blank_lines_and_files_in_order(tmp_path):
  _write(tmp_path / 'b.txt', 'From b.\n')
  _write(tmp_path / 'a.txt', '\n\n\nFrom a.\n\n')
  _write(tmp_path / 'sub' / 'c.txt', 'From c.\n')
  _write(tmp_path / '.hidden', 'Never read.\n')
  _write(tmp_path / '.ipynb_checkpoints' / 'a-checkpoint.txt', 'Nor this.\n')
  _write(tmp_path / 'sub' / '.git' / 'c.txt', 'Nor this.\n')
  docs = list(corpus.read_text_files(str(tmp_path), 'sentence_per_line'))
  # Sorted by path; a file's last document ends at the end of the file.
  assert docs == [['From a.'], ['From b.'], ['From c.']]


def test_sentence_per_line_keeps_lines_whole(tmp_path):
  _write(tmp_path / 'a.txt', 'Two sentences. On one line.\nNext   line.\n')
  docs = list(corpus.read_text_files(str(tmp_path / 'a.txt'),
                                     'sentence_per_line'))
  assert docs == [['Two sentences. On one line.', 'Next line.']]


def test_only_line_feeds_and_returns_end_lines(tmp_path):
  """A form feed, U+0085, U+2028 or U+2029 is within a line, as in
  google-research/bert's reader: it makes no blank line that ends a
  document, and JSON, which keeps them unescaped in a string, stays
  whole."""
  text = 'Page one\x0c\nends\x85 here.\u2028Still\u2029 one.'
  _write(tmp_path / 'a.txt', f'{text}\nNext.\n')
  _write(tmp_path / 'b.jsonl',
         json.dumps({'text': text}, ensure_ascii=False) + '\n')
  assert list(corpus.read_text_files(str(tmp_path / 'a.txt'),
                                     'sentence_per_line')) == [
                                         ['Page one', 'ends here. Still one.',
                                          'Next.']]
  assert list(corpus.read_text_files(str(tmp_path / 'b.jsonl'),
                                     'jsonl')) == [
                                         ['Page one ends here.', 'Still one.']]


# Lines ending in \n, \r\n and \r, a form feed within one, blank and
# whitespace-only lines, a control character, invalid UTF-8 and a multi-byte character.
_MIXED = (b'Doc one, first.\r\nDoc one, second.\n\n'
          b'Doc two \xff\xfe bytes.\rSame doc.\x0cAnd this.\n  \t\n'
          b'\x07\nDoc three: caf\xc3\xa9 na\xc3\xafve.\n\n\n')


def _compress(suffix: str, data: bytes) -> bytes:
  import bz2, gzip, zstandard  # pylint: disable=g-import-not-at-top,multiple-imports
  return {'': lambda d: d, '.gz': gzip.compress, '.bz2': bz2.compress,
          '.zst': zstandard.ZstdCompressor().compress}[suffix](data)


@pytest.mark.parametrize('block', [5, 1 << 20])
@pytest.mark.parametrize('text_format', ['sentence_per_line', 'jsonl'])
def test_compressed_files_read_as_the_plain_one(tmp_path, monkeypatch,
                                                text_format, block):
  """gzip, bz2 and zstd files stream to the same documents and counts as
  the plain file; blocks of lines (of any size, down to 5 bytes, less than
  a line) give what splitting the whole text into lines gave."""
  monkeypatch.setattr(corpus, '_READ_BLOCK', block)
  data = _MIXED if text_format == 'sentence_per_line' else b''.join(
      json.dumps({'text': line.decode('utf-8', 'replace')}).encode() + b'\n'
      for line in _MIXED.split(b'\n') if line.strip())
  results = []
  for suffix in ('', '.gz', '.bz2', '.zst'):
    _write(tmp_path / suffix.strip('.') / f'a.txt{suffix}',
           _compress(suffix, data))
    counts = collections.Counter()
    results.append((list(corpus.read_text_files(
        str(tmp_path / suffix.strip('.')), text_format, counts)), counts))
  assert all(r == results[0] for r in results[1:])
  docs, counts = results[0]
  if text_format == 'sentence_per_line':
    # The whole text, split at once, as the reader did before it streamed.
    lines = corpus.split_lines(corpus._decode_utf8(_MIXED))  # pylint: disable=protected-access
    whole = [corpus.parse_document(('lines', raw)) for raw in
             corpus._line_documents(lines, collections.Counter())]  # pylint: disable=protected-access
    assert docs == whole and len(docs) == 3
    assert counts['invalid_utf8_bytes'] == 2
    assert counts['invalid_utf8_lines'] == 1


def test_directories_are_read_recursively_compressed_or_not(tmp_path):
  _write(tmp_path / 'b' / 'deep' / 'c.txt.gz', _compress('.gz', b'From c.\n'))
  _write(tmp_path / 'a.txt.zst', _compress('.zst', b'From a.\n'))
  _write(tmp_path / 'b' / 'b.txt.bz2', _compress('.bz2', b'From b.\n'))
  docs = list(corpus.read_text_files(str(tmp_path), 'sentence_per_line'))
  assert docs == [['From a.'], ['From b.'], ['From c.']]
  spec = CorpusSpec(source='files', path=str(tmp_path))
  corpus.validate(spec)   # Finds text in the compressed files.


def test_validate_finds_text_past_a_files_head(tmp_path):
  """validate reads the heads of files first; text only after 1 MiB of
  blank lines is still found."""
  _write(tmp_path / 'a.txt', b'\n' * (corpus._VALIDATED_BYTES + 10)  # pylint: disable=protected-access
         + b'Late text.\n')
  corpus.validate(CorpusSpec(source='files', path=str(tmp_path)))
  _write(tmp_path / 'a.txt', b'\n' * (corpus._VALIDATED_BYTES + 10))  # pylint: disable=protected-access
  with pytest.raises(CorpusError, match='hold no text'):
    corpus.validate(CorpusSpec(source='files', path=str(tmp_path)))


def test_glob_path(tmp_path):
  _write(tmp_path / 'x' / 'a.txt', 'A.\n')
  _write(tmp_path / 'x' / 'b.md', 'B.\n')
  _write(tmp_path / 'y' / 'c.txt', 'C.\n')
  docs = list(corpus.read_text_files(str(tmp_path / '**' / '*.txt'),
                                     'sentence_per_line'))
  assert docs == [['A.'], ['C.']]


def test_paragraphs_file_is_one_document(tmp_path):
  _write(tmp_path / 'a.txt',
         'First paragraph. It is wrapped\nover two lines.\n\n'
         'Second paragraph! Short.\n \n\n'
         'Third.')
  _write(tmp_path / 'b.txt', 'Another file. Another document.')
  _write(tmp_path / 'c.txt', '\n\n  \n')  # No text: no document.
  docs = list(corpus.read_text_files(str(tmp_path), 'paragraphs'))
  assert docs == [
      ['First paragraph.', 'It is wrapped over two lines.',
       'Second paragraph!', 'Short.', 'Third.'],
      ['Another file.', 'Another document.']]


@pytest.mark.parametrize('text_format', ['sentence_per_line', 'paragraphs'])
def test_invalid_utf8_and_control_characters(tmp_path, text_format):
  _write(tmp_path / 'bad.txt',
         b'Good start.\nBad \xff\xfe bytes \xc3 here.\n'
         b'Bell\x07 and nul\x00 and esc\x1b and del\x7f.\n\n'
         b'\x80\x81\n\nLast document.\n')
  docs = list(corpus.read_text_files(str(tmp_path), text_format))
  assert docs
  for doc in docs:
    for sentence in doc:
      assert sentence == sentence.strip()
      assert not any(c in sentence for c in '\x00\x07\x1b\x7f\n\t')
  text = ' '.join(s for doc in docs for s in doc)
  assert '\ufffd' in text  # Bad bytes become the replacement character.
  # Control characters become spaces, collapsed with their neighbours.
  assert 'Bell and nul and esc and del .' in text
  assert 'Last document.' in text
  corpus.validate(CorpusSpec(source='files', path=str(tmp_path),
                             text_format=text_format))


def test_read_documents_max_documents(tmp_path):
  _write(tmp_path / 'a.txt', 'One.\n\nTwo.\n\nThree.\n')
  spec = CorpusSpec(source='files', path=str(tmp_path), max_documents=2)
  assert list(corpus.read_documents(spec)) == [['One.'], ['Two.']]


def test_spec_from_config():
  import ml_collections  # pylint: disable=g-import-not-at-top
  cfg = ml_collections.ConfigDict(dict(
      source='tfds', path='', text_format='paragraphs', tfds_name='x:text',
      tfds_split='train[:10]', tfds_data_dir='', max_documents=3))
  spec = CorpusSpec.from_config(cfg)
  assert spec == CorpusSpec(source='tfds', text_format='paragraphs',
                            tfds_name='x:text', tfds_split='train[:10]',
                            tfds_data_dir=None, max_documents=3)


# ---------------------------------------------------------------------------
# Validation.


def _error(spec) -> str:
  with pytest.raises(CorpusError) as e:
    corpus.validate(spec)
  return str(e.value)


def test_validate_accepts_a_good_corpus(tmp_path):
  _write(tmp_path / 'a.txt', 'Hello.\n')
  corpus.validate(CorpusSpec(source='files', path=str(tmp_path)))
  corpus.validate(CorpusSpec(source='embedded'))


def test_validate_missing_path(tmp_path):
  missing = str(tmp_path / 'nope')
  message = _error(CorpusSpec(source='files', path=missing))
  assert missing in message
  assert 'matches no files' in message


def test_validate_no_path():
  assert 'corpus.path' in _error(CorpusSpec(source='files', path=''))


def test_validate_empty_directory(tmp_path):
  (tmp_path / 'empty').mkdir()
  message = _error(CorpusSpec(source='files', path=str(tmp_path / 'empty')))
  assert 'matches no files' in message


def test_validate_glob_matching_nothing(tmp_path):
  _write(tmp_path / 'a.txt', 'Hello.\n')
  message = _error(CorpusSpec(source='files', path=str(tmp_path / '*.json')))
  assert '*.json' in message


def test_validate_whitespace_only_files(tmp_path):
  _write(tmp_path / 'a.txt', '  \n\n\t\n')
  _write(tmp_path / 'b.txt', '\x00\x01\n \r\n')
  message = _error(CorpusSpec(source='files', path=str(tmp_path)))
  assert 'hold no text' in message
  assert '2 files' in message


def test_validate_refuses_files_that_are_not_text(tmp_path):
  """A PDF or an image among the text (its head mostly invalid UTF-8), or
  UTF-16 text (half NUL bytes), is refused by name; text with a stray NUL
  or bad byte is not (the reader repairs those)."""
  _write(tmp_path / 'a.txt', b'Some text.\x00 More\xff text.\n' * 10)
  corpus.validate(CorpusSpec(source='files', path=str(tmp_path)))
  rng = np.random.default_rng(0)
  _write(tmp_path / 'b.pdf', b'%PDF-1.7\n' + rng.bytes(4096))
  message = _error(CorpusSpec(source='files', path=str(tmp_path)))
  assert "1 file(s) that are not text (e.g. '" in message, message
  assert message.split("e.g. '")[1].startswith(str(tmp_path / 'b.pdf'))
  os.remove(tmp_path / 'b.pdf')
  _write(tmp_path / 'c.txt', ('UTF-16 text.\n' * 20).encode('utf-16'))
  assert 'c.txt' in _error(CorpusSpec(source='files', path=str(tmp_path)))


def test_validate_bad_source():
  message = _error(CorpusSpec(source='wikipedia'))
  assert "'wikipedia'" in message
  for source in corpus.SOURCES:
    assert source in message


def test_validate_bad_text_format(tmp_path):
  _write(tmp_path / 'a.txt', 'Hello.\n')
  message = _error(CorpusSpec(source='files', path=str(tmp_path),
                              text_format='csv'))
  assert "'csv'" in message
  for text_format in corpus.TEXT_FORMATS:
    assert text_format in message


def test_validate_negative_max_documents():
  assert 'max_documents' in _error(CorpusSpec(max_documents=-1))


@pytest.mark.parametrize('name', ['wikipedia', 'text:', ':text', ''])
def test_validate_bad_tfds_name(name):
  message = _error(CorpusSpec(source='tfds', tfds_name=name))
  assert 'name[/config]' in message


def test_validate_unprepared_tfds_dataset(tmp_path):
  message = _error(CorpusSpec(source='tfds', tfds_name='no_such_dataset:text',
                              tfds_data_dir=str(tmp_path)))
  assert 'no_such_dataset' in message
  assert 'array_record' in message


# ---------------------------------------------------------------------------
# Fingerprints.


def test_fingerprint_changes_when_a_file_changes(tmp_path):
  f = _write(tmp_path / 'a.txt', 'Hello.\n')
  spec = CorpusSpec(source='files', path=str(tmp_path))
  fp0 = corpus.fingerprint(spec)
  assert corpus.fingerprint(spec) == fp0
  _write(f, 'Hello, world.\n')  # A new size.
  fp1 = corpus.fingerprint(spec)
  assert fp1 != fp0
  st = os.stat(f)
  os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # Same size.
  fp2 = corpus.fingerprint(spec)
  assert fp2 not in (fp0, fp1)
  _write(tmp_path / 'b.txt', 'More.\n')  # A new file.
  fp3 = corpus.fingerprint(spec)
  assert fp3 not in (fp0, fp1, fp2)


def test_fingerprint_depends_on_the_spec(tmp_path):
  _write(tmp_path / 'a.txt', 'Hello.\n')
  a = CorpusSpec(source='files', path=str(tmp_path))
  b = CorpusSpec(source='files', path=str(tmp_path), text_format='paragraphs')
  c = CorpusSpec(source='files', path=str(tmp_path), max_documents=5)
  assert len({corpus.fingerprint(s) for s in (a, b, c)}) == 3


# ---------------------------------------------------------------------------
# The embedded corpus.


def test_embedded_documents():
  docs = list(itertools.islice(corpus.embedded_documents(), 100))
  assert len(docs) == 100
  sentences = [s for doc in docs for s in doc]
  assert all(doc for doc in docs)
  assert all(s and s == s.strip() and '\n' not in s for s in sentences)
  assert len(sentences) > 1000
  # Prose, not code: mostly letters and spaces.
  text = ' '.join(sentences)
  assert sum(c.isalpha() or c == ' ' for c in text) / len(text) > 0.85
  # Deterministic.
  assert list(itertools.islice(corpus.embedded_documents(), 100)) == docs


def test_embedded_read_documents_respects_max_documents():
  spec = CorpusSpec(source='embedded', max_documents=7)
  assert len(list(corpus.read_documents(spec))) == 7


# ---------------------------------------------------------------------------
# TFDS.

_TFDS_TEXTS = (
    'First doc. It has two sentences.\nA second paragraph here.',
    '',                                # No text: no document.
    'Another one! Yes.',
    'Bad \ufffd char and \x07bell. Fine.',
)


class TinyTextCorpus(tfds.core.GeneratorBasedBuilder):
  """A four-record text dataset built in the test's temporary directory."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({'text': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples()}

  def _generate_examples(self):
    for i, text in enumerate(_TFDS_TEXTS):
      yield i, {'text': text}


@pytest.fixture(scope='module')
def tfds_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('tfds')
  TinyTextCorpus(data_dir=str(data_dir),
                 file_format='array_record').download_and_prepare()
  return str(data_dir)


def test_tfds_corpus(tfds_dir):
  spec = CorpusSpec(source='tfds', tfds_name='tiny_text_corpus:text',
                    tfds_data_dir=tfds_dir)
  corpus.validate(spec)
  docs = list(corpus.read_documents(spec))
  # TFDS stores records in its own (deterministic) order.
  assert sorted(docs) == sorted([
      ['First doc.', 'It has two sentences.', 'A second paragraph here.'],
      ['Another one!', 'Yes.'],
      ['Bad \ufffd char and bell.', 'Fine.'],
  ])
  assert list(corpus.read_documents(spec)) == docs
  fp = corpus.fingerprint(spec)
  assert fp == corpus.fingerprint(spec)
  assert fp != corpus.fingerprint(
      CorpusSpec(source='tfds', tfds_name='tiny_text_corpus:text',
                 tfds_data_dir=tfds_dir, max_documents=1))
  # Rebuilt with as many records: another corpus (its files are new).
  record, = glob.glob(os.path.join(tfds_dir, '*', '*', '*.array_record*'))
  times = os.stat(record)
  os.utime(record, ns=(times.st_atime_ns, times.st_mtime_ns + 10**9))
  try:
    assert corpus.fingerprint(spec) != fp
  finally:
    os.utime(record, ns=(times.st_atime_ns, times.st_mtime_ns))
  assert corpus.fingerprint(spec) == fp


def test_tfds_corpus_with_version(tfds_dir):
  spec = CorpusSpec(source='tfds', tfds_name='tiny_text_corpus:1.0.0:text',
                    tfds_data_dir=tfds_dir, max_documents=2)
  corpus.validate(spec)
  assert len(list(corpus.read_documents(spec))) == 2


def test_tfds_missing_feature(tfds_dir):
  message = _error(CorpusSpec(source='tfds',
                              tfds_name='tiny_text_corpus:body',
                              tfds_data_dir=tfds_dir))
  assert "no feature 'body'" in message
  assert "'text'" in message


def test_tfds_missing_split(tfds_dir):
  message = _error(CorpusSpec(source='tfds',
                              tfds_name='tiny_text_corpus:text',
                              tfds_split='validation',
                              tfds_data_dir=tfds_dir))
  assert "'validation'" in message


# ---------------------------------------------------------------------------
# JSON Lines with annotations.


def _jsonl(tmp_path, *records, name='docs.jsonl'):
  lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)
           for r in records]
  return _write(tmp_path / name, '\n'.join(lines) + '\n')


def _read_jsonl(tmp_path, *records):
  _jsonl(tmp_path, *records)
  return list(corpus.read_text_files(str(tmp_path), 'jsonl'))


def _marked(document):
  """Per sentence, the (text, kind) of each span."""
  return [[(sentence[a:b], kind) for a, b, kind in spans]
          for sentence, spans in zip(document, document.spans)]


def test_jsonl_text_with_character_and_token_spans(tmp_path):
  text = ('Barack  Obama was born in Hawaii. He was the U.S. president.'
          '\n\nNew paragraph here.')
  [doc] = _read_jsonl(tmp_path, {
      'id': 7,  # Other keys are ignored.
      'text': text,
      'spans': [[text.index('Barack'), text.index(' was'), 'entity'],
                [text.index('Hawaii'), text.index('. He'), 'entity']],
      'token_spans': [[7, 10, 'phrase']]})
  assert list(doc) == ['Barack Obama was born in Hawaii.',
                       'He was the U.S. president.', 'New paragraph here.']
  assert _marked(doc) == [[('Barack Obama', 'entity'), ('Hawaii', 'entity')],
                          [('was the U.S.', 'phrase')], []]


def test_jsonl_sentences_with_word_segmentation(tmp_path):
  [doc] = _read_jsonl(tmp_path, {
      'sentences': ['我喜欢北京', '  two   words ', ''],
      'spans': [[0, 1, 'word'], [1, 3, 'word'], [3, 5, 'entity'],
                [8, 19, 'word']]})
  assert list(doc) == ['我喜欢北京', 'two words']
  assert _marked(doc) == [[('我', 'word'), ('喜欢', 'word'), ('北京', 'entity')],
                          [('two words', 'word')]]


def test_jsonl_unannotated_documents_have_empty_spans(tmp_path):
  docs = _read_jsonl(tmp_path, {'text': 'One. Two.'}, '', {'sentences': ['A']})
  assert [list(d) for d in docs] == [['One.', 'Two.'], ['A']]
  assert [d.spans for d in docs] == [[[], []], [[]]]


def test_jsonl_sentence_boundary_inside_a_span_is_dropped(tmp_path):
  text = 'He met the Acme Corp. Board today. Then left.'
  [doc] = _read_jsonl(tmp_path, {
      'text': text,
      'spans': [[text.index('Acme'), text.index(' today'), 'entity']]})
  assert list(doc) == ['He met the Acme Corp. Board today.', 'Then left.']
  assert _marked(doc)[0] == [('Acme Corp. Board', 'entity')]
  # Without the span, the splitter cuts after "Corp.".
  [plain] = _read_jsonl(tmp_path, {'text': text})
  assert len(plain) == 3


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    words=st.lists(st.text('abcXY.é北', min_size=1, max_size=6), min_size=1,
                   max_size=30),
    gaps=st.lists(st.sampled_from([' ', '  ', '\t', ' \n ', '\x07 ']),
                  min_size=30, max_size=30),
    picks=st.lists(st.tuples(st.integers(0, 29), st.integers(1, 4)),
                   max_size=5))
def test_jsonl_spans_follow_their_text_through_cleaning(words, gaps, picks):
  # A span over whole words keeps its text, cleaned like the sentence.
  text, bounds = '', []
  for word, gap in zip(words, gaps):
    bounds.append((len(text), len(text) + len(word)))
    text += word + gap
  spans = []
  for first, count in picks:
    first = first % len(words)
    last = min(first + count, len(words)) - 1
    spans.append([bounds[first][0], bounds[last][1], 'entity'])
  doc = corpus._jsonl_document(  # pylint: disable=protected-access
      {'sentences': [text], 'spans': spans}, 'test')
  assert list(doc) == [corpus.clean_text(text)]
  got = sorted(doc[0][a:b] for a, b, _ in doc.spans[0])
  assert got == sorted(corpus.clean_text(text[a:b]) for a, b, _ in spans)


@pytest.mark.parametrize('line, complaint', [
    ('{"text": "x"', 'not JSON'),
    ('[1, 2]', 'JSON list'),
    ('{"text": "x", "sentences": ["x"]}', 'exactly one'),
    ('{"sentences": "x"}', 'not a list of strings'),
    ('{"text": 3}', 'not a string'),
    ('{"text": "abc", "spans": [[0, 9, "entity"]]}', 'outside the text'),
    ('{"text": "abc", "spans": [[0, 2, "person"]]}', 'is not [start, end'),
    ('{"text": "a b", "token_spans": [[1, 3, "entity"]]}', 'outside the 2'),
    ('{"text": "abc", "spans": [[0, 2, "word"], [1, 3, "word"]]}',
     'overlap'),
    ('{"sentences": ["ab", "cd"], "spans": [[1, 4, "entity"]]}',
     'crosses a sentence boundary'),
])
def test_jsonl_errors_name_the_line(tmp_path, line, complaint):
  _jsonl(tmp_path, {'text': 'A fine first line.'}, '', line)
  spec = CorpusSpec(source='files', path=str(tmp_path), text_format='jsonl')
  message = _error(spec)   # validate() reads the records up front.
  assert 'docs.jsonl:3' in message
  assert complaint in message
  assert '"text"' in message and 'kind' in message  # Says what to write.


def test_the_tokenizer_sample_reaches_the_last_file(tmp_path, monkeypatch):
  """With room for a tenth of the corpus's sentences, the tokenizer trains
  on a sample of all the files, not on the first ones."""
  from bertjax import config_lib  # pylint: disable=g-import-not-at-top
  from data_pipelines import pretokenize  # pylint: disable=g-import-not-at-top
  from data_pipelines import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  for f in range(10):
    _write(tmp_path / 'corpus' / f'{f}.txt', ''.join(
        f'File {f} sentence {i}.\n' for i in range(50)))
  data = config_lib.base_config().data
  data.corpus.source, data.corpus.path = 'files', str(tmp_path / 'corpus')
  data.data_dir, data.tokenizer.max_sentences = str(tmp_path / 'data'), 50
  data.tokenizer.vocab_size = 60
  seen = []
  real_train = tokenizer_lib.train
  monkeypatch.setattr(tokenizer_lib, 'train', lambda sentences, *a, **k: (
      seen.extend(sentences), real_train(seen, *a, **k))[1])
  spec = CorpusSpec.from_config(data.corpus)
  pretokenize.load_or_train_tokenizer(data, spec, corpus.fingerprint(spec))
  assert len(seen) == 50
  assert any(s.startswith('File 9 ') for s in seen)
  assert len({s.split()[1] for s in seen}) >= 8   # From most files.
