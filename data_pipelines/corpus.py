"""Corpus readers: text files, TFDS text datasets, and the embedded default.

Every reader yields documents, each a list of sentences (``list[str]``), in a
deterministic order. Document boundaries are kept: next-sentence prediction
draws its negatives from other documents, and packing marks the boundaries.

Documents read from JSON Lines (``text_format='jsonl'``) may carry
annotations: character or token spans that mark entities and phrases (the
units of ERNIE-style masking) or the user's own word segmentation (the units
of whole-word masking, e.g. for Chinese). They arrive as ``Document.spans``,
per sentence, in the offsets of the cleaned sentence text.

Readers are cheap to validate (``validate``) before anything expensive runs,
so a missing or empty corpus fails before a tokenizer is trained or a
directory is written.

Bad text never ends a run: invalid UTF-8 is replaced, control characters are
removed, sentences too long to tokenize cheaply are cut into pieces and
documents with no text are dropped. Readers count each repair in the
``counts`` they are given (keys and meanings in ``SKIP_COUNTERS``), and
pre-tokenization stores the counts with the data
(``pretokenize.PreparedData.skipped``).
"""

from __future__ import annotations

import ast
import bisect
import bz2
import collections
import dataclasses
import gzip
import hashlib
import inspect
import io
import itertools
import json
import os
import re
import sysconfig
import warnings
from typing import BinaryIO, Iterable, Iterator, Sequence

import numpy as np
import zstandard

from bertjax import errors
from bertjax import storage

SOURCES = ('embedded', 'files', 'tfds')
TEXT_FORMATS = ('sentence_per_line', 'paragraphs', 'jsonl')
# Annotation kinds: units for entity/phrase masking, and words.
SPAN_KINDS = ('entity', 'phrase', 'word')
# JSON Lines records checked by ``validate`` before any expensive work.
_VALIDATED_JSONL_RECORDS = 10_000


class Document(list):
  """A document: a list of sentences, optionally with annotations.

  Attributes:
    spans: None (no annotations), or one list per sentence of
      ``(start, end, kind)``: character offsets into that sentence (end
      exclusive), ``kind`` one of ``SPAN_KINDS``, sorted by start.
  """

  def __init__(self, sentences: Sequence[str] = (),
               spans: list[list[tuple[int, int, str]]] | None = None):
    super().__init__(sentences)
    self.spans = spans

# A sentence ends at . ! or ? (optionally followed by closing quotes or
# brackets) when whitespace and an upper-case letter, digit or opening quote
# follow. Abbreviations below do not end sentences.
_SENTENCE_END = re.compile(r'([.!?]["\')\]]*)\s+(?=["\'(\[]?[A-Z0-9])')
_ABBREVIATIONS = frozenset(
    'e.g i.e etc vs cf mr mrs ms dr prof sr jr st no fig eq al approx '
    'resp dept est inc ltd co jan feb mar apr jun jul aug sep sept oct nov '
    'dec'.split())
# What cleaning removes: control characters other than whitespace (the
# whitespace ones, \x0b-\x0d \x1c-\x1f \x85, become spaces like any other),
# ANSI escape sequences whole (terminal colours in logs), and lone surrogates,
# which JSON escapes can produce and which cannot be encoded for SentencePiece.
_REMOVED = re.compile(r'\x1b\[[0-?]*[ -/]*[@-~]|'
                      r'[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ud800-\udfff]')
_SPACES = re.compile(r'\s+')
# Bytes that are not UTF-8, as decoded with errors='surrogateescape'.
_ESCAPED_BYTE = re.compile(r'[\udc80-\udcff]')
# Longer sentences are cut into pieces of at most this many characters, at a
# space where there is one, so that tokenizing one is cheap (a 20 MB line
# with no full stop is one "sentence") and SentencePiece's trainer, which
# skips sentences over 4192 bytes, keeps the pieces of any script of up to 2
# bytes a character. Far above real sentences (the embedded corpus's longest
# has 1410 characters) and above what one instance holds at 512 tokens.
MAX_SENTENCE_CHARS = 2048
# What reading and pre-tokenizing skip or repair, counted over a corpus, and
# what each count means (``pretokenize.PreparedData.skipped`` has them all).
SKIP_COUNTERS = {
    'empty_documents':
        'documents with no text, dropped: in sentence_per_line a blank line '
        'that ends no sentence (one after another, or at the start of a '
        'file) or a document whose every line is empty after cleaning; a '
        'file (paragraphs) or record (jsonl, tfds) with no text; a document '
        'none of whose sentences has a token',
    'empty_sentences':
        'sentences (lines) with no text after cleaning, or with no token '
        '(e.g. only U+FFFD or zero-width characters, which SentencePiece '
        'removes), dropped',
    'invalid_utf8_bytes': 'bytes that are not UTF-8, each read as U+FFFD',
    'invalid_utf8_lines': 'lines that hold invalid UTF-8',
    'control_characters':
        'characters that cleaning removed: control characters other than '
        'whitespace, lone surrogates, and each character of an ANSI escape '
        'sequence',
    'long_sentences_split':
        f'sentences longer than {MAX_SENTENCE_CHARS} characters, each cut '
        'into pieces that are sentences of their own',
}


