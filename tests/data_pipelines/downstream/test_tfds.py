"""Tests for data_pipelines.downstream.tfds: TFDS tasks (no network: the
reads are faked, or of a preparation built here, read as GLUE's would be,
without TensorFlow)."""

import dataclasses

import numpy as np
import pytest
import tensorflow_datasets as tfds

from data_pipelines import downstream
from data_pipelines.downstream import TaskError
from data_pipelines.downstream import tfds as tfds_lib


def test_load_tfds_unknown_name_fails_before_reading(monkeypatch):
  def fail(*args):
    raise AssertionError(f'read {args} before validating the name')
  monkeypatch.setattr(tfds_lib, '_read_tfds_split', fail)
  monkeypatch.setattr(tfds_lib, '_tfds_label_names', fail)
  with pytest.raises(TaskError, match=r"unknown TFDS task 'glue/sst3'.*"
                     r"'glue/sst2'.*'squad'.*'conll2003'"):
    downstream.load_tfds('glue/sst3')


def _fake_tfds(monkeypatch, records, names=()):
  calls = []

  def read(name, split, data_dir):
    calls.append((name, split, data_dir))
    return records[split]

  monkeypatch.setattr(tfds_lib, '_read_tfds_split', read)
  monkeypatch.setattr(tfds_lib, '_tfds_label_names',
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


class TinyGlue(tfds.core.GeneratorBasedBuilder):
  """GLUE's, CoNLL-2003's and SQuAD's feature types in one dataset, built
  in the test's directory: TFDS writes ArrayRecord without TensorFlow."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    text = tfds.features.Text()
    features = tfds.features.FeaturesDict({
        'sentence1': text, 'sentence2': text, 'idx': np.int32,
        'label': tfds.features.ClassLabel(names=['not_equivalent',
                                                 'equivalent']),
        'tokens': tfds.features.Sequence(text),
        'ner': tfds.features.Sequence(tfds.features.ClassLabel(
            names=['O', 'B-PER', 'I-PER'])),
        'id': text, 'question': text, 'context': text,
        'answers': tfds.features.Sequence({'text': text,
                                           'answer_start': np.int32})})
    return tfds.core.DatasetInfo(builder=self, features=features)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples(3),
            'validation': self._generate_examples(2)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {'sentence1': f'He said {i}.', 'sentence2': 'He spoke.',
                'idx': i, 'label': i % 2, 'tokens': ['Ann', 'met', 'Bo'],
                'ner': [1, 0, 1], 'id': f'q{i}', 'question': 'Who met?',
                'context': 'Ann met Bo.',
                'answers': {'text': ['Ann', 'Ann met'],
                            'answer_start': [0, 0]}}


@pytest.fixture(scope='module')
def tiny_glue(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  TinyGlue(data_dir=data_dir,
           file_format='array_record').download_and_prepare()
  return data_dir


def test_a_prepared_dataset_is_read_without_tensorflow(tiny_glue,
                                                       monkeypatch):
  """The reads themselves (tfds.data_source, no tf.data): each kind of
  task from a real ArrayRecord preparation, labels named by its info."""
  for name, spec in (
      ('pairs', tfds_lib._TfdsTask('classification', ('accuracy',),
                                   'sentence1', 'sentence2')),
      ('tags', tfds_lib._TfdsTask('token', ('entity_f1',))),
      ('spans', tfds_lib._TfdsTask('span', ('exact_match',)))):
    monkeypatch.setitem(tfds_lib._TFDS_TASKS, name,
                        dataclasses.replace(spec, dataset='tiny_glue'))
  pairs = downstream.load_tfds('pairs', tiny_glue)
  assert pairs.label_names == ('not_equivalent', 'equivalent')
  assert pairs.train == [{'text': f'He said {i}.', 'text_pair': 'He spoke.',
                          'label': i % 2} for i in range(3)]
  assert len(pairs.eval) == 2
  tags = downstream.load_tfds('tags', tiny_glue)
  assert tags.label_names == ('O', 'B-PER', 'I-PER')
  assert tags.eval[0] == {'words': ['Ann', 'met', 'Bo'], 'labels': [1, 0, 1]}
  spans = downstream.load_tfds('spans', tiny_glue)
  assert spans.eval[1] == {
      'id': 'q1', 'question': 'Who met?', 'context': 'Ann met Bo.',
      'answers': [{'text': 'Ann', 'start': 0}, {'text': 'Ann met', 'start': 0}]}


def test_an_unprepared_dataset_says_how_to_prepare_it(tmp_path):
  with pytest.raises(TaskError, match=(
      r"TFDS 'glue/mrpc' split 'train' is not prepared in .*tfds build "
      r'glue/mrpc --file_format=array_record --data_dir=DIR')):
    downstream.load_tfds('glue/mrpc', str(tmp_path))
  assert not list(tmp_path.iterdir())
