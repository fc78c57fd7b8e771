"""Downstream tasks for fine-tuning: loading, encoding and metrics.

A task (``Task``) is a list of training and a list of evaluation examples of
one of four kinds:

  classification: {'text': str, 'text_pair': str | None, 'label': int}
  regression:     {'text': str, 'text_pair': str | None, 'label': float}
  token:          {'words': list[str], 'labels': list[int]}  (one per word)
  span:           {'id': str, 'question': str, 'context': str,
                   'answers': [{'text': str, 'start': int}, ...]}
                  (``start``: character offset of the answer in context)

Tasks come from three places: ``embedded_task`` and ``embedded_top4_task``
(built from the standard library's docstrings, the same text bertjax
pretrains on by default, so they run with no download), ``load_files``
(JSON Lines or CSV) and ``load_tfds`` (GLUE, SQuAD v1.1, CoNLL-2003).
``encode`` turns examples into fixed-shape numpy arrays with our
SentencePiece ``Tokenizer`` in BERT's layout ([CLS] A [SEP] B [SEP]);
``evaluate`` scores predictions with the task's metrics (``METRICS``), the
first of which is its headline.

The modules, one concern each:

  base.py      the task kinds (``KINDS``), the ignored label (``IGNORE``) and
               ``TaskError``; imports none of the others.
  tasks.py     the ``Task`` type.
  embedded.py  ``embedded_task`` and ``embedded_top4_task``.
  files.py     ``load_files`` and the checks of task files.
  tfds.py      ``load_tfds``.
  encoding.py  ``encode`` (and ``truncate_pair``, ``token_char_spans``) and
               ``span_predictions``, the answers read back from span logits,
               and ``word_tags``, a token task's tags of every word.
  metrics.py   ``METRICS``, ``evaluate`` and ``per_seed``.

Pure numpy and Python: no JAX, so the harness encodes and scores on the host.
"""

from data_pipelines.downstream.base import IGNORE
from data_pipelines.downstream.base import KINDS
from data_pipelines.downstream.base import TaskError
from data_pipelines.downstream.embedded import EMBEDDED_NAME
from data_pipelines.downstream.embedded import EMBEDDED_TOP4_NAME
from data_pipelines.downstream.embedded import embedded_task
from data_pipelines.downstream.embedded import embedded_top4_task
from data_pipelines.downstream.encoding import encode
from data_pipelines.downstream.encoding import span_predictions
from data_pipelines.downstream.encoding import token_char_spans
from data_pipelines.downstream.encoding import truncate_pair
from data_pipelines.downstream.encoding import word_tags
from data_pipelines.downstream.files import load_files
from data_pipelines.downstream.metrics import accuracy
from data_pipelines.downstream.metrics import entity_chunks
from data_pipelines.downstream.metrics import entity_f1
from data_pipelines.downstream.metrics import evaluate
from data_pipelines.downstream.metrics import exact_match
from data_pipelines.downstream.metrics import f1
from data_pipelines.downstream.metrics import matthews
from data_pipelines.downstream.metrics import METRICS
from data_pipelines.downstream.metrics import normalize_answer
from data_pipelines.downstream.metrics import pearson
from data_pipelines.downstream.metrics import per_seed
from data_pipelines.downstream.metrics import span_f1
from data_pipelines.downstream.metrics import spearman
from data_pipelines.downstream.tasks import Task
from data_pipelines.downstream.tfds import load_tfds
from data_pipelines.downstream.tfds import TFDS_TASKS
from data_pipelines.downstream.tfds import tfds_kind

__all__ = [
    'EMBEDDED_NAME', 'EMBEDDED_TOP4_NAME', 'IGNORE', 'KINDS', 'METRICS',
    'TFDS_TASKS', 'Task', 'TaskError', 'accuracy', 'embedded_task',
    'embedded_top4_task', 'encode', 'entity_chunks',
    'entity_f1', 'evaluate', 'exact_match', 'f1', 'load_files', 'load_tfds',
    'matthews', 'normalize_answer', 'pearson', 'per_seed', 'span_f1',
    'span_predictions', 'spearman', 'tfds_kind', 'token_char_spans',
    'truncate_pair', 'word_tags',
]