class CorpusError(errors.UserError, ValueError):
  """The corpus cannot be read; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Where the text comes from. Built from the config's ``corpus`` section.

  Attributes:
    source: 'embedded' (the Python standard library's documentation), 'files'
      (``path`` is a directory, a file or a glob), or 'tfds' (``tfds_name`` is
      ``name[/config][:version]:feature``, e.g. ``wikipedia/20230601.en:text``).
    path: for 'files': a directory (read recursively), a file or a glob
      (``**`` recurses). Files ending in ``.gz``, ``.bz2``, ``.zst`` or
      ``.zstd`` are decompressed as they are read.
    text_format: for 'files': 'sentence_per_line' (google-research/bert's
      format: one sentence per line, a blank line between documents; read
      a line at a time, so a file of any size streams), 'paragraphs' (each
      file is one document of free text; paragraphs are split into
      sentences by a rule-based splitter) or 'jsonl' (a record per line,
      streamed).
    tfds_name: for 'tfds'.
    tfds_split: for 'tfds'.
    tfds_data_dir: for 'tfds'; None means TFDS's default.
    max_documents: keep only the first N documents (0 = all): of a
      'files' or 'tfds' corpus, as the format delimits them (a document
      that turns out to hold no text counts, and is skipped).
  """
  source: str = 'embedded'
  path: str = ''
  text_format: str = 'sentence_per_line'
  tfds_name: str = ''
  tfds_split: str = 'train'
  tfds_data_dir: str | None = None
  max_documents: int = 0

  @classmethod
  def from_config(cls, cfg) -> 'CorpusSpec':
    return cls(
        source=cfg.source, path=cfg.path, text_format=cfg.text_format,
        tfds_name=cfg.tfds_name, tfds_split=cfg.tfds_split,
        tfds_data_dir=cfg.tfds_data_dir or None,
        max_documents=cfg.max_documents)


# ---------------------------------------------------------------------------
# Text normalisation and sentence splitting.


def clean_text(text: str,
               counts: collections.Counter | None = None) -> str:
  """Removes control characters, ANSI escape sequences and lone surrogates,
  and collapses whitespace to single spaces.

  Each removed character is counted in ``counts['control_characters']`` (an
  escape sequence counts all of its characters).
  """
  if counts is None:
    text = _REMOVED.sub(' ', text)
  else:
    removed = _REMOVED.findall(text)  # Usually none: one scan, no copy.
    if removed:
      counts['control_characters'] += sum(map(len, removed))
      text = _REMOVED.sub(' ', text)
  return _SPACES.sub(' ', text).strip()


def split_sentences(paragraph: str,
                    counts: collections.Counter | None = None) -> list[str]:
  """Splits a paragraph of prose into sentences with a rule-based splitter.

  A sentence longer than ``MAX_SENTENCE_CHARS`` comes back in pieces
  (``split_long_sentence``).
  """
  paragraph = clean_text(paragraph, counts)
  return [piece for a, b in _sentence_bounds(paragraph)
          for piece in split_long_sentence(paragraph[a:b], counts)]


def split_long_sentence(sentence: str,
                        counts: collections.Counter | None = None
                        ) -> list[str]:
  """A cleaned sentence in pieces of at most ``MAX_SENTENCE_CHARS``.

  Each piece ends at the last space that keeps it within the limit, or at
  the limit where there is none (a run of text with no space). A sentence
  that is cut counts once in ``counts['long_sentences_split']``.
  """
  return [sentence[a:b] for a, b in _long_sentence_bounds(sentence, counts)]


def _long_sentence_bounds(sentence: str,
                          counts: collections.Counter | None = None
                          ) -> list[tuple[int, int]]:
  """[start, end) of each piece of ``split_long_sentence``; linear time."""
  if len(sentence) <= MAX_SENTENCE_CHARS:
    return [(0, len(sentence))]
  if counts is not None:
    counts['long_sentences_split'] += 1
  bounds, start = [], 0
  while len(sentence) - start > MAX_SENTENCE_CHARS:
    limit = start + MAX_SENTENCE_CHARS
    space = sentence.rfind(' ', start + 1, limit + 1)
    end = space if space > start else limit
    bounds.append((start, end))
    start = end + 1 if sentence[end] == ' ' else end
  bounds.append((start, len(sentence)))
  return bounds


