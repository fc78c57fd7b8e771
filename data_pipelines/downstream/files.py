"""Tasks from task files: a training and an evaluation file, JSON Lines or CSV.

Everything is validated while loading, so a bad file fails before a model is
built, with the file, line and field in the message. Examples come out in the
package's formats (see its docstring); labels become ids.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from typing import Sequence

import numpy as np

from data_pipelines import corpus as corpus_lib
from data_pipelines.downstream import base
from data_pipelines.downstream import tasks

_FILE_FORMATS = ('.jsonl', '.csv')
_INT_LIKE = re.compile(r'-?\d+')
_METRICS = {'classification': ('accuracy', 'f1'),
            'regression': ('pearson', 'spearman'),
            'token': ('entity_f1', 'accuracy'),
            'span': ('exact_match', 'span_f1')}

# A record with where it came from ('file:line', for errors).
Located = tuple[str, dict]

# ---------------------------------------------------------------------------
# Records.


def _read_jsonl(path: str) -> list[Located]:
  records = []
  # Lines end at line breaks only (JSON keeps U+2028 unescaped in a
  # string); a byte-order mark (Windows editors write one) is not text.
  text = _read_utf8(path)
  for number, line in enumerate(corpus_lib.split_lines(text), 1):
    if not line.strip():
      continue
    where = f'{path}:{number}'
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise base.TaskError(f'{where}: not JSON ({e}); each line must be one '
                           'JSON object.') from e
    if not isinstance(record, dict):
      raise base.TaskError(f'{where}: found a JSON {type(record).__name__}; '
                           'each line must be one JSON object.')
    records.append((where, record))
  return records


def _read_csv(path: str) -> list[Located]:
  records = []
  reader = csv.DictReader(io.StringIO(_read_utf8(path), newline=''))
  for row in reader:
    where = f'{path}:{reader.line_num}'
    if None in row:
      # DictReader files surplus cells under None: an unquoted comma,
      # which shifts the label into the text.
      raise base.TaskError(
          f'{where}: {len(reader.fieldnames) + len(row[None])} cells but '
          f'the header has {len(reader.fieldnames)} '
          f'({", ".join(reader.fieldnames)}). Quote fields that hold a '
          'comma ("well, I liked it").')
    # Missing trailing cells come back as None: a missing field.
    record = {k: v for k, v in row.items() if v is not None}
    if any(v.strip() for v in record.values()):
      records.append((where, record))
  return records


def _read_utf8(path: str) -> str:
  """The text of a task file, without a byte-order mark (Excel's "CSV
  UTF-8" and Windows editors write one). Not UTF-8 is an error: replaced
  characters would change the examples unseen."""
  with corpus_lib.open_binary(path) as f:
    data = f.read()
  try:
    return data.decode('utf-8').removeprefix('\ufeff')
  except UnicodeDecodeError as e:
    # Counted at the line breaks the readers split at (\r alone too).
    line = len(re.findall(rb'\r\n|\r|\n', data[:e.start])) + 1
    raise base.TaskError(
        f'{path}:{line}: not UTF-8 (byte {data[e.start]:#04x} at offset '
        f'{e.start}). Convert the file, e.g. iconv -f latin1 -t utf-8.'
        ) from e


def _read_records(path: str) -> list[Located]:
  """(``file:line``, record) for every record of a .jsonl or .csv file."""
  if not os.path.isfile(path):
    raise base.TaskError(f'task file {path!r} does not exist.')
  ext = os.path.splitext(path)[1].lower()
  if ext not in _FILE_FORMATS:
    raise base.TaskError(
        f'task file {path!r}: unknown format {ext!r}; use one of '
        f'{_FILE_FORMATS} (JSON Lines: one object per line; CSV: a header '
        'row).')
  records = _read_jsonl(path) if ext == '.jsonl' else _read_csv(path)
  if not records:
    raise base.TaskError(f'task file {path!r} holds no examples.')
  return records


# ---------------------------------------------------------------------------
# Fields.


def _field(record: dict, name: str, where: str, argument: str = ''):
  """record[name]; a clear error naming file, line and field when missing.

  ``argument``: the load_files argument that names the field, if any.
  """
  if name not in record or record[name] is None:
    hint = (f'Set {argument} to the field that holds it.' if argument else
            'Span task files need "question", "context" and "answers".')
    raise base.TaskError(f'{where}: no field {name!r} (the record has '
                         f'{sorted(record)}). {hint}')
  return record[name]


def _list(value, where: str, name: str) -> list:
  """A list field; in CSV, a JSON list or whitespace-separated items."""
  if isinstance(value, str):
    text = value.strip()
    if text.startswith('['):
      try:
        value = json.loads(text)
      except json.JSONDecodeError as e:
        raise base.TaskError(f'{where}: field {name!r} is not a JSON list '
                             f'({e}).') from e
    else:
      value = text.split()
  if not isinstance(value, list):
    raise base.TaskError(f'{where}: field {name!r} is a '
                         f'{type(value).__name__}, not a list.')
  return value


def _is_int_like(value) -> bool:
  if isinstance(value, bool):
    return False
  return isinstance(value, (int, np.integer)) or (
      isinstance(value, str) and bool(_INT_LIKE.fullmatch(value.strip())))


# ---------------------------------------------------------------------------
# Labels.


def _text(label) -> str:
  """A label as a name: its text without surrounding spaces (a CSV
  written "good, pos" gives ' pos', the same class as 'pos')."""
  return str(label).strip()


class _LabelMap:
  """Maps raw labels (names or ids) to ids, and knows the label names.

  With ``label_names`` given, a label is one of the names or an id into
  them; when the names are all integers (star ratings '1'..'5'), only a
  name, so that a JSON 1 and a CSV '1' are both class '1'. Without,
  labels that are all integers (or integer strings, as CSV gives them)
  keep their values as ids, named '0'..'K-1'; otherwise the sorted unique
  training labels are the names.
  """

  def __init__(self, train_values: list[tuple[str, object]],
               label_names: Sequence[str]):
    self.given = bool(label_names)
    if label_names:
      self.names = tuple(_text(x) for x in label_names)
      self.as_ids = False
    elif all(_is_int_like(v) for _, v in train_values):
      ids = [int(v) for _, v in train_values]
      negative = [(w, v) for w, v in train_values if int(v) < 0]
      if negative:
        where, value = negative[0]
        raise base.TaskError(f'{where}: label {value!r} is negative; integer '
                             'labels are ids 0..K-1.')
      self.names = tuple(str(i) for i in range(max(ids) + 1))
      self.as_ids = True
    else:
      self.names = tuple(sorted({_text(v) for _, v in train_values}))
      self.as_ids = False
    self._index = {name: i for i, name in enumerate(self.names)}
    # Given names that are all integers (star ratings '1'..'5') make an
    # integer label a name: read as an id as well, a JSON 1 (class '2')
    # and a CSV '1' (class '1') would differ.
    self._ids_allowed = self.given and not all(
        _is_int_like(name) for name in self.names)

  def __call__(self, value, where: str) -> int:
    as_id = ((self.as_ids or self._ids_allowed) and _is_int_like(value)
             and 0 <= int(value) < len(self.names))
    name = _text(value)
    as_name = not self.as_ids and name in self._index
    if as_id and as_name and self._index[name] != int(value):
      raise base.TaskError(
          f'{where}: label {value!r} is both the name of class '
          f'{self._index[name]} and the id of class {int(value)}. '
          'Write every label as one of the names.')
    if as_name:
      return self._index[name]
    if as_id:
      return int(value)
    raise base.TaskError(
        f'{where}: label {value!r} is not one of the labels {self.names}' +
        (' (nor an id into them)' if self._ids_allowed else '') + '.')


def _check_bio(names: Sequence[str], train_path: str) -> None:
  """Entity F1 reads BIO (or IOB1) tags; in IOBES or BILOU tags it would
  miss every single-word entity (S-/U-) and cut others at E-/L-."""
  other = sorted(n for n in names if n[:2] in ('E-', 'S-', 'L-', 'U-'))
  if other and any(n.startswith(('B-', 'I-')) for n in names):
    raise base.TaskError(
        f'{train_path!r}: tags {other} are IOBES/BILOU; entity F1 needs BIO '
        'tags. Convert them (S-X and U-X to B-X, E-X and L-X to I-X).')


def _check_eval_labels(eval_values, train_ids: set, train_path: str,
                       label_map: _LabelMap) -> None:
  """Every evaluation label must occur in training: a model cannot learn a
  class it never sees, and its score would be silently capped."""
  for where, value in eval_values:
    try:
      i = label_map(value, where)
    except base.TaskError:
      if label_map.given:
        raise
      i = None  # Not among the training labels (which named the classes).
    if i not in train_ids:
      raise base.TaskError(
          f'{where}: label {value!r} never occurs in the training file '
          f'{train_path!r}; a model cannot learn it. Fix the label or add '
          'training examples of it.')


def _fitted_label_map(values: dict[str, list[tuple[str, object]]],
                      train_path: str, label_names: Sequence[str]
                      ) -> tuple[_LabelMap, set[int]]:
  """The label map of the training labels, and the ids they use; checks that
  every evaluation label is among them.

  Args:
    values: split ('train', 'eval') -> (where, raw label) of every label.
  """
  label_map = _LabelMap(values['train'], label_names)
  train_ids = {label_map(v, w) for w, v in values['train']}
  _check_eval_labels(values['eval'], train_ids, train_path, label_map)
  return label_map, train_ids


def _regression_label(value, where: str) -> float:
  try:
    if isinstance(value, bool):
      raise ValueError
    label = float(value)
  except (TypeError, ValueError):
    label = math.nan
  if not math.isfinite(label):
    raise base.TaskError(f'{where}: regression label {value!r} is not a '
                         'finite number.')
  return label


# ---------------------------------------------------------------------------
# Examples, per kind. Each takes split -> located records and returns split ->
# examples, and the label names.


def _sentence_example(where: str, record: dict, text_field: str,
                      pair_field: str, label_field: str) -> dict:
  """A classification or regression example; its label still raw."""
  text = base.check_string(_field(record, text_field, where, 'text_field'),
                           where, text_field)
  pair = None
  if pair_field:
    pair = base.check_string(_field(record, pair_field, where, 'pair_field'),
                             where, pair_field)
  label = _field(record, label_field, where, 'label_field')
  return {'text': text, 'text_pair': pair, 'label': label}


def _sentence_examples(kind: str, records: dict[str, list[Located]],
                       train_path: str, text_field: str, pair_field: str,
                       label_field: str, label_names: Sequence[str]
                       ) -> tuple[dict[str, list[dict]], tuple[str, ...]]:
  splits = {split: [_sentence_example(where, record, text_field, pair_field,
                                      label_field)
                    for where, record in located]
            for split, located in records.items()}
  if kind == 'regression':
    for split, examples in splits.items():
      for (where, _), ex in zip(records[split], examples):
        ex['label'] = _regression_label(ex['label'], where)
    return splits, ()
  values = {split: [(where, ex['label']) for (where, _), ex in zip(
      records[split], examples)] for split, examples in splits.items()}
  label_map, train_ids = _fitted_label_map(values, train_path, label_names)
  if len(train_ids) < 2:
    raise base.TaskError(
        f'{train_path!r}: every training example has the label '
        f'{values["train"][0][1]!r}; classification needs at least two '
        f'classes. Check label_field={label_field!r}.')
  for split, examples in splits.items():
    for (where, _), ex in zip(records[split], examples):
      ex['label'] = label_map(ex['label'], where)
  return splits, label_map.names


def _token_example(where: str, record: dict, words_field: str,
                   labels_field: str) -> dict:
  """A token example; its tags still raw."""
  words = _list(_field(record, words_field, where, 'words_field'), where,
                words_field)
  tags = _list(_field(record, labels_field, where, 'labels_field'), where,
               labels_field)
  if len(words) != len(tags):
    raise base.TaskError(
        f'{where}: {len(words)} words but {len(tags)} labels; a token task '
        'needs one label per word.')
  return {'words': [str(w) for w in words], 'labels': tags}


def _token_examples(records: dict[str, list[Located]], train_path: str,
                    words_field: str, labels_field: str,
                    label_names: Sequence[str]
                    ) -> tuple[dict[str, list[dict]], tuple[str, ...]]:
  splits = {split: [_token_example(where, record, words_field, labels_field)
                    for where, record in located]
            for split, located in records.items()}
  values = {split: [(where, tag) for (where, _), ex in zip(records[split],
                                                           examples)
                    for tag in ex['labels']]
            for split, examples in splits.items()}
  label_map, _ = _fitted_label_map(values, train_path, label_names)
  for split, examples in splits.items():
    for (where, _), ex in zip(records[split], examples):
      ex['labels'] = [label_map(t, where) for t in ex['labels']]
  return splits, label_map.names


def _answer_list(value, where: str) -> list:
  """The answers as a list of objects: parsed if a JSON string (CSV), zipped
  if a dict of lists {text: [...], answer_start: [...]} (the TFDS and HF
  layout)."""
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise base.TaskError(f'{where}: field "answers" is not JSON ({e}).'
                           ) from e
  if isinstance(value, dict):
    starts = value.get('answer_start', value.get('start'))
    texts = value.get('text')
    if not isinstance(texts, list) or not isinstance(starts, list) or len(
        texts) != len(starts):
      raise base.TaskError(f'{where}: "answers" as a dict needs lists "text" '
                           'and "answer_start" of the same length.')
    value = [{'text': t, 'start': s} for t, s in zip(texts, starts)]
  if not isinstance(value, list) or not value:
    raise base.TaskError(f'{where}: "answers" must be a non-empty list of '
                         '{"text": ..., "answer_start": ...}.')
  return value


def _checked_answer(answer, where: str, context: str) -> dict:
  """{'text', 'start'} of one answer object, found at its offset."""
  if not isinstance(answer, dict):
    raise base.TaskError(f'{where}: answer {answer!r} is not an object.')
  text = answer.get('text')
  start = answer.get('answer_start', answer.get('start'))
  if not isinstance(text, str) or not _is_int_like(start):
    raise base.TaskError(f'{where}: answer {answer!r} needs "text" (a string)'
                         ' and "answer_start" (a character offset).')
  start = int(start)
  if context[start:start + len(text)] != text:
    raise base.TaskError(
        f'{where}: answer {text!r} is not at character {start} of the '
        f'context (found {context[start:start + len(text)]!r}); '
        '"answer_start" counts characters of the context from 0.')
  return {'text': text, 'start': start}


def _span_example(where: str, record: dict) -> dict:
  question = base.check_string(_field(record, 'question', where), where,
                               'question')
  context = base.check_string(_field(record, 'context', where), where,
                              'context')
  answers = [_checked_answer(a, where, context) for a in _answer_list(
      _field(record, 'answers', where), where)]
  return {'id': str(record.get('id', where)), 'question': question,
          'context': context, 'answers': answers}


def _span_examples(records: dict[str, list[Located]]
                   ) -> tuple[dict[str, list[dict]], tuple[str, ...]]:
  splits = {}
  for split, located in records.items():
    examples, seen = [], set()
    for where, record in located:
      example = _span_example(where, record)
      if example['id'] in seen:
        raise base.TaskError(
            f'{where}: id {example["id"]!r} repeats; predictions are keyed by'
            ' id, so each example needs its own.')
      seen.add(example['id'])
      examples.append(example)
    splits[split] = examples
  return splits, ()


def load_files(kind: str, train_path: str, eval_path: str, *,
               text_field: str = 'text', pair_field: str = '',
               label_field: str = 'label', words_field: str = 'words',
               labels_field: str = 'labels',
               label_names: Sequence[str] = ()) -> tasks.Task:
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
  base.check_kind(kind)
  records = {'train': _read_records(train_path),
             'eval': _read_records(eval_path)}
  metrics = _METRICS[kind]
  if kind in ('classification', 'regression'):
    splits, names = _sentence_examples(kind, records, train_path, text_field,
                                       pair_field, label_field, label_names)
  elif kind == 'token':
    splits, names = _token_examples(records, train_path, words_field,
                                    labels_field, label_names)
    _check_bio(names, train_path)
    if not any(n.startswith(('B-', 'I-')) for n in names):
      metrics = ('accuracy',)  # No BIO tags: entities are undefined.
  else:
    splits, names = _span_examples(records)
  return tasks.Task(f'files:{os.path.basename(train_path)}', kind, names,
                    metrics, splits['train'], splits['eval'])
