"""Self-supervised tasks beyond masking, built on the fly on the host.

Each task is one module of this package that declares a ``HostTask`` and
registers it (``register(TASK)`` at its end); importing the package imports
every module, so a new task is a new file here and nothing else. A task
says:

- its config section ``cfg.tasks.<name>``: ``weight`` (0 = off) and its own
  knobs (``defaults``), and what is wrong with them (``check``);
- the batch fields it adds, built from a batch of instances by ``apply``
  (vectorized numpy, every draw counter-based on the row's
  ``example_index`` and ``mask_epoch``, so a resumed run rebuilds the same
  bytes), or by the instance builder itself (``apply`` None: a layout's
  sentence-pair label, or a field the builder computes from whole
  documents);
- its head on the encoder (``head``): ``token`` (classes per position),
  ``sentence`` (classes per row, from [CLS]) or ``pointer`` (a position per
  row), with ``num_classes`` classes, and where its labels and their
  weights are in the batch. bertjax/objectives/auxiliary.py builds the
  heads, losses and metrics from these declarations.

A task that rewrites ``input_ids`` (``corrupts``) runs before MLM masking,
so masking chooses among the corrupted tokens and predicts them; the other
tasks only read the batch. A batch gets at most one corrupting task (their
labels are positions of the sequence each one builds), and none that
leaves tokens without the builder's facts about them (``new_tokens``)
next to a task that labels those facts (``token_facts``).
"""

import importlib
import pkgutil

from data_pipelines.tasks.base import batch_fields
from data_pipelines.tasks.base import get
from data_pipelines.tasks.base import HEADS
from data_pipelines.tasks.base import HostTask
from data_pipelines.tasks.base import names
from data_pipelines.tasks.base import params_of
from data_pipelines.tasks.base import present_field
from data_pipelines.tasks.base import register
from data_pipelines.tasks.base import run_params
from data_pipelines.tasks.base import token_task
from data_pipelines.tasks.base import token_weights

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f'{__name__}.{_module.name}')

__all__ = ('HEADS', 'HostTask', 'batch_fields', 'get', 'names',
           'params_of', 'present_field', 'register', 'run_params',
           'token_task', 'token_weights')