def _sentence_bounds(paragraph: str) -> list[tuple[int, int]]:
  """[start, end) of each sentence of a cleaned paragraph; linear time."""
  bounds, start = [], 0
  for match in _SENTENCE_END.finditer(paragraph):
    end = match.end(1)
    # The word before the full stop; found from the end, as slicing from
    # ``start`` would copy a paragraph of many abbreviations quadratically.
    word_start = max(start, paragraph.rfind(' ', start, end) + 1)
    last_word = paragraph[word_start:end].rstrip('.!?"\')]')
    if last_word.lower().lstrip('("\'[') in _ABBREVIATIONS:
      continue
    if len(last_word) == 1 and last_word.isalpha():  # An initial: "J. Smith".
      continue
    bounds.append((start, end))
    start = match.end()
  bounds.append((start, len(paragraph)))
  return [(a, b) for a, b in bounds if a < b]


def _clean_with_map(text: str) -> tuple[str, np.ndarray]:
  """``clean_text(text)`` and, per character of it, its offset in ``text``.

  A space that replaced a run of whitespace maps to the run's first
  character, so the map is increasing and ``searchsorted`` converts offsets.
  """
  # Same length: offsets are kept.
  text = _REMOVED.sub(lambda m: ' ' * len(m.group()), text)
  words = [m.span() for m in re.finditer(r'\S+', text)]
  if not words:
    return '', np.zeros(0, np.int64)
  pieces = []
  for i, (a, b) in enumerate(words):
    if i:
      pieces.append([words[i - 1][1]])
    pieces.append(np.arange(a, b))
  cleaned = ' '.join(text[a:b] for a, b in words)
  return cleaned, np.concatenate(pieces).astype(np.int64)


def _paragraphs_to_document(paragraphs: Sequence[str],
                            counts: collections.Counter | None = None
                            ) -> Document:
  return [s for p in paragraphs for s in split_sentences(p, counts)]


# ---------------------------------------------------------------------------
# (a) Text files.


def _expand_files(path: str) -> dict[str, storage.Stat]:
  """{file: its ``storage.Stat``} of a directory (recursively; hidden
  files and what is in hidden directories, such as ``.git`` or
  ``.ipynb_checkpoints``, skipped), a file or a glob, local or in a
  bucket, sorted."""
  found = storage.find(path)
  if storage.isdir(path):
    root = path.rstrip('/') + '/'
    found = {f: v for f, v in found.items() if not any(
        part.startswith('.') for part in f[len(root):].split('/'))}
  return found


def _decode_utf8(data: bytes, counts: collections.Counter | None = None
                ) -> str:
  """``data`` as UTF-8, each invalid sequence replaced by U+FFFD.

  Invalid UTF-8 is replaced, not fatal: one bad byte must not end a run.
  The invalid bytes are counted in ``counts['invalid_utf8_bytes']`` and the
  lines that hold them in ``counts['invalid_utf8_lines']``.
  """
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError:
    pass
  if counts is not None:
    # Each invalid byte escapes to its own lone surrogate: exact counts,
    # which U+FFFD (also a valid character of its own) could not give.
    escaped = data.decode('utf-8', errors='surrogateescape')
    counts['invalid_utf8_bytes'] += len(_ESCAPED_BYTE.findall(escaped))
    counts['invalid_utf8_lines'] += sum(
        1 for line in escaped.splitlines() if _ESCAPED_BYTE.search(line))
  return data.decode('utf-8', errors='replace')


# File name endings read through a decompressor, and fsspec's names of
# the decompressors (for files in a bucket).
_CODECS = {'.gz': 'gzip', '.bz2': 'bz2', '.zst': 'zstd', '.zstd': 'zstd'}
COMPRESSED = tuple(_CODECS)


def open_binary(file: str) -> BinaryIO:
  """``file`` (local or in a bucket) for reading bytes, decompressed as a
  stream if its name ends in one of ``COMPRESSED``."""
  if storage.is_remote(file):
    return storage.open(file, 'rb', compression=_CODECS.get(
        os.path.splitext(file)[1]))
  if file.endswith('.gz'):
    return gzip.open(file, 'rb')
  if file.endswith('.bz2'):
    return bz2.open(file, 'rb')
  if file.endswith(('.zst', '.zstd')):
    raw = open(file, 'rb')  # pylint: disable=consider-using-with
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(
        raw, closefd=True))
  return open(file, 'rb')  # pylint: disable=consider-using-with


def read_text(file: str, counts: collections.Counter | None = None) -> str:
  """The whole of ``file`` (decompressed), as text."""
  with open_binary(file) as f:
    return _decode_utf8(f.read(), counts)


_READ_BLOCK = 1 << 20


# Where a line ends: as Python's universal newlines and google-research/bert's
# reader have it. Not str.splitlines's others (form feed, U+0085, U+2028,
# ...): JSON keeps U+2028 unescaped inside a string, and web text has U+0085
# for an ellipsis; within a line they are whitespace (clean_text).
_LINE_BREAK = re.compile(r'\r\n|\r|\n')


