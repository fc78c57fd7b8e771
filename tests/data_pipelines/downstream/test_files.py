"""Tests for data_pipelines.downstream.files: tasks from task files."""

import csv
import json

import pytest

from data_pipelines import downstream
from data_pipelines.downstream import TaskError


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


def test_a_byte_order_mark_and_unicode_line_separators(tmp_path):
  """Excel's "CSV UTF-8" and Windows editors' JSONL start with a byte-order
  mark; JSON keeps U+2028 unescaped in a string: all read as written."""
  (tmp_path / 'a.csv').write_bytes(
      '\ufefftext,label\ngood film,pos\nbad film,neg\n'.encode())
  task = downstream.load_files('classification', str(tmp_path / 'a.csv'),
                               str(tmp_path / 'a.csv'))
  assert [e['text'] for e in task.train] == ['good film', 'bad film']
  (tmp_path / 'a.jsonl').write_text('\ufeff' + ''.join(
      json.dumps(r, ensure_ascii=False) + '\n' for r in [
          {'text': 'one\u2028line', 'label': 'pos'},
          {'text': 'two', 'label': 'neg'}]), encoding='utf-8')
  task = downstream.load_files('classification', str(tmp_path / 'a.jsonl'),
                               str(tmp_path / 'a.jsonl'))
  assert [e['text'] for e in task.train] == ['one\u2028line', 'two']


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


def test_integer_label_names_read_the_same_in_jsonl_and_csv(tmp_path):
  """Star ratings '1'..'5': a JSON 5 and a CSV '5' are both class '5' (an
  id reading would shift JSON labels by one and refuse 5)."""
  stars = ('1', '2', '3', '4', '5')
  rows = [{'text': f't{i}', 'label': i} for i in range(1, 6)]
  jsonl = _jsonl(tmp_path / 'a.jsonl', rows)
  csv_path = _csv(tmp_path / 'a.csv', ['text', 'label'],
                  [[r['text'], str(r['label'])] for r in rows])
  for path in (jsonl, csv_path):
    task = downstream.load_files('classification', path, path,
                                 label_names=stars)
    assert [e['label'] for e in task.train] == [0, 1, 2, 3, 4]
  # A CSV written with a space after each comma: ' 5' is class '5', and
  # ' pos' the class 'pos' (not a class of its own).
  spaced = tmp_path / 'spaced.csv'
  spaced.write_text('text,label\nt1, 1\nt5, 5\nt2,2\n')
  train = downstream.load_files('classification', str(spaced), str(spaced),
                                label_names=stars).train
  assert [e['label'] for e in train] == [0, 4, 1]
  spaced.write_text('text,label\ngood, pos\nbad,neg\nfine,pos \n')
  task = downstream.load_files('classification', str(spaced), str(spaced))
  assert task.label_names == ('neg', 'pos')
  assert [e['label'] for e in task.train] == [1, 0, 1]
  # Names that are not all integers still take ids into them ...
  ids = _jsonl(tmp_path / 'ids.jsonl', [{'text': 'a', 'label': 1},
                                        {'text': 'b', 'label': 'neg'}])
  task = downstream.load_files('classification', ids, ids,
                               label_names=('neg', 'pos'))
  assert [e['label'] for e in task.train] == [1, 0]
  # ... unless a label is a name of one class and the id of another.
  with pytest.raises(TaskError, match=r"label 1 is both the name of class 0 "
                     r'and the id of class 1'):
    downstream.load_files('classification', ids, ids,
                          label_names=('1', 'neg'))


def test_csv_rows_with_surplus_cells_and_non_utf8_files_are_refused(
    tmp_path):
  # An unquoted comma: 'I liked it' would become the label.
  (tmp_path / 'a.csv').write_text('text,label\ngood,pos\n'
                                  'well, I liked it,pos\n')
  with pytest.raises(TaskError, match=r'a\.csv:3: 3 cells but the header '
                     r'has 2 \(text, label\)\. Quote fields'):
    downstream.load_files('classification', str(tmp_path / 'a.csv'),
                          str(tmp_path / 'a.csv'))
  for name, line, end in (('b.csv', 3, '\n'), ('b.jsonl', 2, '\n'),
                          ('c.csv', 3, '\r'), ('d.csv', 3, '\r\n')):
    rows = ('text,label\nok,pos\ncaf\xe9,neg\n' if name.endswith('csv') else
            '{"text": "ok", "label": "pos"}\n'
            '{"text": "caf\xe9", "label": "neg"}\n').replace('\n', end)
    (tmp_path / name).write_bytes(rows.encode('latin-1'))
    with pytest.raises(TaskError, match=name.replace('.', r'\.') +
                       f':{line}: not UTF-8 \\(byte 0xe9'):
      downstream.load_files('classification', str(tmp_path / name),
                            str(tmp_path / name))


def test_iobes_tags_are_refused_for_entity_f1(tmp_path):
  path = _jsonl(tmp_path / 'ner.jsonl', [
      {'words': ['Ada', 'Lovelace', 'wrote'],
       'labels': ['B-PER', 'E-PER', 'O']},
      {'words': ['Paris'], 'labels': ['S-LOC']}])
  with pytest.raises(TaskError, match=r"tags \['E-PER', 'S-LOC'\] are "
                     'IOBES/BILOU'):
    downstream.load_files('token', path, path)
