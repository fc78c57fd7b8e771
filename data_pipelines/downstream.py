"""Downstream tasks for fine-tuning: loading, encoding and metrics.

A task (``Task``) is a list of training and a list of evaluation examples of
one of four kinds:

  classification: {'text': str, 'text_pair': str | None, 'label': int}
  regression:     {'text': str, 'text_pair': str | None, 'label': float}
  token:          {'words': list[str], 'labels': list[int]}  (one per word)
  span:           {'id': str, 'question': str, 'context': str,
                   'answers': [{'text': str, 'start': int}, ...]}
                  (``start``: character offset of the answer in context)

Tasks come from three places: ``embedded_task`` (built from the standard
library's docstrings, the same text bertjax pretrains on by default, so it
runs with no download), ``load_files`` (JSON Lines or CSV) and ``load_tfds``
(GLUE, SQuAD v1.1, CoNLL-2003). ``encode`` turns examples into fixed-shape
numpy arrays with our SentencePiece ``Tokenizer`` in BERT's layout
([CLS] A [SEP] B [SEP]); ``evaluate`` scores predictions with the task's
metrics (``METRICS``), the first of which is its headline.

Pure numpy and Python: no JAX, so the harness encodes and scores on the host.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import os
import re
import string
import sysconfig
from typing import Callable, Sequence

import numpy as np

from data_pipelines import corpus as corpus_lib
from data_pipelines import tokenizer as tokenizer_lib

KINDS = ('classification', 'regression', 'token', 'span')
# The label of an encoded position that carries none (token tasks: later
# sub-tokens, specials, padding). Losses and metrics skip it.
IGNORE = -1
# The corpus's own readers, so the embedded task sees exactly the pretraining
# text.
_read_text = corpus_lib._read_text  # pylint: disable=protected-access
_is_prose = corpus_lib._is_prose  # pylint: disable=protected-access


class TaskError(ValueError):
  """A task cannot be loaded, encoded or scored; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Task:
  """A downstream task: examples and how to score them.

  Attributes:
    name: e.g. 'embedded', 'glue/sst2', 'files:train.jsonl'.
    kind: one of ``KINDS``.
    label_names: classes of classification, tags of token tasks (id = index);
      () for regression and span.
    metrics: names of ``METRICS``; the first is the headline metric.
    train: training examples (formats in the module docstring).
    eval: evaluation examples.
  """
  name: str
  kind: str
  label_names: tuple[str, ...]
  metrics: tuple[str, ...]
  train: list[dict]
  eval: list[dict]

  def __post_init__(self):
    _check_kind(self.kind)
    unknown = [m for m in self.metrics if m not in METRICS]
    if not self.metrics or unknown:
      raise TaskError(f'task {self.name!r}: metrics {self.metrics!r} must be '
                      f'a non-empty tuple of {sorted(METRICS)}.')

  @property
  def num_labels(self) -> int:
    """Outputs of the task's head: classes, 1 (regression), 2 (start, end)."""
    if self.kind == 'regression':
      return 1
    if self.kind == 'span':
      return 2
    return len(self.label_names)


def _check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise TaskError(f'task kind {kind!r}; use one of {KINDS}.')


# ---------------------------------------------------------------------------
# (a) The embedded task: which standard-library package does this docstring
# paragraph come from?

EMBEDDED_NAME = 'embedded'
# The packages with the most paragraphs become the classes; a package needs
# enough paragraphs that its eval share (~20%) is not a handful.
_EMBEDDED_CLASSES = 8
_EMBEDDED_MIN_PARAGRAPHS = 40
_EVAL_PERCENT = 20
def _prose_paragraphs(docstring: str) -> list[str]:
  """The docstring's prose paragraphs (as corpus.py keeps them), one line each.

  Paragraphs are split at blank lines after ``inspect.cleandoc``; code,
  doctests and tables are dropped by ``corpus._is_prose``; the paragraph's
  lines are joined with spaces and cleaned.
  """
  paragraphs = re.split(r'\n\s*\n', inspect.cleandoc(docstring))
  return [corpus_lib.clean_text(' '.join(p.strip('\n').splitlines()))
          for p in paragraphs if _is_prose(p)]


def _stable_digest(text: str) -> bytes:
  # hashlib, not hash(): Python salts str hashes per process.
  return hashlib.sha256(text.encode('utf-8')).digest()


@functools.cache
def _package_paragraphs() -> dict[str, tuple[str, ...]]:
  """Package name -> its unique prose paragraphs (sorted), whole stdlib.

  Cached: parsing the standard library takes seconds, and a comparison or a
  test session builds the task many times from the same installed sources.
  """
  root = sysconfig.get_paths()['stdlib']
  owners: dict[str, set[str]] = collections.defaultdict(set)
  for file in corpus_lib.stdlib_files():
    parts = os.path.relpath(file, root).split(os.sep)
    if len(parts) < 2:  # A single-file module, not a package.
      continue
    for docstring in corpus_lib.module_docstrings(_read_text(file)):
      for paragraph in _prose_paragraphs(docstring):
        owners[paragraph].add(parts[0])
  packages: dict[str, list[str]] = collections.defaultdict(list)
  for paragraph, names in owners.items():
    # Boilerplate shared by two packages carries no signal: drop it.
    if len(names) == 1:
      packages[next(iter(names))].append(paragraph)
  return {name: tuple(sorted(texts)) for name, texts in packages.items()}


