"""Gazetteer parsing and matching on word boundaries."""

import random

import pytest

from data_pipelines import gazetteer as gazetteer_lib
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.gazetteer import (ENTITY_BEGIN, ENTITY_INSIDE, OUTSIDE,
                                      PHRASE_BEGIN, PHRASE_INSIDE)

WORDS = ['new', 'york', 'city', 'in', 'spite', 'of', 'the', 'rain', 'went',
         'to', 'newark', 'yorkshire', 'we', 'walked']


@pytest.fixture(scope='module')
def tokenizer():
  rng = random.Random(0)
  sentences = [' '.join(rng.choice(WORDS) for _ in range(10))
               for _ in range(3000)]
  return tokenizer_lib.train(iter(sentences), 60, 'unigram')


@pytest.fixture
def gazetteer(tmp_path, tokenizer):
  path = tmp_path / 'gazetteer.txt'
  path.write_text('new york\nnew york city\n\nphrase\tin spite of\n')
  return gazetteer_lib.Gazetteer.load(str(path), tokenizer)


def _label(gazetteer, tokenizer, text):
  ids = tokenizer.encode([text])[0]
  return [tokenizer.id_to_piece(i) for i in ids], gazetteer.label(
      ids, tokenizer.word_starts(ids))


def _labels_by_word(pieces, labels):
  """The label of each word's first piece, and whether all pieces agree."""
  out = []
  for piece, label in zip(pieces, labels):
    if piece.startswith('\u2581'):
      out.append(int(label))
  return out


def test_longest_entry_wins_and_phrases_are_labelled(gazetteer, tokenizer):
  assert gazetteer.num_entries == 3
  pieces, labels = _label(gazetteer, tokenizer,
                          'we went to new york city in spite of the rain')
  assert _labels_by_word(pieces, labels) == [
      OUTSIDE, OUTSIDE, OUTSIDE, ENTITY_BEGIN, ENTITY_INSIDE, ENTITY_INSIDE,
      PHRASE_BEGIN, PHRASE_INSIDE, PHRASE_INSIDE, OUTSIDE, OUTSIDE]
  # Every piece of a labelled word continues the unit.
  for piece, label in zip(pieces, labels):
    if not piece.startswith('\u2581') and label:
      assert label in (ENTITY_INSIDE, PHRASE_INSIDE)


def test_matches_only_on_word_boundaries(gazetteer, tokenizer):
  # "newark" and "yorkshire" share pieces with the entries but are words of
  # their own; "new york" inside them must not match.
  for text in ('newark yorkshire', 'we walked to newark',
               'yorkshire new'):
    pieces, labels = _label(gazetteer, tokenizer, text)
    assert not labels.any(), (text, pieces, labels)


def test_every_occurrence_is_found(gazetteer, tokenizer):
  pieces, labels = _label(gazetteer, tokenizer, 'new york new york the rain')
  assert _labels_by_word(pieces, labels) == [
      ENTITY_BEGIN, ENTITY_INSIDE, ENTITY_BEGIN, ENTITY_INSIDE, OUTSIDE,
      OUTSIDE]


@pytest.mark.parametrize('content, message', [
    ('', 'no entries'),
    ('person\tnew york\n', "kind 'person'"),
])
def test_bad_files(tmp_path, tokenizer, content, message):
  path = tmp_path / 'g.txt'
  path.write_text(content)
  with pytest.raises(gazetteer_lib.GazetteerError, match=message):
    gazetteer_lib.Gazetteer.load(str(path), tokenizer)


def test_missing_file(tmp_path, tokenizer):
  with pytest.raises(gazetteer_lib.GazetteerError, match='gazetteer_path'):
    gazetteer_lib.Gazetteer.load(str(tmp_path / 'none.txt'), tokenizer)
