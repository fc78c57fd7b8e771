"""Pretraining objectives: one module per family, found by name.

- ``bert``: MLM with NSP/SOP and SpanBERT's SBO by weight (BERT, RoBERTa,
  ALBERT, SpanBERT, ERNIE, BERT-wwm);
- ``electra``: replaced token detection with a generator;
- ``distillation``: a DistilBERT student and its frozen teacher;
- ``tinybert``: a TinyBERT student distilled layer by layer;
- ``mobilebert``: a MobileBERT student, progressive knowledge transfer
  from an IB-BERT teacher, then pretraining distillation.

Each module declares its ``Objective`` (objectives/base.py: config
section and checks, task, fine-tuning and export encoder) and registers it
(objectives/registry.py); ``get(cfg.objective.name)`` finds it. The loss
functions they share are in objectives/losses.py.

Every module of this package is imported here, so a new objective is a new
file in this folder and nothing else.
"""

import importlib
import pkgutil

from bertjax.objectives import registry
from bertjax.objectives.base import Objective
from bertjax.objectives.base import Task

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f'{__name__}.{_module.name}')

get = registry.get
names = registry.names
register = registry.register
sections = registry.sections
unregister = registry.unregister

__all__ = ('Objective', 'Task', 'get', 'names', 'register', 'sections',
           'unregister')