def embedded_task(examples_per_class: int = 0, seed: int = 0) -> Task:
  """Which standard-library package does a docstring paragraph come from?

  Examples are prose paragraphs of the module, class and function docstrings
  of CPython's own standard library (the text ``corpus.embedded_documents``
  pretrains on), labelled with their top-level package (``email/mime/text.py``
  -> 'email'). The classes are the ``_EMBEDDED_CLASSES`` packages with the
  most paragraphs (at least ``_EMBEDDED_MIN_PARAGRAPHS`` each), sorted by
  name. A paragraph found in two packages is dropped. Train and eval are
  split by a hash of the text (about 80/20), so the split is the same on
  every machine with the same Python and never depends on file order;
  examples are in hash order (classes interleaved).

  Args:
    examples_per_class: 0 keeps every training example; N keeps the first N
      of each class in an order drawn from ``seed`` (a low-resource variant).
      Evaluation is never subsampled.
    seed: picks the kept training examples.

  Raises:
    TaskError: fewer than two packages qualify (a stripped Python install).
  """
  if examples_per_class < 0:
    raise TaskError(f'examples_per_class={examples_per_class} must be >= 0 '
                    '(0 = all).')
  packages = _package_paragraphs()
  ranked = sorted(packages.items(), key=lambda kv: (-len(kv[1]), kv[0]))
  names = sorted(name for name, texts in ranked[:_EMBEDDED_CLASSES]
                 if len(texts) >= _EMBEDDED_MIN_PARAGRAPHS)
  if len(names) < 2:
    raise TaskError(
        f'the embedded task found {len(names)} standard-library packages with '
        f'at least {_EMBEDDED_MIN_PARAGRAPHS} docstring paragraphs under '
        f'{sysconfig.get_paths()["stdlib"]}; it needs 2. This Python install '
        'looks stripped of its sources; use task files (load_files) or a TFDS '
        'task (load_tfds) instead.')
  keyed = sorted((_stable_digest(text), text, label)
                 for label, name in enumerate(names) for text in packages[name])
  train, eval_ = [], []
  for digest, text, label in keyed:
    split = eval_ if int.from_bytes(digest[:8], 'big') % 100 < _EVAL_PERCENT \
        else train
    split.append({'text': text, 'text_pair': None, 'label': label})
  if examples_per_class:
    order = np.random.default_rng(seed).permutation(len(train))
    kept, counts = [], collections.Counter()
    for i in order:
      label = train[i]['label']
      if counts[label] < examples_per_class:
        counts[label] += 1
        kept.append(int(i))
    train = [train[i] for i in sorted(kept)]
  return Task(EMBEDDED_NAME, 'classification', tuple(names),
              ('accuracy', 'f1'), train, eval_)


# ---------------------------------------------------------------------------
# (b) Task files: JSON Lines or CSV.

_FILE_FORMATS = ('.jsonl', '.csv')
_INT_LIKE = re.compile(r'-?\d+')


def _read_records(path: str) -> list[tuple[str, dict]]:
  """(``file:line``, record) for every record of a .jsonl or .csv file."""
  if not os.path.isfile(path):
    raise TaskError(f'task file {path!r} does not exist.')
  ext = os.path.splitext(path)[1].lower()
  if ext not in _FILE_FORMATS:
    raise TaskError(f'task file {path!r}: unknown format {ext!r}; use one of '
                    f'{_FILE_FORMATS} (JSON Lines: one object per line; CSV: '
                    'a header row).')
  records = []
  if ext == '.jsonl':
    for number, line in enumerate(_read_text(path).splitlines(), 1):
      if not line.strip():
        continue
      where = f'{path}:{number}'
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise TaskError(f'{where}: not JSON ({e}); each line must be one JSON '
                        'object.') from e
      if not isinstance(record, dict):
        raise TaskError(f'{where}: found a JSON {type(record).__name__}; each '
                        'line must be one JSON object.')
      records.append((where, record))
  else:
    with open(path, newline='', encoding='utf-8', errors='replace') as f:
      reader = csv.DictReader(f)
      for row in reader:
        # Missing trailing cells come back as None: a missing field.
        record = {k: v for k, v in row.items() if k is not None and
                  v is not None}
        if any(v.strip() for v in record.values()):
          records.append((f'{path}:{reader.line_num}', record))
  if not records:
    raise TaskError(f'task file {path!r} holds no examples.')
  return records


def _field(record: dict, name: str, where: str, argument: str = ''):
  """record[name]; a clear error naming file, line and field when missing.

  ``argument``: the load_files argument that names the field, if any.
  """
  if name not in record or record[name] is None:
    hint = (f'Set {argument} to the field that holds it.' if argument else
            'Span task files need "question", "context" and "answers".')
    raise TaskError(f'{where}: no field {name!r} (the record has '
                    f'{sorted(record)}). {hint}')
  return record[name]


def _string(value, where: str, name: str) -> str:
  if not isinstance(value, str):
    raise TaskError(f'{where}: field {name!r} is a {type(value).__name__}, '
                    'not a string.')
  return value


def _list(value, where: str, name: str) -> list:
  """A list field; in CSV, a JSON list or whitespace-separated items."""
  if isinstance(value, str):
    text = value.strip()
    if text.startswith('['):
      try:
        value = json.loads(text)
      except json.JSONDecodeError as e:
        raise TaskError(f'{where}: field {name!r} is not a JSON list ({e}).'
                        ) from e
    else:
      value = text.split()
  if not isinstance(value, list):
    raise TaskError(f'{where}: field {name!r} is a {type(value).__name__}, '
                    'not a list.')
  return value


