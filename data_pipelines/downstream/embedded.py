"""The embedded tasks, built from the text bertjax pretrains on by default
(``corpus.py``'s embedded corpus), so they run with no download:

  embedded       which standard-library package does this docstring
                 paragraph come from? (the 8 largest packages)
  embedded_top4  the same question over the 4 largest packages only
                 (asyncio, email, idlelib, tkinter on CPython 3.11): fewer,
                 more distinct classes, and all of their paragraphs

Both split train/eval by the same hash of a paragraph's text, so no
paragraph of either task's eval set is in either task's training set.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import inspect
import os
import re
import sysconfig

import numpy as np

from data_pipelines import corpus as corpus_lib
from data_pipelines.downstream import base
from data_pipelines.downstream import tasks

EMBEDDED_NAME = 'embedded'
EMBEDDED_TOP4_NAME = 'embedded_top4'
# The packages with the most paragraphs become the classes; a package needs
# enough paragraphs that its eval share (~20%) is not a handful.
_EMBEDDED_CLASSES = 8
_TOP4_CLASSES = 4
_EMBEDDED_MIN_PARAGRAPHS = 40
_EVAL_PERCENT = 20


def _prose_paragraphs(docstring: str) -> list[str]:
  """The docstring's prose paragraphs (as corpus.py keeps them), one line each.

  Paragraphs are split at blank lines after ``inspect.cleandoc``; code,
  doctests and tables are dropped by ``corpus.is_prose``; the paragraph's
  lines are joined with spaces and cleaned.
  """
  paragraphs = re.split(r'\n\s*\n', inspect.cleandoc(docstring))
  return [corpus_lib.clean_text(' '.join(p.strip('\n').splitlines()))
          for p in paragraphs if corpus_lib.is_prose(p)]


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
    for docstring in corpus_lib.module_docstrings(corpus_lib.read_text(file)):
      for paragraph in _prose_paragraphs(docstring):
        owners[paragraph].add(parts[0])
  packages: dict[str, list[str]] = collections.defaultdict(list)
  for paragraph, names in owners.items():
    # Boilerplate shared by two packages carries no signal: drop it.
    if len(names) == 1:
      packages[next(iter(names))].append(paragraph)
  return {name: tuple(sorted(texts)) for name, texts in packages.items()}


def _class_packages(packages: dict[str, tuple[str, ...]], num_classes: int
                    ) -> list[str]:
  """The classes: the ``num_classes`` largest packages with enough
  paragraphs, by name."""
  ranked = sorted(packages.items(), key=lambda kv: (-len(kv[1]), kv[0]))
  names = sorted(name for name, texts in ranked[:num_classes]
                 if len(texts) >= _EMBEDDED_MIN_PARAGRAPHS)
  if len(names) < 2:
    raise base.TaskError(
        f'the embedded tasks found {len(names)} standard-library packages '
        f'with at least {_EMBEDDED_MIN_PARAGRAPHS} docstring paragraphs under '
        f'{sysconfig.get_paths()["stdlib"]}; they need 2. This Python install '
        'looks stripped of its sources; use task files (load_files) or a TFDS '
        'task (load_tfds) instead.')
  return names


def _split_by_hash(packages: dict[str, tuple[str, ...]], names: list[str]
                   ) -> tuple[list[dict], list[dict]]:
  """Train and eval examples of the classes ``names``, in hash order; a
  paragraph is eval when its hash falls in the first ``_EVAL_PERCENT``."""
  keyed = sorted((_stable_digest(text), text, label)
                 for label, name in enumerate(names) for text in packages[name])
  train, eval_ = [], []
  for digest, text, label in keyed:
    split = eval_ if int.from_bytes(digest[:8], 'big') % 100 < _EVAL_PERCENT \
        else train
    split.append({'text': text, 'text_pair': None, 'label': label})
  return train, eval_


def _first_per_class(train: list[dict], examples_per_class: int, seed: int
                     ) -> list[dict]:
  """The first ``examples_per_class`` of each class in an order drawn from
  ``seed``; kept in their original order."""
  order = np.random.default_rng(seed).permutation(len(train))
  kept, counts = [], collections.Counter()
  for i in order:
    label = train[i]['label']
    if counts[label] < examples_per_class:
      counts[label] += 1
      kept.append(int(i))
  return [train[i] for i in sorted(kept)]


def _package_task(name: str, num_classes: int, examples_per_class: int,
                  seed: int) -> tasks.Task:
  """Task ``name``: the package of a paragraph, over the ``num_classes``
  largest packages (``embedded_task`` says how)."""
  if examples_per_class < 0:
    raise base.TaskError(f'examples_per_class={examples_per_class} must be '
                         '>= 0 (0 = all).')
  packages = _package_paragraphs()
  names = _class_packages(packages, num_classes)
  train, eval_ = _split_by_hash(packages, names)
  if examples_per_class:
    train = _first_per_class(train, examples_per_class, seed)
  return tasks.Task(name, 'classification', tuple(names), ('accuracy', 'f1'),
                    train, eval_)


def embedded_task(examples_per_class: int = 0, seed: int = 0) -> tasks.Task:
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
  return _package_task(EMBEDDED_NAME, _EMBEDDED_CLASSES, examples_per_class,
                       seed)


def embedded_top4_task(examples_per_class: int = 0, seed: int = 0
                       ) -> tasks.Task:
  """Which of the four largest standard-library packages does a docstring
  paragraph come from?

  ``embedded_task`` over its ``_TOP4_CLASSES`` largest packages only
  (asyncio, email, idlelib and tkinter on CPython 3.11), with the same
  paragraphs, labels (re-numbered: the classes sorted by name) and hash
  split: its examples are the embedded task's examples of those packages,
  in the same order. Four more distinct classes with all their paragraphs
  make a larger, easier task (about two thirds of the embedded task's
  training set, 2,401 examples on CPython 3.11).

  Args:
    examples_per_class: 0 keeps every training example; N keeps the first N
      of each class in an order drawn from ``seed``. Evaluation is never
      subsampled.
    seed: picks the kept training examples.

  Raises:
    TaskError: fewer than two packages qualify (a stripped Python install).
  """
  return _package_task(EMBEDDED_TOP4_NAME, _TOP4_CLASSES, examples_per_class,
                       seed)