def split_lines(text: str) -> list[str]:
  """``text``'s lines, each without its end: split at \\n, \\r\\n and
  \\r only. As ``str.splitlines`` for those, no last empty line."""
  lines = _LINE_BREAK.split(text)
  if not lines[-1]:
    lines.pop()
  return lines


def _text_lines(file: str, counts: collections.Counter | None = None
                ) -> Iterator[str]:
  """The lines of ``file`` (decompressed) as ``split_lines`` of its whole
  text gives them, read a block of whole byte lines at a time: a byte line
  ends at b'\\n', which no UTF-8 character contains, and a \\r before it
  stays in its block. Invalid UTF-8 is counted as ``_decode_utf8`` counts
  it."""
  with open_binary(file) as f:
    rest: list[bytes] = []   # A line's bytes so far, over blocks.
    while True:
      block = f.read(_READ_BLOCK)
      if not block:
        break
      cut = block.rfind(b'\n') + 1
      if not cut:
        rest.append(block)
        continue
      yield from split_lines(_decode_utf8(b''.join(rest) + block[:cut],
                                          counts))
      rest = [block[cut:]]
    if any(rest):
      yield from split_lines(_decode_utf8(b''.join(rest), counts))


def _line_documents(lines: Iterable[str], counts: collections.Counter
                    ) -> Iterator[tuple[str, ...]]:
  """The raw documents of google-research/bert's format: a sentence per
  line, a blank line (empty or whitespace) after each document.

  Each is its lines as read (``_parse_lines`` cleans them). A blank line
  that ends no line (after another blank line, or at the start of the
  text) ends an empty document, counted.
  """
  document: list[str] = []
  for line in lines:
    if line and not line.isspace():
      document.append(line)
    elif document:
      yield tuple(document)
      document = []
    else:
      counts['empty_documents'] += 1
  if document:
    yield tuple(document)


def _parse_lines(lines: Sequence[str], counts: collections.Counter
                 ) -> Document:
  """A document of sentence-per-line text. A line that holds only control
  characters is not blank: it is dropped and counted as an empty sentence,
  and the document goes on (as in google-research/bert, whose reader strips
  whitespace only)."""
  document: Document = []
  for line in lines:
    line = clean_text(line, counts)
    if line:
      document.extend(split_long_sentence(line, counts))
    else:
      counts['empty_sentences'] += 1
  return document


def read_text_files(path: str, text_format: str,
                    counts: collections.Counter | None = None
                    ) -> Iterator[Document]:
  """Documents from text files (see ``CorpusSpec`` for the formats).

  What is repaired or dropped on the way is added to ``counts`` (keys in
  ``SKIP_COUNTERS``).
  """
  return read_documents(CorpusSpec(source='files', path=path,
                                   text_format=text_format), counts)


# ---------------------------------------------------------------------------
# (a') JSON Lines with annotations.
#
# One document per line: {"text": "..."} (split into sentences like the
# 'paragraphs' format) or {"sentences": ["...", ...]}, optionally with
#   "spans":       [[start, end, kind], ...]  character offsets into "text"
#                  (or into the sentences joined by "\n"), end exclusive;
#   "token_spans": [[first, end, kind], ...]  indices of whitespace-separated
#                  tokens of that text, end exclusive;
# kind is "entity" or "phrase" (masking units) or "word" (the user's word
# segmentation, which overrides the tokenizer's word starts). Other keys are
# ignored.


def _jsonl_error(where: str, message: str) -> CorpusError:
  return CorpusError(
      f'{where}: {message}. Each line must be a JSON object with "text" (a '
      'string) or "sentences" (a list of strings), and optionally "spans" '
      '(character offsets) or "token_spans" (whitespace-token indices): '
      f'lists of [start, end, kind] with kind in {SPAN_KINDS}.')


def _record_spans(record: dict, text: str, where: str
                  ) -> list[tuple[int, int, str]]:
  """The record's spans as character offsets into ``text``, sorted."""
  spans = []
  tokens = None
  for key in ('spans', 'token_spans'):
    for span in record.get(key) or ():
      if (not isinstance(span, (list, tuple)) or len(span) != 3 or
          not all(isinstance(x, int) and not isinstance(x, bool)
                  for x in span[:2]) or span[2] not in SPAN_KINDS):
        raise _jsonl_error(where, f'{key} entry {span!r} is not '
                           '[start, end, kind]')
      start, end, kind = span
      if key == 'token_spans':
        if tokens is None:
          tokens = [m.span() for m in re.finditer(r'\S+', text)]
        if not 0 <= start < end <= len(tokens):
          raise _jsonl_error(where, f'token span {span!r} is outside the '
                             f'{len(tokens)} whitespace tokens')
        start, end = tokens[start][0], tokens[end - 1][1]
      elif not 0 <= start < end <= len(text):
        raise _jsonl_error(where, f'span {span!r} is outside the text of '
                           f'{len(text)} characters')
      spans.append((start, end, kind))
  spans.sort(key=lambda x: (x[0], -x[1]))
  words = [x for x in spans if x[2] == 'word']
  for a, b in zip(words, words[1:]):
    if b[0] < a[1]:
      raise _jsonl_error(where, f'word spans {a!r} and {b!r} overlap; a '
                         'segmentation has one word per character')
  return spans