def _is_int_like(value) -> bool:
  if isinstance(value, bool):
    return False
  return isinstance(value, (int, np.integer)) or (
      isinstance(value, str) and bool(_INT_LIKE.fullmatch(value.strip())))


class _LabelMap:
  """Maps raw labels (names or ids) to ids, and knows the label names.

  With ``label_names`` given, a label is one of the names or an id into
  them. Without, labels that are all integers (or integer strings, as CSV
  gives them) keep their values as ids, named '0'..'K-1'; otherwise the
  sorted unique training labels are the names.
  """

  def __init__(self, train_values: list[tuple[str, object]],
               label_names: Sequence[str]):
    self.given = bool(label_names)
    if label_names:
      self.names = tuple(str(x) for x in label_names)
      self.as_ids = False
    elif all(_is_int_like(v) for _, v in train_values):
      ids = [int(v) for _, v in train_values]
      negative = [(w, v) for w, v in train_values if int(v) < 0]
      if negative:
        where, value = negative[0]
        raise TaskError(f'{where}: label {value!r} is negative; integer '
                        'labels are ids 0..K-1.')
      self.names = tuple(str(i) for i in range(max(ids) + 1))
      self.as_ids = True
    else:
      self.names = tuple(sorted({str(v) for _, v in train_values}))
      self.as_ids = False
    self._index = {name: i for i, name in enumerate(self.names)}

  def __call__(self, value, where: str) -> int:
    if self.as_ids or (self.given and not (isinstance(value, str) and
                                           value in self._index)):
      if _is_int_like(value) and 0 <= int(value) < len(self.names):
        return int(value)
    elif str(value) in self._index:
      return self._index[str(value)]
    raise TaskError(f'{where}: label {value!r} is not one of the labels '
                    f'{self.names}' + (' (nor an id into them)' if self.given
                                       else '') + '.')


def _check_eval_labels(eval_values, train_ids: set, train_path: str,
                       label_map: _LabelMap) -> None:
  """Every evaluation label must occur in training: a model cannot learn a
  class it never sees, and its score would be silently capped."""
  for where, value in eval_values:
    try:
      i = label_map(value, where)
    except TaskError:
      if label_map.given:
        raise
      i = None  # Not among the training labels (which named the classes).
    if i not in train_ids:
      raise TaskError(
          f'{where}: label {value!r} never occurs in the training file '
          f'{train_path!r}; a model cannot learn it. Fix the label or add '
          'training examples of it.')


def _regression_label(value, where: str) -> float:
  try:
    if isinstance(value, bool):
      raise ValueError
    label = float(value)
  except (TypeError, ValueError):
    label = math.nan
  if not math.isfinite(label):
    raise TaskError(f'{where}: regression label {value!r} is not a finite '
                    'number.')
  return label


def _span_answers(value, where: str, context: str) -> list[dict]:
  """SQuAD-like answers: a list of {text, answer_start | start}, or a dict of
  lists {text: [...], answer_start: [...]} (the TFDS and HF layout)."""
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise TaskError(f'{where}: field "answers" is not JSON ({e}).') from e
  if isinstance(value, dict):
    starts = value.get('answer_start', value.get('start'))
    texts = value.get('text')
    if not isinstance(texts, list) or not isinstance(starts, list) or len(
        texts) != len(starts):
      raise TaskError(f'{where}: "answers" as a dict needs lists "text" and '
                      '"answer_start" of the same length.')
    value = [{'text': t, 'start': s} for t, s in zip(texts, starts)]
  if not isinstance(value, list) or not value:
    raise TaskError(f'{where}: "answers" must be a non-empty list of '
                    '{"text": ..., "answer_start": ...}.')
  answers = []
  for answer in value:
    if not isinstance(answer, dict):
      raise TaskError(f'{where}: answer {answer!r} is not an object.')
    text = answer.get('text')
    start = answer.get('answer_start', answer.get('start'))
    if not isinstance(text, str) or not _is_int_like(start):
      raise TaskError(f'{where}: answer {answer!r} needs "text" (a string) '
                      'and "answer_start" (a character offset).')
    start = int(start)
    if context[start:start + len(text)] != text:
      raise TaskError(
          f'{where}: answer {text!r} is not at character {start} of the '
          f'context (found {context[start:start + len(text)]!r}); '
          '"answer_start" counts characters of the context from 0.')
    answers.append({'text': text, 'start': start})
  return answers


