"""The embedded tasks, built from the text bertjax pretrains on by default
(``corpus.py``'s embedded corpus), so they run with no download:

  embedded        which standard-library package does this docstring
                  paragraph come from? (8 classes)
  embedded_pairs  do these two docstring paragraphs come from the same
                  package? (a sentence pair, yes/no; 4 pairs per paragraph,
                  so 4 times ``embedded``'s training set)

Both split train/eval by the same hash of a paragraph's text, so no
paragraph of an ``embedded`` eval example is in either task's training set.
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
EMBEDDED_PAIRS_NAME = 'embedded_pairs'
# The packages with the most paragraphs become the classes; a package needs
# enough paragraphs that its eval share (~20%) is not a handful.
_EMBEDDED_CLASSES = 8
_EMBEDDED_MIN_PARAGRAPHS = 40
_EVAL_PERCENT = 20
# Pairs per paragraph of embedded_pairs: half with a paragraph of the same
# package, half with one of another.
_PAIRS_PER_PARAGRAPH = 4
_PAIR_LABELS = ('different', 'same')
# The corpus's own readers, so the embedded task sees exactly the pretraining
# text.
_read_text = corpus_lib._read_text  # pylint: disable=protected-access
_is_prose = corpus_lib._is_prose  # pylint: disable=protected-access


def _prose_paragraphs(docstring: str) -> list[str]:
  """The docstring's prose paragraphs (as corpus.py keeps them), one line each.

  Paragraphs are split at blank lines after ``inspect.cleandoc``; code,
  doctests and tables are dropped by ``corpus._is_prose``; the paragraph's
  lines are joined with spaces and cleaned.
  """
  paragraphs = re.split(r'\n\s*\n', inspect.cleandoc(docstring))
  return [corpus_lib.clean_text(' '.join(p.strip('\n').splitlines()))
          for p in paragraphs if _is_prose(p)]


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
    for docstring in corpus_lib.module_docstrings(_read_text(file)):
      for paragraph in _prose_paragraphs(docstring):
        owners[paragraph].add(parts[0])
  packages: dict[str, list[str]] = collections.defaultdict(list)
  for paragraph, names in owners.items():
    # Boilerplate shared by two packages carries no signal: drop it.
    if len(names) == 1:
      packages[next(iter(names))].append(paragraph)
  return {name: tuple(sorted(texts)) for name, texts in packages.items()}


def _class_packages(packages: dict[str, tuple[str, ...]]) -> list[str]:
  """The classes: the largest packages with enough paragraphs, by name."""
  ranked = sorted(packages.items(), key=lambda kv: (-len(kv[1]), kv[0]))
  names = sorted(name for name, texts in ranked[:_EMBEDDED_CLASSES]
                 if len(texts) >= _EMBEDDED_MIN_PARAGRAPHS)
  if len(names) < 2:
    raise base.TaskError(
        f'the embedded task found {len(names)} standard-library packages with '
        f'at least {_EMBEDDED_MIN_PARAGRAPHS} docstring paragraphs under '
        f'{sysconfig.get_paths()["stdlib"]}; it needs 2. This Python install '
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
  _check_examples_per_class(examples_per_class)
  packages = _package_paragraphs()
  names = _class_packages(packages)
  train, eval_ = _split_by_hash(packages, names)
  if examples_per_class:
    train = _first_per_class(train, examples_per_class, seed)
  return tasks.Task(EMBEDDED_NAME, 'classification', tuple(names),
                    ('accuracy', 'f1'), train, eval_)


def _check_examples_per_class(examples_per_class: int) -> None:
  if examples_per_class < 0:
    raise base.TaskError(f'examples_per_class={examples_per_class} must be '
                         '>= 0 (0 = all).')


def _pairs(split: list[dict]) -> list[dict]:
  """``_PAIRS_PER_PARAGRAPH`` pairs for each example of ``split`` (one split
  of the embedded task), in its order: the paragraph, then a partner from
  the same split, alternately of its own package (label 1) and of another
  (label 0).

  Same-package partners are distinct paragraphs other than itself; the other
  packages are distinct, each drawn uniformly (so a partner's package says
  nothing about the label), then a paragraph in it uniformly. The draws are
  seeded by the paragraph's hash: a paragraph's pairs depend on it and its
  split's members only, never on a global order.
  """
  members = collections.defaultdict(list)
  for example in split:
    members[example['label']].append(example['text'])
  position = {text: i for texts in members.values()
              for i, text in enumerate(texts)}
  packages = sorted(members)
  half = _PAIRS_PER_PARAGRAPH // 2
  few = sorted(p for p, texts in members.items() if len(texts) <= half)
  if few:
    raise base.TaskError(f'embedded_pairs: packages {few} have {half} '
                         'paragraphs or fewer in a split, too few to pair.')
  pairs = []
  for example in split:
    text, label = example['text'], example['label']
    rng = np.random.default_rng(
        int.from_bytes(_stable_digest(text)[:8], 'big'))
    own = members[label]
    # Indices into own less the paragraph itself: skip past its position.
    same = [own[j + (j >= position[text])]
            for j in rng.choice(len(own) - 1, half, replace=False)]
    others = rng.choice([p for p in packages if p != label], half,
                        replace=False)
    different = [members[p][rng.integers(len(members[p]))] for p in others]
    for positive, negative in zip(same, different):
      pairs.append({'text': text, 'text_pair': positive, 'label': 1})
      pairs.append({'text': text, 'text_pair': negative, 'label': 0})
  return pairs


def embedded_pairs_task(examples_per_class: int = 0, seed: int = 0
                        ) -> tasks.Task:
  """Do two standard-library docstring paragraphs come from the same package?

  A sentence-pair task (labels ``different``, ``same``; accuracy and F1 of
  ``same``, as GLUE's MRPC) over the paragraphs and packages of
  ``embedded_task``, in the same hash split: a training pair joins two
  training paragraphs, an eval pair two eval paragraphs. Each paragraph
  leads ``_PAIRS_PER_PARAGRAPH`` pairs, half with a paragraph of its own
  package and half with one of another (``_pairs``), so the labels are
  exactly balanced and the training set is ``_PAIRS_PER_PARAGRAPH`` times
  ``embedded_task``'s. Deterministic: the same pairs on every machine with
  the same Python.

  Args:
    examples_per_class: 0 keeps every training pair; N keeps the first N of
      each label in an order drawn from ``seed``. Evaluation is never
      subsampled.
    seed: picks the kept training pairs.

  Raises:
    TaskError: fewer than two packages qualify (a stripped Python install).
  """
  _check_examples_per_class(examples_per_class)
  packages = _package_paragraphs()
  train, eval_ = _split_by_hash(packages, _class_packages(packages))
  train, eval_ = _pairs(train), _pairs(eval_)
  if examples_per_class:
    train = _first_per_class(train, examples_per_class, seed)
  return tasks.Task(EMBEDDED_PAIRS_NAME, 'classification', _PAIR_LABELS,
                    ('accuracy', 'f1'), train, eval_)