def _sentence_ranges(record: dict, text: str,
                     spans: list[tuple[int, int, str]],
                     where: str) -> list[tuple[int, int]]:
  """[start, end) of each sentence in ``text``.

  ``spans`` are sorted by start; lookups bisect them, so a long record with
  many sentences and spans takes O(n log n), not O(sentences * spans).
  """
  span_starts = [a for a, _, _ in spans]
  if 'sentences' in record:
    ranges, start = [], 0
    for sentence in record['sentences']:
      ranges.append((start, start + len(sentence)))
      start += len(sentence) + 1
    range_starts = [s for s, _ in ranges]
    for a, b, kind in spans:
      s, e = ranges[bisect.bisect_right(range_starts, a) - 1]
      if not (s <= a and b <= e):
        raise _jsonl_error(where, f'span {(a, b, kind)!r} crosses a sentence '
                           'boundary; spans must lie within one sentence')
    return ranges
  # Free text: paragraphs at blank lines, then the rule-based splitter; a
  # sentence boundary inside a span is dropped (the sentences are merged).
  # max_end[i]: the furthest end of the first i spans.
  max_end = list(itertools.accumulate((b for _, b, _ in spans), max,
                                      initial=-1))
  ranges = []
  breaks = [m.span() for m in re.finditer(r'\n\s*\n', text)]
  paragraph_starts = [0] + [end for _, end in breaks]
  paragraph_ends = [start for start, _ in breaks] + [len(text)]
  for p0, p1 in zip(paragraph_starts, paragraph_ends):
    cleaned, offsets = _clean_with_map(text[p0:p1])
    for a, b in _sentence_bounds(cleaned):
      start, end = p0 + int(offsets[a]), p0 + int(offsets[b - 1]) + 1
      # Does a span that starts before the last sentence's end end after
      # this sentence's start?
      if ranges and max_end[bisect.bisect_left(span_starts,
                                               ranges[-1][1])] > start:
        start = ranges.pop()[0]
      ranges.append((start, end))
  return ranges


def _jsonl_document(record, where: str,
                    counts: collections.Counter | None = None) -> Document:
  """One annotated document from a parsed JSON Lines record.

  A sentence longer than ``MAX_SENTENCE_CHARS`` is cut into pieces like
  ``split_long_sentence``'s; a span across a cut is dropped.
  """
  counts = collections.Counter() if counts is None else counts
  if not isinstance(record, dict):
    raise _jsonl_error(where, f'found a JSON {type(record).__name__}')
  if ('text' in record) == ('sentences' in record):
    raise _jsonl_error(where, 'give exactly one of "text" and "sentences"')
  if 'sentences' in record:
    if (not isinstance(record['sentences'], list) or
        not all(isinstance(x, str) for x in record['sentences'])):
      raise _jsonl_error(where, '"sentences" is not a list of strings')
    text = '\n'.join(record['sentences'])
  elif isinstance(record['text'], str):
    text = record['text']
  else:
    raise _jsonl_error(where, '"text" is not a string')
  spans = _record_spans(record, text, where)
  span_starts = [a for a, _, _ in spans]
  counts['control_characters'] += sum(map(len, _REMOVED.findall(text)))
  sentences, sentence_spans = [], []
  for start, end in _sentence_ranges(record, text, spans, where):
    cleaned, offsets = _clean_with_map(text[start:end])
    if not cleaned:
      counts['empty_sentences'] += 1
      continue
    inside = []  # Spans in cleaned offsets.
    for a, b, kind in spans[bisect.bisect_left(span_starts, start):
                            bisect.bisect_left(span_starts, end)]:
      if b <= end:
        a = int(np.searchsorted(offsets, a - start, 'left'))
        b = int(np.searchsorted(offsets, b - start, 'left'))
        if a < b:
          inside.append((a, b, kind))
    for p0, p1 in _long_sentence_bounds(cleaned, counts):
      sentences.append(cleaned[p0:p1])
      sentence_spans.append([(a - p0, b - p0, kind) for a, b, kind in inside
                             if p0 <= a and b <= p1])
  return Document(sentences, sentence_spans)


def _parse_jsonl(line: str, where: str, counts: collections.Counter
                 ) -> Document:
  """The annotated document of one JSON Lines record (format above)."""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise _jsonl_error(where, f'not JSON ({e})') from e
  return _jsonl_document(record, where, counts)


# ---------------------------------------------------------------------------
# (b) TFDS text datasets.


