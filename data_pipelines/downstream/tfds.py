"""Tasks from TFDS: GLUE, SQuAD v1.1 and CoNLL-2003.

Read from a TFDS preparation in ArrayRecord format with
``tfds.data_source``, which needs no TensorFlow (``tfds.load`` and its
``tf.data`` pipeline would, and bertjax does not install it). Preparing
GLUE, SQuAD or CoNLL-2003 does (their TFDS builders import it), once, on
any machine with network access:

  pip install tensorflow tensorflow-datasets
  tfds build glue/mrpc --file_format=array_record --data_dir=DIR

then ``task.tfds_data_dir=DIR``. ``tensorflow_datasets`` is imported only
when a TFDS task is read, so the other task sources never import it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines.downstream import base
from data_pipelines.downstream import tasks


@dataclasses.dataclass(frozen=True)
class _TfdsTask:
  kind: str
  metrics: tuple[str, ...]
  text: str = ''        # Feature of segment A (classification, regression).
  pair: str = ''        # Feature of segment B ('' = single text).
  eval_split: str = 'validation'
  dataset: str = ''     # The TFDS dataset's name, if not the task's.


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


def tfds_kind(name: str) -> str:
  """The kind of the TFDS task ``name`` ('' if it is not one)."""
  return _TFDS_TASKS[name].kind if name in _TFDS_TASKS else ''


def _data_source(name: str, split: str, data_dir: str | None):
  """The prepared TFDS split (ArrayRecord), read without TensorFlow."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir,
                            download=False)
  except Exception as e:  # TFDS raises many types for "not prepared".
    why = (str(e).strip().splitlines() or [''])[0]   # Not its dataset list.
    where = data_dir or "TFDS's default data dir"
    raise base.TaskError(
        f'TFDS {name!r} split {split!r} is not prepared in {where} '
        f'({type(e).__name__}: '
        f'{why}). Prepare it once in ArrayRecord format, on any machine '
        'with network access (its TFDS builder needs TensorFlow): pip '
        'install tensorflow tensorflow-datasets && tfds build '
        f'{name} --file_format=array_record --data_dir=DIR; then set '
        'task.tfds_data_dir=DIR.') from e


def _read_tfds_split(name: str, split: str, data_dir: str | None
                     ) -> list[dict]:
  """Every record of a TFDS split, in its files' order (strings are
  bytes)."""
  source = _data_source(name, split, data_dir)
  return [source[i] for i in range(len(source))]


def _tfds_label_names(name: str, feature: str, data_dir: str | None
                      ) -> tuple[str, ...]:
  """The names of a ClassLabel feature (or of a Sequence of ClassLabel)."""
  info = _data_source(name, 'train', data_dir).dataset_info
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


def load_tfds(name: str, data_dir: str | None = None) -> tasks.Task:
  """A task from TFDS (GLUE, SQuAD v1.1, CoNLL-2003): train and its dev set.

  Evaluation uses the validation split (MNLI: validation_matched; CoNLL-2003:
  dev), as the GLUE and SQuAD test labels are hidden. Read from a
  preparation in ``data_dir`` (see the module's docstring).
  """
  if name not in _TFDS_TASKS:
    raise base.TaskError(f'unknown TFDS task {name!r}; known: {TFDS_TASKS}. '
                         'Use task files (load_files) for other datasets.')
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
      raise base.TaskError(f'TFDS {dataset!r} split {tfds_split!r} is empty.')
    splits[split] = [_tfds_example(spec, r) for r in records]
  return tasks.Task(name, spec.kind, names, spec.metrics, splits['train'],
                    splits['eval'])
