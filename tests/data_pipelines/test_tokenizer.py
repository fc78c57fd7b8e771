"""Tests for data_pipelines.tokenizer: training, special ids, save/load."""

import io
import os

import numpy as np
import pytest
import sentencepiece as spm

from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.tokenizer import Tokenizer, TokenizerError

VOCAB_SIZE = 200

_WORDS = ('the quick brown fox jumps over lazy dog while cats sleep under '
          'warm sunny windows and birds sing songs about rivers mountains '
          'forests oceans cities people travel far away from home again '
          'every morning evening night day time').split()


def _sentences(n: int = 2000, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  sentences = []
  for _ in range(n):
    words = rng.choice(_WORDS, size=rng.integers(4, 12))
    sentence = ' '.join(words).capitalize() + '.'
    if rng.random() < 0.2:
      sentence += f' It was {rng.integers(0, 100_000)}.'
    sentences.append(sentence)
  return sentences


@pytest.fixture(scope='module')
def sentences():
  return _sentences()


@pytest.fixture(scope='module')
def tok(sentences):
  return tokenizer_lib.train(sentences, VOCAB_SIZE, 'unigram', num_threads=2)


def test_specials_at_fixed_ids(tok):
  assert [tok.id_to_piece(i) for i in range(5)] == [
      '[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
  assert (tokenizer_lib.PAD_ID, tokenizer_lib.UNK_ID, tokenizer_lib.CLS_ID,
          tokenizer_lib.SEP_ID, tokenizer_lib.MASK_ID) == (0, 1, 2, 3, 4)
  assert tokenizer_lib.NUM_SPECIAL == 5


def test_vocab_size(tok):
  # hard_vocab_limit=False may stop early on a tiny corpus, never above.
  assert 100 <= tok.vocab_size <= VOCAB_SIZE
  assert tok.word_start_table.shape == (tok.vocab_size,)


def test_encode_never_produces_specials(tok, sentences):
  ids = np.concatenate(tok.encode(sentences[:200]))
  assert ids.dtype == np.int32
  assert ids.min() >= tokenizer_lib.NUM_SPECIAL
  assert ids.max() < tok.vocab_size
  # Bracketed specials in the text are plain text, not control tokens.
  ids = tok.encode(['a [MASK] and [CLS] here'])[0]
  assert not np.isin(ids, [tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID,
                           tokenizer_lib.MASK_ID, tokenizer_lib.PAD_ID]).any()


def test_encode_one_array_per_sentence(tok):
  out = tok.encode(['The fox.', '', 'Birds sing songs.'])
  assert len(out) == 3
  assert all(isinstance(x, np.ndarray) and x.dtype == np.int32 for x in out)
  assert len(out[1]) == 0
  assert tok.encode([]) == []


def test_encode_decode_round_trip(tok, sentences):
  for sentence in sentences[:50] + ['the lazy dog sleeps under warm windows']:
    assert tok.decode(tok.encode([sentence])[0]) == sentence
  assert tok.decode(np.array([], np.int32)) == ''


def test_digits_are_split(tok):
  ids = tok.encode(['12345'])[0]
  pieces = [tok.id_to_piece(i).lstrip('\u2581') for i in ids]
  assert [p for p in pieces if p] == list('12345')


def test_unknown_characters_map_to_unk(tok):
  ids = tok.encode(['the \u4e2d fox'])[0]
  assert tokenizer_lib.UNK_ID in ids


def test_word_starts(tok, sentences):
  expected = np.array(
      [i < 5 or tok.id_to_piece(i).startswith('\u2581')
       for i in range(tok.vocab_size)])
  np.testing.assert_array_equal(tok.word_start_table, expected)
  assert tok.word_start_table[:5].all()
  # Some pieces start words and some continue them.
  assert 0 < tok.word_start_table[5:].mean() < 1
  for sentence in sentences[:50]:
    ids = tok.encode([sentence])[0]
    starts = tok.word_starts(ids)
    assert starts.dtype == bool and starts.shape == ids.shape
    for i, s in zip(ids, starts):
      assert s == tok.id_to_piece(i).startswith('\u2581')
    # The first token of a sentence starts a word, and there are as many
    # starts as words (no word is split into pieces that all continue).
    assert starts[0]
    assert starts.sum() == len(sentence.split())
  batch = np.array([[2, 5, 6], [3, 0, 4]])
  assert tok.word_starts(batch).shape == (2, 3)


def test_save_load_round_trip(tok, tmp_path, sentences):
  path = str(tmp_path / 'spm.model')
  tok.save(path)
  loaded = Tokenizer.load(path)
  assert loaded.sha256 == tok.sha256
  assert loaded.model_proto == tok.model_proto
  assert loaded.vocab_size == tok.vocab_size
  np.testing.assert_array_equal(loaded.word_start_table, tok.word_start_table)
  for a, b in zip(loaded.encode(sentences[:20]), tok.encode(sentences[:20])):
    np.testing.assert_array_equal(a, b)
  assert [p.name for p in tmp_path.iterdir()] == ['spm.model']  # No tmp left.


def test_training_is_deterministic(tok, sentences):
  again = tokenizer_lib.train(sentences, VOCAB_SIZE, 'unigram', num_threads=2)
  assert again.sha256 == tok.sha256


@pytest.mark.parametrize('model_type', tokenizer_lib.MODEL_TYPES)
def test_training_does_not_depend_on_the_cpu_count(
    sentences, monkeypatch, model_type):
  # pretokenize trains with the default num_threads; the model (and every
  # cache key derived from its sha256) must not depend on the machine.
  shas = []
  for cpus in (1, 4):
    monkeypatch.setattr(os, 'cpu_count', lambda c=cpus: c)
    shas.append(tokenizer_lib.train(sentences[:1000], 150, model_type).sha256)
  assert shas[0] == shas[1]


def test_train_bpe(sentences):
  bpe = tokenizer_lib.train(sentences[:500], 150, 'bpe', num_threads=2)
  assert [bpe.id_to_piece(i) for i in range(5)] == list(
      tokenizer_lib.SPECIAL_PIECES)
  assert bpe.decode(bpe.encode([sentences[0]])[0]) == sentences[0]


def test_max_sentences_limits_training_text(sentences):
  few = tokenizer_lib.train(['zebra quokka'] * 50 + sentences, 100, 'bpe',
                            max_sentences=50, num_threads=1)
  ids = few.encode(['zebra'])[0]
  assert len(ids) == 1 and few.id_to_piece(ids[0]) == '\u2581zebra'
  # No piece of the unseen words: they are made of characters or [UNK].
  assert 'fox' not in ''.join(few.id_to_piece(i)
                              for i in range(few.vocab_size))


def test_load_rejects_a_different_special_layout(tmp_path, sentences):
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(  # SentencePiece's defaults: <unk> <s> </s>.
      sentence_iterator=iter(sentences[:500]), model_writer=model,
      vocab_size=100, minloglevel=2, num_threads=1)
  path = tmp_path / 'other.model'
  path.write_bytes(model.getvalue())
  with pytest.raises(TokenizerError, match=r'ids 0-4.*\[PAD\]'):
    Tokenizer.load(str(path))
  with pytest.raises(TokenizerError):
    Tokenizer(model.getvalue())


def test_load_missing_file_or_not_a_model(tmp_path):
  with pytest.raises(TokenizerError, match='does not exist'):
    Tokenizer.load(str(tmp_path / 'missing.model'))
  vocab = tmp_path / 'vocab.txt'   # A WordPiece vocabulary.
  vocab.write_text('[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n')
  with pytest.raises(TokenizerError, match='is not a SentencePiece model'):
    Tokenizer.load(str(vocab))


def test_train_errors(sentences):
  with pytest.raises(TokenizerError, match='model_type'):
    tokenizer_lib.train(sentences, 100, 'wordpiece')
  with pytest.raises(TokenizerError, match='vocab_size'):
    tokenizer_lib.train(sentences, 6, 'unigram')
  with pytest.raises(TokenizerError, match='SentencePiece training failed'):
    tokenizer_lib.train([], 100, 'unigram')


@pytest.mark.parametrize('vocab, padded', [
    (1, 128), (127, 128), (128, 128), (129, 256), (200, 256),
    (30522, 30592), (32000, 32000)])
def test_padded_vocab_size(vocab, padded):
  assert tokenizer_lib.padded_vocab_size(vocab) == padded


def test_padded_vocab_size_other_multiple():
  assert tokenizer_lib.padded_vocab_size(100, multiple=64) == 128
  assert tokenizer_lib.padded_vocab_size(64, multiple=64) == 64