def _parse_tfds_name(tfds_name: str) -> tuple[str, str]:
  name, sep, feature = tfds_name.rpartition(':')
  if not sep or not name or not feature:
    raise CorpusError(
        f'corpus.tfds_name={tfds_name!r} must look like "name[/config]'
        '[:version]:feature", e.g. "wikipedia/20230601.en:text".')
  return name, feature


def _tfds_source(spec: CorpusSpec):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name, feature = _parse_tfds_name(spec.tfds_name)
  try:
    source = tfds.data_source(
        name, split=spec.tfds_split, data_dir=spec.tfds_data_dir,
        download=False)
  except Exception as e:  # TFDS raises many types for "not prepared".
    raise CorpusError(
        f'corpus.tfds_name={spec.tfds_name!r}: TFDS could not open split '
        f'{spec.tfds_split!r} in data dir {spec.tfds_data_dir or "(default)"}'
        f' ({type(e).__name__}: {e}). Prepare it first in ArrayRecord format '
        '(tfds build NAME --file_format=array_record) or set '
        'corpus.tfds_data_dir.') from e
  return source, feature


# ---------------------------------------------------------------------------
# (c) The embedded default: the documentation shipped with CPython.

# Packages whose docstrings are mostly tests, generated tables or old syntax.
_SKIPPED_STDLIB_DIRS = frozenset(
    {'site-packages', 'dist-packages', 'test', 'tests', 'idle_test',
     'lib2to3', 'ensurepip', '__pycache__', 'config-3', 'turtledemo'})


def is_prose(paragraph: str) -> bool:
  lines = paragraph.strip('\n').splitlines()
  if not lines:
    return False
  if any(line.lstrip().startswith(('>>>', '...', '$ ', '%', '|', '+--'))
         for line in lines):
    return False
  # Indented blocks after the first line are code or tables in docstrings.
  if any(line.startswith((' ', '\t')) for line in lines):
    return False
  text = ' '.join(lines)
  letters = sum(c.isalpha() or c == ' ' for c in text)
  return len(text) >= 20 and letters / len(text) > 0.85 and ' ' in text


def _docstring_sentences(docstring: str,
                         counts: collections.Counter | None = None
                         ) -> list[str]:
  paragraphs = re.split(r'\n\s*\n', inspect.cleandoc(docstring))
  return _paragraphs_to_document([p for p in paragraphs if is_prose(p)],
                                 counts)


def module_docstrings(source: str) -> Iterator[str]:
  """The module, class and function docstrings of Python ``source``, in
  ``ast.walk`` order (none for a file that does not parse)."""
  try:
    with warnings.catch_warnings():  # Old escapes in some stdlib files.
      warnings.simplefilter('ignore')
      tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      docstring = ast.get_docstring(node, clean=False)
      if docstring:
        yield docstring


def _module_document(source: str,
                     counts: collections.Counter | None = None) -> Document:
  document: Document = []
  for docstring in module_docstrings(source):
    document.extend(_docstring_sentences(docstring, counts))
  return document


def stdlib_files() -> list[str]:
  root = sysconfig.get_paths()['stdlib']
  files = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_STDLIB_DIRS
                        and not d.startswith('config-'))
    files.extend(os.path.join(directory, n) for n in names if n.endswith('.py'))
  return sorted(files)


def embedded_documents(counts: collections.Counter | None = None
                       ) -> Iterator[Document]:
  """English prose from CPython's own documentation, with no download.

  One document per topic of ``pydoc_data.topics`` (the language reference
  pages that ``help()`` shows), then one per standard-library module (its
  module, class and function docstrings, in source order). Code samples,
  doctests and tables are dropped.
  """
  return read_documents(CorpusSpec(), counts)


def _embedded_documents(counts: collections.Counter) -> Iterator[Document]:
  """The embedded corpus's documents: topics and modules with prose."""
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top
    for name in sorted(topics.topics):
      document = _docstring_sentences(topics.topics[name], counts)
      if document:
        yield document
  except ImportError:  # Some distributions strip pydoc_data.
    pass
  for file in stdlib_files():
    document = _module_document(read_text(file, counts), counts)
    if document:
      yield document


# ---------------------------------------------------------------------------
# Entry points used by the rest of the pipeline.
#
# Reading is in two steps, so that one process can feed many: a *raw
# document* is what delimits a document in the source, made with as little
# work as the format allows (the lines of one, a JSON line, a file name, a
# record's text); ``parse_document`` does the rest (cleaning, sentence
# splitting, JSON parsing, reading a whole file). ``read_documents`` is the
# two in one process.


