"""ERNIE 2.0's token-document relation (Sun et al., AAAI 2020, Sec. 4.2.1).

"This task predicts whether the token in a segment appears in other
segments of the original document. Empirically, the words that appear in
many parts of a document are usually commonly-used words or relevant with
the main topics of the document. Therefore, through identifying the
frequently-occurring words of a document appearing in the segment, the
task can enable the ability of a model to capture the key words of the
document to some extent."

Per real token (not [CLS], [SEP] or padding): 1 when its id occurs in its
document outside the part of the document that the row uses, else 0. The
instance builder computes the labels from the whole documents, which it
reads anyway (``InstanceConfig.token_document``, the batch's
``token_document_labels``); the task adds their weights.
"""

from __future__ import annotations


from data_pipelines.tasks.base import register
from data_pipelines.tasks.base import token_task
from data_pipelines.tasks.base import token_weights

LABELS = 'token_document_labels'
WEIGHTS = 'token_document_weights'


def token_document_fields(batch: dict, params: dict, seed: int) -> dict:
  """The task's weights for the builder's labels.

  Args:
    batch: ``token_document_labels`` int32 [B, L] and ``sentence_ids``
      int32 [B, L] (-1 on [CLS], [SEP] and padding).
    params: the task's knobs (none used).
    seed: the data seed (no draws).

  Returns:
    A new dict: ``batch`` and ``token_document_weights`` float32 [B, L], 1
    on every real token that is not [CLS] or [SEP].
  """
  del params, seed
  if LABELS not in batch:
    raise ValueError(f'the batch has no {LABELS}: build its instances with '
                     'InstanceConfig(token_document=True).')
  out = dict(batch)
  out[WEIGHTS] = token_weights(batch)
  return out


TOKEN_DOCUMENT = register(token_task(
    'token_document', token_document_fields,
    corrupts=False,
    token_facts=True,
    instance_flags=('token_document',),
    description='ERNIE 2.0 token-document relation: does the token occur '
                'elsewhere in its document?'))