def load_files(kind: str, train_path: str, eval_path: str, *,
               text_field: str = 'text', pair_field: str = '',
               label_field: str = 'label', words_field: str = 'words',
               labels_field: str = 'labels',
               label_names: Sequence[str] = ()) -> Task:
  """A task from a training and an evaluation file (.jsonl or .csv).

  Fields per kind:
    classification / regression: ``text_field``, ``pair_field`` ('' = single
      text) and ``label_field`` (class name or id; a number for regression).
    token: ``words_field`` and ``labels_field``, lists of the same length (a
      CSV cell holds a JSON list or whitespace-separated items); tags are
      names or ids.
    span: 'question', 'context', 'answers' (a list of {"text",
      "answer_start" | "start"}, or a dict of lists as SQuAD in TFDS) and
      optionally 'id' (default ``file:line``).

  Labels map to ids through ``label_names`` when given; otherwise integer
  labels are ids and other labels are named by the sorted unique training
  labels. Everything is validated here, so a bad file fails before a model
  is built: a missing file or field, an empty split, an evaluation label
  absent from training, a token example whose words and labels differ in
  length, an answer not at its offset — each a ``TaskError``.
  """
  _check_kind(kind)
  raw = {'train': _read_records(train_path), 'eval': _read_records(eval_path)}
  metrics = {'classification': ('accuracy', 'f1'),
             'regression': ('pearson', 'spearman'),
             'token': ('entity_f1', 'accuracy'),
             'span': ('exact_match', 'span_f1')}[kind]
  names: tuple[str, ...] = ()
  splits: dict[str, list[dict]] = {}
  if kind in ('classification', 'regression'):
    for split, records in raw.items():
      examples = []
      for where, record in records:
        text = _string(_field(record, text_field, where, 'text_field'), where,
                       text_field)
        pair = None
        if pair_field:
          pair = _string(_field(record, pair_field, where, 'pair_field'),
                         where, pair_field)
        label = _field(record, label_field, where, 'label_field')
        examples.append({'text': text, 'text_pair': pair, 'label': label,
                         '_where': where})
      splits[split] = examples
    if kind == 'regression':
      for examples in splits.values():
        for ex in examples:
          ex['label'] = _regression_label(ex['label'], ex['_where'])
    else:
      values = {s: [(ex['_where'], ex['label']) for ex in examples]
                for s, examples in splits.items()}
      label_map = _LabelMap(values['train'], label_names)
      train_ids = {label_map(v, w) for w, v in values['train']}
      _check_eval_labels(values['eval'], train_ids, train_path, label_map)
      if len(train_ids) < 2:
        raise TaskError(
            f'{train_path!r}: every training example has the label '
            f'{values["train"][0][1]!r}; classification needs at least two '
            f'classes. Check label_field={label_field!r}.')
      for examples in splits.values():
        for ex in examples:
          ex['label'] = label_map(ex['label'], ex['_where'])
      names = label_map.names
    for examples in splits.values():
      for ex in examples:
        del ex['_where']
  elif kind == 'token':
    values: dict[str, list] = {}
    for split, records in raw.items():
      examples, values[split] = [], []
      for where, record in records:
        words = _list(_field(record, words_field, where, 'words_field'),
                      where, words_field)
        tags = _list(_field(record, labels_field, where, 'labels_field'),
                     where, labels_field)
        if len(words) != len(tags):
          raise TaskError(
              f'{where}: {len(words)} words but {len(tags)} labels; a token '
              'task needs one label per word.')
        examples.append({'words': [str(w) for w in words], 'labels': tags})
        values[split].extend((where, t) for t in tags)
      splits[split] = examples
    label_map = _LabelMap(values['train'], label_names)
    train_ids = {label_map(v, w) for w, v in values['train']}
    _check_eval_labels(values['eval'], train_ids, train_path, label_map)
    for split, records in raw.items():
      for (where, _), ex in zip(records, splits[split]):
        ex['labels'] = [label_map(t, where) for t in ex['labels']]
    names = label_map.names
    if not any(n.startswith(('B-', 'I-')) for n in names):
      metrics = ('accuracy',)  # No BIO tags: entities are undefined.
  else:
    for split, records in raw.items():
      examples, seen = [], set()
      for where, record in records:
        question = _string(_field(record, 'question', where),
                           where, 'question')
        context = _string(_field(record, 'context', where),
                          where, 'context')
        answers = _span_answers(_field(record, 'answers', where),
                                where, context)
        id_ = str(record.get('id', where))
        if id_ in seen:
          raise TaskError(f'{where}: id {id_!r} repeats; predictions are keyed'
                          ' by id, so each example needs its own.')
        seen.add(id_)
        examples.append({'id': id_, 'question': question, 'context': context,
                         'answers': answers})
      splits[split] = examples
  return Task(f'files:{os.path.basename(train_path)}', kind, names, metrics,
              splits['train'], splits['eval'])


# ---------------------------------------------------------------------------
# (c) TFDS tasks.


@dataclasses.dataclass(frozen=True)
class _TfdsTask:
  kind: str
  metrics: tuple[str, ...]
  text: str = ''        # Feature of segment A (classification, regression).
  pair: str = ''        # Feature of segment B ('' = single text).
  eval_split: str = 'validation'
  dataset: str = ''     # The name given to tfds.load, if not the task's.


_TFDS_TASKS = {
    'glue/cola': _TfdsTask('classification', ('matthews', 'accuracy'),
                           'sentence'),
    'glue/sst2': _TfdsTask('classification', ('accuracy',), 'sentence'),
    'glue/mrpc': _TfdsTask('classification', ('f1', 'accuracy'), 'sentence1',
                           'sentence2'),
    'glue/qqp': _TfdsTask('classification', ('f1', 'accuracy'), 'question1',
                          'question2'),
    'glue/stsb': _TfdsTask('regression', ('pearson', 'spearman'), 'sentence1',
                           'sentence2'),
    'glue/mnli': _TfdsTask('classification', ('accuracy',), 'premise',
                           'hypothesis', eval_split='validation_matched'),
    'glue/qnli': _TfdsTask('classification', ('accuracy',), 'question',
                           'sentence'),
    'glue/rte': _TfdsTask('classification', ('accuracy',), 'sentence1',
                          'sentence2'),
    'glue/wnli': _TfdsTask('classification', ('accuracy',), 'sentence1',
                           'sentence2'),
    'squad': _TfdsTask('span', ('exact_match', 'span_f1'),
                       dataset='squad/v1.1'),
    'conll2003': _TfdsTask('token', ('entity_f1', 'accuracy'),
                           eval_split='dev'),
}
TFDS_TASKS = tuple(_TFDS_TASKS)