def raw_documents(spec: CorpusSpec,
                  counts: collections.Counter | None = None
                  ) -> Iterator[tuple]:
  """The raw documents of the corpus, in a deterministic order: the first
  ``spec.max_documents`` of them (all if 0). Each is a tuple whose first
  item names its kind; it pickles, and ``parse_document`` makes it a
  ``Document``. Adds to ``counts`` what delimiting them dropped."""
  counts = collections.Counter() if counts is None else counts
  if spec.source == 'embedded':
    # Parsed here: many modules have no prose, and are not documents.
    raw = (('parsed', document) for document in _embedded_documents(counts))
  elif spec.source == 'files':
    raw = _raw_file_documents(spec, counts)
  else:
    raw = _raw_tfds_documents(spec, counts)
  return itertools.islice(raw, spec.max_documents or None)


def _raw_file_documents(spec: CorpusSpec, counts: collections.Counter
                        ) -> Iterator[tuple]:
  for file in files(spec):
    yield from file_raw_documents(spec.text_format, file, counts)


def files(spec: CorpusSpec) -> list[str]:
  """The files of a 'files' corpus, in reading order."""
  return list(_expand_files(spec.path))


def file_raw_documents(text_format: str, file: str,
                       counts: collections.Counter) -> Iterator[tuple]:
  """The raw documents of one file of a 'files' corpus: the corpus's are
  those of its ``files``, one after the other."""
  if text_format == 'jsonl':
    for number, line in enumerate(_text_lines(file, counts), 1):
      if line.strip():
        yield ('jsonl', line, f'{file}:{number}')
  elif text_format == 'sentence_per_line':
    for lines in _line_documents(_text_lines(file, counts), counts):
      yield ('lines', lines)
  else:   # A file is one document, read whole by parse_document.
    yield ('file', file)


def _raw_tfds_documents(spec: CorpusSpec, counts: collections.Counter
                        ) -> Iterator[tuple]:
  source, feature = _tfds_source(spec)
  for i in range(len(source)):
    text = source[i][feature]
    if isinstance(text, bytes):
      text = _decode_utf8(text, counts)
    yield ('text', str(text))


def raw_size(raw: tuple) -> int:
  """About the bytes of text of a raw document (its characters): a
  measure of progress."""
  kind = raw[0]
  if kind in ('lines', 'parsed'):
    return sum(map(len, raw[1])) + len(raw[1])
  if kind == 'file':
    return storage.getsize(raw[1])
  return len(raw[1])


def parse_document(raw: tuple, counts: collections.Counter | None = None
                   ) -> Document | None:
  """The ``Document`` of a raw document, or None if it has no sentence.

  Adds to ``counts`` what it repaired or dropped (an empty document counts
  in 'empty_documents').
  """
  counts = collections.Counter() if counts is None else counts
  kind = raw[0]
  if kind == 'lines':
    document = _parse_lines(raw[1], counts)
  elif kind == 'jsonl':
    document = _parse_jsonl(raw[1], raw[2], counts)
  elif kind == 'file':
    paragraphs = re.split(r'\n\s*\n', read_text(raw[1], counts))
    document = _paragraphs_to_document(paragraphs, counts)
  elif kind == 'text':   # A TFDS record: paragraphs a line each.
    document = _paragraphs_to_document(raw[1].split('\n'), counts)
  elif kind == 'parsed':
    return raw[1]
  else:
    raise ValueError(f'not a raw document: {raw!r:.80}')
  if not document:
    counts['empty_documents'] += 1
    return None
  return document


def read_documents(spec: CorpusSpec,
                   counts: collections.Counter | None = None
                   ) -> Iterator[Document]:
  """All documents of the corpus, in a deterministic order (those of the
  first ``spec.max_documents`` raw documents that have a sentence).

  Adds to ``counts`` what reading repaired or dropped (keys in
  ``SKIP_COUNTERS``).
  """
  counts = collections.Counter() if counts is None else counts
  for raw in raw_documents(spec, counts):
    document = parse_document(raw, counts)
    if document is not None:
      yield document


