"""Word starts and unit labels from annotated spans, alone and end to end."""

import json
import os

import numpy as np
import pytest

from bertjax import config_lib
from data_pipelines import annotations
from data_pipelines import gazetteer
from data_pipelines import pretokenize

B_ENT, I_ENT = gazetteer.ENTITY_BEGIN, gazetteer.ENTITY_INSIDE
B_PHR, I_PHR = gazetteer.PHRASE_BEGIN, gazetteer.PHRASE_INSIDE


def _tokens(sentence, pieces):
  """Ends of ``pieces`` (strings that concatenate to ``sentence``)."""
  assert ''.join(pieces) == sentence
  return np.cumsum([len(p) for p in pieces])


def test_word_spans_replace_the_tokenizer_word_starts():
  # 我 | 喜欢 | 北京 | 大学, tokenized one character a token; the tokenizer
  # would call every token a word start.
  ends = _tokens('我喜欢北京大学', list('我喜欢北京大学'))
  spans = [(0, 1, 'word'), (1, 3, 'word'), (3, 7, 'word')]
  word_starts, labels = annotations.token_labels(ends, spans,
                                                 np.ones(7, bool))
  assert word_starts.tolist() == [1, 1, 0, 1, 0, 0, 0]
  assert not labels.any()


def test_tokens_outside_word_spans_keep_the_tokenizer_flags():
  ends = _tokens('ab cd ef', ['a', 'b', ' c', 'd', ' e', 'f'])
  tokenizer_flags = np.array([1, 0, 1, 0, 1, 0], bool)
  # One word span over "b c": it splits "ab" and joins across the space.
  word_starts, _ = annotations.token_labels(ends, [(1, 4, 'word')],
                                            tokenizer_flags)
  # Words: a | b c | d | e f. "d" starts a word because the span ended;
  # "e" and "f" keep the tokenizer's flags.
  assert word_starts.tolist() == [1, 1, 0, 1, 1, 0]


def test_units_widen_to_whole_words_and_keep_the_first_of_overlaps():
  sentence = 'New York City is big'
  pieces = ['New', ' Yo', 'rk', ' City', ' is', ' big']
  ends = _tokens(sentence, pieces)
  flags = np.array([1, 1, 0, 1, 1, 1], bool)
  spans = [(0, 6, 'entity'),      # "New Yo": widened to "New York".
           (4, 13, 'entity'),     # Overlaps the first: dropped.
           (14, 20, 'phrase')]    # "is big".
  word_starts, labels = annotations.token_labels(ends, spans, flags)
  assert word_starts.tolist() == flags.tolist()
  assert labels.tolist() == [B_ENT, I_ENT, I_ENT, 0, B_PHR, I_PHR]


def test_a_span_over_no_token_marks_nothing():
  ends = _tokens('ab', ['ab'])
  _, labels = annotations.token_labels(ends, [(0, 1, 'entity')],
                                       np.ones(1, bool))
  assert labels.tolist() == [0]  # "a" holds no token's last character.


# ---------------------------------------------------------------------------
# End to end: JSON Lines -> pre-tokenized records.

_NAMES = ['Anna Karenina', 'Port Moresby', 'Rio de Janeiro', 'Tel Aviv']
_FILLER = ('the of and to in a was for on with by as at from that this '
           'river city book train north south old new small large').split()


def _write_jsonl_corpus(path, num_docs=40, seed=0):
  rng = np.random.default_rng(seed)
  os.makedirs(path)
  with open(os.path.join(path, 'docs.jsonl'), 'w', encoding='utf-8') as f:
    for _ in range(num_docs):
      sentences, spans = [], []
      offset = 0
      for _ in range(rng.integers(3, 8)):
        words = list(rng.choice(_FILLER, rng.integers(4, 10)))
        name = str(rng.choice(_NAMES))
        position = int(rng.integers(0, len(words)))
        before = ' '.join(['We'] + words[:position]) + ' '
        sentence = before + name + ' ' + ' '.join(words[position:]) + '.'
        start, end = offset + len(before), offset + len(before) + len(name)
        # The name is an entity and, by the user's segmentation, one word.
        spans += [[start, end, 'entity'], [start, end, 'word']]
        sentences.append(sentence)
        offset += len(sentence) + 1
      f.write(json.dumps({'sentences': sentences, 'spans': spans}) + '\n')


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('annotated'))
  _write_jsonl_corpus(os.path.join(directory, 'corpus'))
  cfg = config_lib.base_config()
  cfg.data.corpus.source = 'files'
  cfg.data.corpus.path = os.path.join(directory, 'corpus')
  cfg.data.corpus.text_format = 'jsonl'
  cfg.data.data_dir = os.path.join(directory, 'data')
  cfg.data.tokenizer.vocab_size = 200
  cfg.data.eval_fraction = 0.2
  return pretokenize.prepare(cfg.data, num_threads=2)


def test_records_carry_the_annotated_entities_and_words(prepared):
  tok = prepared.tokenizer
  units = 0
  for source in (prepared.train_source, prepared.eval_source):
    for d in range(len(source)):
      record = source[d]
      labels, ids = record['unit_labels'], record['token_ids']
      csum = np.concatenate([[0], np.cumsum(record['sentence_lengths'])])
      for s in range(len(csum) - 1):  # One entity in every sentence.
        sentence = slice(csum[s], csum[s + 1])
        begins = np.flatnonzero(labels[sentence] == B_ENT)
        assert len(begins) == 1
        first = csum[s] + begins[0]
        end = first + 1
        while end < csum[s + 1] and labels[end] == I_ENT:
          end += 1
        assert not np.isin(labels[sentence], [B_PHR, I_PHR]).any()
        assert (labels[sentence] != 0).sum() == end - first
        assert tok.decode(ids[first:end]).strip() in _NAMES
        # One word by the supplied segmentation, though the tokenizer
        # starts a word at each of its parts.
        assert record['word_starts'][first]
        assert not record['word_starts'][first + 1:end].any()
        assert tok.word_starts(ids[first + 1:end]).any()
        assert end == csum[s + 1] or record['word_starts'][end]
        units += 1
  assert units >= 120