def _read_tfds_split(name: str, split: str, data_dir: str | None
                     ) -> list[dict]:
  """Every record of a TFDS split as numpy (strings are bytes)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return list(tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir)))


def _tfds_label_names(name: str, feature: str, data_dir: str | None
                      ) -> tuple[str, ...]:
  """The names of a ClassLabel feature (or of a Sequence of ClassLabel)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  info = tfds.builder(name, data_dir=data_dir).info
  feature = info.features[feature]
  feature = getattr(feature, 'feature', feature)  # Sequence(ClassLabel).
  return tuple(feature.names)


def _text(value) -> str:
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, bytes):
    return value.decode('utf-8', errors='replace')
  return str(value)


def _tfds_example(spec: _TfdsTask, record: dict) -> dict:
  if spec.kind in ('classification', 'regression'):
    label = record['label']
    return {'text': _text(record[spec.text]),
            'text_pair': _text(record[spec.pair]) if spec.pair else None,
            'label': (float(label) if spec.kind == 'regression'
                      else int(label))}
  if spec.kind == 'token':
    return {'words': [_text(w) for w in record['tokens']],
            'labels': [int(t) for t in record['ner']]}
  answers = record['answers']
  return {'id': _text(record['id']), 'question': _text(record['question']),
          'context': _text(record['context']),
          'answers': [{'text': _text(t), 'start': int(s)} for t, s in zip(
              answers['text'], answers['answer_start'])]}


def load_tfds(name: str, data_dir: str | None = None) -> Task:
  """A task from TFDS (GLUE, SQuAD v1.1, CoNLL-2003): train and its dev set.

  Evaluation uses the validation split (MNLI: validation_matched; CoNLL-2003:
  dev), as the GLUE and SQuAD test labels are hidden. TFDS downloads and
  prepares a dataset on first use, into ``data_dir``.
  """
  if name not in _TFDS_TASKS:
    raise TaskError(f'unknown TFDS task {name!r}; known: {TFDS_TASKS}. Use '
                    'task files (load_files) for other datasets.')
  spec = _TFDS_TASKS[name]
  dataset = spec.dataset or name
  names: tuple[str, ...] = ()
  if spec.kind == 'classification':
    names = _tfds_label_names(dataset, 'label', data_dir)
  elif spec.kind == 'token':
    names = _tfds_label_names(dataset, 'ner', data_dir)
  splits = {}
  for split, tfds_split in (('train', 'train'), ('eval', spec.eval_split)):
    records = _read_tfds_split(dataset, tfds_split, data_dir)
    if not records:
      raise TaskError(f'TFDS {dataset!r} split {tfds_split!r} is empty.')
    splits[split] = [_tfds_example(spec, r) for r in records]
  return Task(name, spec.kind, names, spec.metrics, splits['train'],
              splits['eval'])


# ---------------------------------------------------------------------------
# (d) Encoding: BERT's input layout, with our SentencePiece ids.


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
    raise TaskError(f'max_seq_length={max_seq_length} leaves no room for text '
                    'beside [CLS] and two [SEP]s; use at least 4 (BERT uses '
                    '128 or 512).')


def _require(example: dict, field: str, index: int):
  if not isinstance(example, dict) or field not in example:
    raise TaskError(f'example {index} has no field {field!r}; see the example '
                    'formats in data_pipelines/downstream.py.')
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


