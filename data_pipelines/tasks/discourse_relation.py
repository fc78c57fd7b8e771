"""ERNIE 2.0's discourse relation task (Sun et al., AAAI 2020, Sec. 4.2.3).

"Predict the semantic or rhetorical relation between two sentences", here
as in the data ERNIE 2.0 trains on (Sileo et al., NAACL 2019): a pair of
adjacent sentences whose second opens with an explicit discourse marker,
the marker removed from the text and its index in a list the label.

The instance builder makes the pairs (``data.layout='discourse'``,
data_pipelines/instances.py and discourse.py): one read of the split finds
every sentence that opens with a marker of ``markers_path`` ('' = the
shipped English list, data_pipelines/data/discourse_markers_en.txt), and
those pairs are each epoch's instances. The head has one class per marker
of the list; the label replaces NSP's in ``next_sentence_labels``.
"""

from __future__ import annotations

from data_pipelines import discourse
from data_pipelines.tasks.base import HostTask
from data_pipelines.tasks.base import register


def _num_classes(params: dict, max_seq_length: int) -> int:
  del max_seq_length
  return len(discourse.read_markers(params.get('markers_path', '')))


def _check(params: dict, data_cfg, errors: list[str]) -> None:
  del data_cfg
  path = params.get('markers_path')
  if not isinstance(path, str):
    errors.append(f'tasks.discourse_relation.markers_path={path!r} must be '
                  "a path (a string), or '' for the shipped English list.")
    return
  try:
    discourse.read_markers(path)
  except ValueError as e:
    errors.append(f'tasks.discourse_relation.markers_path={path!r}: {e}')


DISCOURSE_RELATION = register(HostTask(
    name='discourse_relation',
    head='sentence',
    num_classes=_num_classes,
    label_field='next_sentence_labels',
    weight_field='',
    fields=lambda params, max_seq_length: {},
    apply=None,
    defaults=lambda: {'markers_path': ''},
    check=_check,
    layout='discourse',
    description='ERNIE 2.0 discourse relation: the marker removed from '
                'between two adjacent sentences.'))