def validate(spec: CorpusSpec) -> None:
  """Cheap checks that fail before any expensive work. Raises CorpusError."""
  if spec.source not in SOURCES:
    raise CorpusError(f'corpus.source={spec.source!r}; use one of {SOURCES}.')
  if spec.max_documents < 0:
    raise CorpusError(
        f'corpus.max_documents={spec.max_documents} must be >= 0 (0 = all).')
  if spec.source == 'files':
    if spec.text_format not in TEXT_FORMATS:
      raise CorpusError(f'corpus.text_format={spec.text_format!r}; use one of '
                        f'{TEXT_FORMATS}.')
    if not spec.path:
      raise CorpusError('corpus.source="files" needs corpus.path: a directory,'
                        ' a file or a glob of text files.')
    files = list(_expand_files(spec.path))
    if not files:
      raise CorpusError(f'corpus.path={spec.path!r} matches no files. Check '
                        'the path, or quote the glob so the shell leaves it.')
    if spec.text_format == 'jsonl':
      # Parses (and so checks) the first records before any expensive work.
      documents = itertools.islice(read_text_files(spec.path, 'jsonl'),
                                   _VALIDATED_JSONL_RECORDS)
      has_text = sum(1 for _ in documents) > 0
    else:
      # The heads of the first files, then (only if they hold none) all of
      # every file, a line at a time.
      # The first files' first bytes only: a corpus of many files in a
      # bucket is read at every start, on every host.
      binary = [f for f in files[:_BINARY_CHECKED_FILES]
                if _is_binary(_read_head(f, _BINARY_HEAD_BYTES))]
      if binary:
        raise CorpusError(
            f'corpus.path={spec.path!r} matches {len(binary)} file(s) that '
            f'are not text (e.g. {binary[0]!r}: mostly NUL bytes or '
            'invalid UTF-8, as in a PDF, an image or a UTF-16 file). '
            'Narrow the path or glob to the UTF-8 text files.')
      has_text = (any(_is_text(_decode_utf8(_read_head(f)))
                      for f in files[:_VALIDATED_FILES])
                  or any(_has_text(f) for f in files))
    if not has_text:
      raise CorpusError(f'corpus.path={spec.path!r}: the {len(files)} files '
                        'found hold no text (only whitespace, control '
                        'characters or invalid UTF-8): point corpus.path '
                        'at UTF-8 text files.')
  elif spec.source == 'tfds':
    _parse_tfds_name(spec.tfds_name)
    source, feature = _tfds_source(spec)
    if len(source) == 0:  # pylint: disable=g-explicit-length-test
      raise CorpusError(f'corpus.tfds_name={spec.tfds_name!r} is empty.')
    if feature not in source[0]:
      raise CorpusError(
          f'corpus.tfds_name={spec.tfds_name!r}: no feature {feature!r}; '
          f'the dataset has {sorted(source[0])}.')


# ``validate`` reads at most this much of a file to find text in it, of
# the first this many files.
_VALIDATED_BYTES = 1 << 20
_VALIDATED_FILES = 1000
# A file's head of at least _BINARY_MIN_BYTES with more than this
# fraction of NUL bytes and invalid UTF-8 is not text (a stray NUL or bad
# byte in text is repaired; a few bytes of them are a file with no text).
_BINARY_FRACTION = 0.3
_BINARY_MIN_BYTES = 256
# Of the first this many files, this many first bytes are checked so.
_BINARY_CHECKED_FILES = 16
_BINARY_HEAD_BYTES = 1 << 16


def _read_head(file: str, size: int = _VALIDATED_BYTES) -> bytes:
  with open_binary(file) as f:
    return f.read(size)


def _is_binary(head: bytes) -> bool:
  """Whether a file's first bytes are not UTF-8 text but binary data."""
  if len(head) < _BINARY_MIN_BYTES:
    return False
  decoded = head.decode('utf-8', errors='replace')
  bad = decoded.count('\ufffd') + decoded.count('\x00')
  return bad > _BINARY_FRACTION * len(decoded)


def _is_text(text: str) -> bool:
  # U+FFFD, what invalid UTF-8 becomes, is not text: SentencePiece's
  # normalization removes it (a character cut at the end of a head is one).
  return bool(clean_text(text).replace('\ufffd', '').strip())


def _has_text(file: str) -> bool:
  """Whether any line of ``file`` holds text."""
  return any(_is_text(line) for line in _text_lines(file))


def describe(spec: CorpusSpec) -> str:
  """The corpus in a few words, for error messages: what the user set."""
  if spec.source == 'files':
    return f'corpus.path={spec.path!r} ({spec.text_format})'
  if spec.source == 'tfds':
    return f'corpus.tfds_name={spec.tfds_name!r} (split {spec.tfds_split!r})'
  return 'the embedded corpus'


def fingerprint(spec: CorpusSpec) -> str:
  """A digest that changes when the corpus changes (cheap for large corpora).

  Files are identified by path, size and modification time; TFDS datasets by
  name, split, record count and every file of their prepared version (path,
  size and modification time: a rebuilt dataset is another corpus); the
  embedded corpus by the Python version and the standard library files'
  sizes.
  """
  h = hashlib.sha256(repr(dataclasses.astuple(spec)).encode())
  if spec.source == 'files':
    for f, stat in _expand_files(spec.path).items():
      name = f if storage.is_remote(f) else os.path.abspath(f)
      h.update(f'{name}:{stat.version}'.encode())
  elif spec.source == 'embedded':
    import sys  # pylint: disable=g-import-not-at-top
    h.update(sys.version.encode())
    for f in stdlib_files():
      h.update(f'{f}:{os.path.getsize(f)}'.encode())
  else:
    source, _ = _tfds_source(spec)
    h.update(repr(len(source)).encode())
    for f, stat in storage.find(str(source.dataset_info.data_dir)).items():
      h.update(f'{f}:{stat.version}'.encode())
  return h.hexdigest()[:16]