def _encode_sentences(kind: str, examples: list[dict], tokenizer,
                      length: int) -> dict[str, np.ndarray]:
  texts = [corpus_lib.clean_text(_string(_require(ex, 'text', i), f'example '
                                         f'{i}', 'text'))
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


def _placed_ends(ends: np.ndarray) -> np.ndarray:
  """``encode_with_offsets``'s ends, with no token ending at 0.

  SentencePiece's dummy "▁" before the first word covers no character; in
  an ASCII sentence that starts with a letter it comes back ending at 0
  (before the sentence). Like any bare "▁", it is placed with the token
  after it.
  """
  ends = np.maximum.accumulate(np.asarray(ends, np.int64).reshape(-1))
  placed = np.flatnonzero(ends > 0)
  if len(placed) and placed[0] > 0:
    ends[:placed[0]] = ends[placed[0]]
  return ends


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
  ends = _placed_ends(ends)
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


def _encode_tokens(examples: list[dict], tokenizer,
                   length: int) -> dict[str, np.ndarray]:
  """Token tasks: each word's label on its first sub-token.

  The words are joined with spaces and tokenized as one sentence (as
  pretraining tokenized its sentences); each token belongs to the word that
  holds its last character (``encode_with_offsets``). SentencePiece never
  lets a piece cross whitespace, so this equals word-by-word encoding for
  ordinary words, and words holding spaces still work.
  """
  joined, bounds = [], []
  for i, ex in enumerate(examples):
    words = [str(w) for w in _require(ex, 'words', i)]
    tags = _require(ex, 'labels', i)
    if len(words) != len(tags):
      raise TaskError(f'example {i}: {len(words)} words but {len(tags)} '
                      'labels; give one label per word.')
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]).astype(np.int64)
    joined.append(' '.join(words))
    bounds.append((starts, starts + np.array([len(w) for w in words],
                                             np.int64)))
  encoded = tokenizer.encode_with_offsets(joined) if joined else []
  out = _empty_rows(len(examples), length)
  out['labels'] = np.full((len(examples), length), IGNORE, np.int32)
  out['words_kept'] = np.zeros(len(examples), np.int32)
  for i, ((ids, ends), (starts, word_ends)) in enumerate(zip(encoded,
                                                             bounds)):
    ids, ends = ids[:length - 2], _placed_ends(ends)[:length - 2]
    _write_row(out, i, ids, None)
    if not len(ids) or not len(starts):
      continue
    last_char = ends - 1
    word = np.searchsorted(starts, last_char, 'right') - 1
    valid = (word >= 0) & (last_char < word_ends[np.maximum(word, 0)])
    tags = np.asarray(examples[i]['labels'], np.int32)
    seen = set()
    for position, (w, ok) in enumerate(zip(word.tolist(), valid.tolist())):
      if ok and w not in seen:  # The word's first sub-token.
        seen.add(w)
        out['labels'][i, 1 + position] = tags[w]
    out['words_kept'][i] = len(seen)
  return out


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


def _encode_spans(examples: list[dict], tokenizer, length: int,
                  doc_stride: int, max_query_length: int
                  ) -> dict[str, np.ndarray]:
  """SQuAD v1.1 features as google-research/bert's run_squad builds them."""
  if doc_stride < 1 or max_query_length < 1:
    raise TaskError(f'doc_stride={doc_stride} and max_query_length='
                    f'{max_query_length} must be >= 1.')
  questions = [corpus_lib.clean_text(str(_require(ex, 'question', i)))
               for i, ex in enumerate(examples)]
  contexts = [str(_require(ex, 'context', i)) for i, ex in enumerate(examples)]
  query_ids = tokenizer.encode(questions) if questions else []
  context_ids = tokenizer.encode_with_offsets(contexts) if contexts else []
  rows = []  # (example, query ids, window start, window length)
  per_example = []  # (ids, char starts, char ends, answer tokens, max ctx)
  for i, (query, (ids, ends)) in enumerate(zip(query_ids, context_ids)):
    query = query[:max_query_length]
    max_doc = length - len(query) - 3
    if max_doc < 1:
      raise TaskError(
          f'max_seq_length={length} leaves no room for the context after a '
          f'question of {len(query)} tokens; raise max_seq_length or lower '
          f'max_query_length={max_query_length}.')
    starts, ends = token_char_spans(contexts[i], ends)
    windows, offset = [], 0
    while True:  # run_squad's doc spans; one (maybe empty) at least.
      size = min(len(ids) - offset, max_doc)
      windows.append((offset, size))
      if offset + size >= len(ids):
        break
      offset += min(size, doc_stride)
    # _check_is_max_context: a token's best window has the most context on
    # its shorter side (+0.01 per window token); the first wins ties.
    position = np.arange(len(ids))
    scores = np.full((len(windows), len(ids)), -np.inf)
    for w, (offset, size) in enumerate(windows):
      inside = (position >= offset) & (position < offset + size)
      score = np.minimum(position - offset, offset + size - 1 - position)
      scores[w, inside] = score[inside] + 0.01 * size
    best = scores.argmax(0) if len(ids) else np.zeros(0, np.int64)
    per_example.append((ids, starts, ends, _answer_tokens(
        examples[i], starts, ends), best))
    rows.extend((i, query, w, offset, size)
                for w, (offset, size) in enumerate(windows))
  out = _empty_rows(len(rows), length)
  out['example_index'] = np.zeros(len(rows), np.int32)
  out['start_positions'] = np.zeros(len(rows), np.int32)
  out['end_positions'] = np.zeros(len(rows), np.int32)
  out['token_start_char'] = np.full((len(rows), length), -1, np.int32)
  out['token_end_char'] = np.full((len(rows), length), -1, np.int32)
  out['max_context'] = np.zeros((len(rows), length), bool)
  for row, (i, query, w, offset, size) in enumerate(rows):
    ids, starts, ends, (first, last), best = per_example[i]
    window = slice(offset, offset + size)
    _write_row(out, row, query, ids[window])
    doc = len(query) + 2  # Where the context starts in the row.
    out['example_index'][row] = i
    out['token_start_char'][row, doc:doc + size] = starts[window]
    out['token_end_char'][row, doc:doc + size] = ends[window]
    out['max_context'][row, doc:doc + size] = best[window] == w
    if first >= 0 and offset <= first and last < offset + size:
      out['start_positions'][row] = doc + first - offset
      out['end_positions'][row] = doc + last - offset
  return out


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
  _check_kind(task_kind)
  _check_lengths(max_seq_length)
  examples = list(examples)
  if task_kind in ('classification', 'regression'):
    return _encode_sentences(task_kind, examples, tokenizer, max_seq_length)
  if task_kind == 'token':
    return _encode_tokens(examples, tokenizer, max_seq_length)
  return _encode_spans(examples, tokenizer, max_seq_length, doc_stride,
                       max_query_length)


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
    raise TaskError(f'span logits of shapes {start_logits.shape} and '
                    f'{end_logits.shape}; the features are {shape}.')
  if max_answer_length < 1:
    raise TaskError(f'max_answer_length={max_answer_length} must be >= 1.')
  best: dict[int, tuple[float, str]] = {}
  span = max_answer_length
  for row in range(shape[0]):
    i = int(features['example_index'][row])
    char_start = features['token_start_char'][row]
    char_end = features['token_end_char'][row]
    is_context = char_start >= 0
    starts = np.where(is_context & features['max_context'][row],
                      start_logits[row], -np.inf)
    ends = np.concatenate([np.where(is_context, end_logits[row], -np.inf),
                           np.full(span - 1, -np.inf, np.float32)])
    # [L, span]: the end logits of end = start + k for k < span.
    candidates = np.lib.stride_tricks.sliding_window_view(ends, span)
    k = candidates.argmax(1)
    totals = starts + candidates[np.arange(shape[1]), k]
    start = int(totals.argmax())
    score = float(totals[start])
    if score == -np.inf or (i in best and best[i][0] >= score):
      continue
    end = start + int(k[start])
    context = _require(examples[i], 'context', i)
    best[i] = (score, context[char_start[start]:char_end[end]])
  return {str(_require(ex, 'id', i)): best.get(i, (0.0, ''))[1]
          for i, ex in enumerate(examples)}


# ---------------------------------------------------------------------------
# (e) Metrics. Each takes (predictions, labels, label_names) and returns a
# Python float (not a percentage).


def _arrays(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  if predictions.shape != labels.shape:
    raise TaskError(f'predictions of shape {predictions.shape} but labels of '
                    f'shape {labels.shape}.')
  return predictions, labels


def _scored(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  """Flat predictions and labels where the label is not -1 (padding)."""
  predictions, labels = _arrays(predictions, labels)
  keep = labels != IGNORE
  return predictions[keep].astype(np.int64), labels[keep].astype(np.int64)


def accuracy(predictions, labels, label_names=()) -> float:
  """Fraction of correct predictions; label -1 positions are skipped, so it
  is also token accuracy for token tasks' [N, L] arrays."""
  del label_names
  predictions, labels = _scored(predictions, labels)
  return float(np.mean(predictions == labels)) if labels.size else 0.0


def f1(predictions, labels, label_names=()) -> float:
  """F1 of class 1 when there are two classes (GLUE's MRPC and QQP), else
  macro-F1 over the classes that occur in labels or predictions.

  The class count is ``len(label_names)``, or the largest id + 1 without.
  """
  predictions, labels = _scored(predictions, labels)
  if not labels.size:
    return 0.0
  num_classes = len(label_names) or int(max(predictions.max(),
                                            labels.max())) + 1

  def class_f1(c):
    tp = np.sum((predictions == c) & (labels == c))
    fp = np.sum((predictions == c) & (labels != c))
    fn = np.sum((predictions != c) & (labels == c))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0

  if num_classes == 2:
    return float(class_f1(1))
  classes = np.union1d(predictions, labels)
  return float(np.mean([class_f1(c) for c in classes]))


def matthews(predictions, labels, label_names=()) -> float:
  """Matthews correlation, multiclass (Gorodkin's R_K, as sklearn): 0 when
  undefined (a constant prediction or label)."""
  del label_names
  predictions, labels = _scored(predictions, labels)
  if not labels.size:
    return 0.0
  k = int(max(predictions.max(), labels.max())) + 1
  confusion = np.bincount(labels * k + predictions, minlength=k * k).reshape(
      k, k).astype(np.float64)  # [true, predicted]
  true, predicted = confusion.sum(1), confusion.sum(0)
  correct, total = np.trace(confusion), confusion.sum()
  numerator = correct * total - true @ predicted
  denominator = math.sqrt((total ** 2 - predicted @ predicted) *
                          (total ** 2 - true @ true))
  return float(numerator / denominator) if denominator else 0.0


def _correlation(kind: str, predictions, labels) -> float:
  predictions, labels = _arrays(predictions, labels)
  predictions = predictions.astype(np.float64).ravel()
  labels = labels.astype(np.float64).ravel()
  # Undefined for constant inputs (an untrained head): 0, not NaN, so model
  # selection and logs stay numeric.
  if labels.size < 2 or np.ptp(predictions) == 0 or np.ptp(labels) == 0:
    return 0.0
  from scipy import stats  # pylint: disable=g-import-not-at-top
  fn = stats.pearsonr if kind == 'pearson' else stats.spearmanr
  value = float(fn(predictions, labels)[0])
  return value if math.isfinite(value) else 0.0


def pearson(predictions, labels, label_names=()) -> float:
  """Pearson correlation (scipy.stats.pearsonr); 0 for constant inputs."""
  del label_names
  return _correlation('pearson', predictions, labels)


def spearman(predictions, labels, label_names=()) -> float:
  """Spearman rank correlation, ties at their mean rank (scipy)."""
  del label_names
  return _correlation('spearman', predictions, labels)


def normalize_answer(text: str) -> str:
  """SQuAD v1.1's normalization: lower case, no punctuation, no articles
  (a, an, the), single spaces."""
  text = text.lower()
  text = ''.join(c for c in text if c not in _PUNCTUATION)
  text = re.sub(r'\b(a|an|the)\b', ' ', text)
  return ' '.join(text.split())


_PUNCTUATION = frozenset(string.punctuation)


def _answer_f1(prediction: str, gold: str) -> float:
  predicted, truth = normalize_answer(prediction).split(), normalize_answer(
      gold).split()
  same = sum((collections.Counter(predicted) &
              collections.Counter(truth)).values())
  if not same:
    return 0.0
  precision, recall = same / len(predicted), same / len(truth)
  return 2 * precision * recall / (precision + recall)


def _span_scores(predictions: dict, examples: list[dict],
                 score: Callable[[str, str], float]) -> float:
  """Mean over examples of the best score against any gold answer; an
  example without a prediction scores 0 (as SQuAD's evaluate-v1.1.py)."""
  if not isinstance(predictions, dict):
    raise TaskError('span predictions must be a dict of example id -> answer '
                    f'text (span_predictions gives one), not '
                    f'{type(predictions).__name__}.')
  if not examples:
    return 0.0
  total = 0.0
  for ex in examples:
    prediction = predictions.get(ex['id'])
    golds = [a['text'] for a in ex['answers']]
    if prediction is not None and golds:
      total += max(score(prediction, g) for g in golds)
  return total / len(examples)


def exact_match(predictions, labels, label_names=()) -> float:
  """SQuAD v1.1 exact match; ``labels`` are the examples (gold answers)."""
  del label_names
  return _span_scores(predictions, labels, lambda p, g: float(
      normalize_answer(p) == normalize_answer(g)))


def span_f1(predictions, labels, label_names=()) -> float:
  """SQuAD v1.1 token-overlap F1; ``labels`` are the examples."""
  del label_names
  return _span_scores(predictions, labels, _answer_f1)


def _split_tag(tag: str) -> tuple[str, str]:
  if tag[:2] in ('B-', 'I-'):
    return tag[0], tag[2:]
  return 'O', ''  # 'O' and any tag without a B-/I- prefix.


def entity_chunks(tags: Sequence[str]) -> set[tuple[int, int, str]]:
  """(start, end, type) of the entities in one sentence's BIO or IOB1 tags.

  conlleval's rules: an entity starts at B-X, or at I-X after O or after a
  tag of another type; it ends before O, B-, or a tag of another type. Tags
  without a B-/I- prefix count as O (E-/S- schemes are not supported).
  """
  chunks, start = set(), None
  prev_tag, prev_type = 'O', ''
  for i, name in enumerate(list(tags) + ['O']):
    tag, type_ = _split_tag(name)
    if start is not None and (
        tag in ('B', 'O') or (prev_tag != 'O' and prev_type != type_)):
      chunks.add((start, i, prev_type))
      start = None
    if tag == 'B' or (tag == 'I' and (prev_tag == 'O' or prev_type != type_)):
      start = i
    prev_tag, prev_type = tag, type_
  return chunks


def entity_f1(predictions, labels, label_names=()) -> float:
  """Entity-level micro F1 as conlleval computes it.

  Args:
    predictions, labels: int [N, L] (or [L]) tag ids into ``label_names``
      (e.g. 'B-PER', 'I-PER', 'O'); positions whose label is -1 are skipped,
      and each row is one sentence. A predicted id outside the names is O.
    label_names: the tags.
  """
  if not label_names:
    raise TaskError('entity_f1 needs the tag names (task.label_names).')
  predictions, labels = _arrays(predictions, labels)
  if labels.ndim == 1:
    predictions, labels = predictions[None], labels[None]
  names = list(label_names)

  def tag(i):
    return names[i] if 0 <= i < len(names) else 'O'

  gold, found = set(), set()
  for row, (p, y) in enumerate(zip(predictions.reshape(-1, labels.shape[-1]),
                                   labels.reshape(-1, labels.shape[-1]))):
    keep = y != IGNORE
    gold |= {(row,) + c for c in entity_chunks([tag(i) for i in
                                                y[keep].tolist()])}
    found |= {(row,) + c for c in entity_chunks([tag(i) for i in
                                                 p[keep].tolist()])}
  correct = len(gold & found)
  if not correct:
    return 0.0
  precision, recall = correct / len(found), correct / len(gold)
  return 2 * precision * recall / (precision + recall)


METRICS: dict[str, Callable[..., float]] = {
    'accuracy': accuracy,
    'token_accuracy': accuracy,  # accuracy skips the -1 positions already.
    'f1': f1,
    'matthews': matthews,
    'pearson': pearson,
    'spearman': spearman,
    'exact_match': exact_match,
    'span_f1': span_f1,
    'entity_f1': entity_f1,
}


def evaluate(task: Task, predictions, labels=None) -> dict[str, float]:
  """Every metric of ``task.metrics`` (Python floats, not percentages).

  Args:
    task: the task (its kind, metrics and label names).
    predictions: classification int [N]; regression float [N]; token int
      [N, L]; span a dict example id -> answer text (``span_predictions``).
    labels: like predictions (token: -1 where there is none); span: the
      evaluation examples (default ``task.eval``).
  """
  if labels is None:
    if task.kind != 'span':
      raise TaskError(f'evaluate needs labels for a {task.kind} task.')
    labels = task.eval
  return {name: float(METRICS[name](predictions, labels, task.label_names))
          for name in task.metrics}
