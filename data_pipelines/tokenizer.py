"""SentencePiece tokenizer with BERT's special tokens at fixed ids.

Ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK] in every model this module
trains, and every loaded model is checked for the same layout, so the rest of
the framework can use the constants below. Pieces that begin with U+2581
("▁") start a word; their flags drive whole-word masking.

A model trained with ``lowercase`` case-folds its input (SentencePiece's
``nmt_nfkc_cf`` normalization), so the tokens do not show case; the
original text's case is still reachable through SentencePiece's alignment
of each piece with the text it came from (``capitalized_words``).
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import unicodedata
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from bertjax import errors
from bertjax import storage

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_PIECES = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
NUM_SPECIAL = len(SPECIAL_PIECES)
MODEL_TYPES = ('unigram', 'bpe')
_WORD_START = '\u2581'
TRAINING_THREADS = 16
# SentencePiece's normalization rules, without and with case folding.
_NORMALIZATION = {False: 'nmt_nfkc', True: 'nmt_nfkc_cf'}
# The names of imported ALBERT tables (bertjax/interop/hf_tokenizer.py);
# the first lowercases.
ALBERT_NORMALIZATIONS = ('albert_uncased', 'albert_cased')
_CASE_FOLDING_RULES = ('nmt_nfkc_cf', 'nfkc_cf', ALBERT_NORMALIZATIONS[0])


class TokenizerError(errors.UserError, ValueError):
  """The tokenizer cannot be trained or loaded; the message says why."""


class NoTrainingText(TokenizerError):
  """The training text is empty, or holds only what SentencePiece drops."""


def padded_vocab_size(vocab_size: int, multiple: int = 128) -> int:
  """The embedding table's size: the vocabulary rounded up to ``multiple``.

  A multiple of 128 keeps the vocabulary matmul tiled evenly on TPU and GPU;
  the extra ids are never produced by the tokenizer or by masking.
  """
  return -(-vocab_size // multiple) * multiple


class Tokenizer:
  """A loaded SentencePiece model with BERT specials at ids 0-4.

  Attributes:
    lowercases: whether the model case-folds its input (its normalizer is
      ``nmt_nfkc_cf`` or ``nfkc_cf``): then no token shows case.
  """

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    pieces = tuple(self._sp.id_to_piece(i) for i in range(NUM_SPECIAL))
    if pieces != SPECIAL_PIECES:
      raise TokenizerError(
          f'tokenizer ids 0-4 are {pieces}; bertjax needs {SPECIAL_PIECES}. '
          'Train the model with tokenizer.train(), or with SentencePiece '
          'options pad_id=0 unk_id=1 bos_id=-1 eos_id=-1 '
          'control_symbols=[CLS],[SEP],[MASK].')
    self.vocab_size = self._sp.get_piece_size()
    # Per-id flag: does the piece start a word? Specials count as starts.
    self.word_start_table = np.array(
        [i < NUM_SPECIAL or self._sp.id_to_piece(i).startswith(_WORD_START)
         for i in range(self.vocab_size)], dtype=bool)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_proto)
    self.lowercases = proto.normalizer_spec.name in _CASE_FOLDING_RULES

  @classmethod
  def load(cls, path: str) -> 'Tokenizer':
    """From a model file, local or in a bucket."""
    if not storage.isfile(path):
      raise TokenizerError(f'tokenizer model {path!r} does not exist.')
    try:
      return cls(storage.read_bytes(path))
    except RuntimeError as e:   # SentencePiece's parse error.
      raise TokenizerError(
          f'tokenizer model {path!r} is not a SentencePiece model ({e}). '
          'Give the .model file SentencePiece trains (a WordPiece '
          'vocab.txt is not one; import a Hugging Face tokenizer with '
          'experiments/import_hf.py), or leave model_path empty to train '
          'one on the corpus.') from e

  def save(self, path: str) -> None:
    # Atomic: a crash never leaves half a model.
    storage.write_bytes(path, self.model_proto)

  @property
  def sha256(self) -> str:
    return hashlib.sha256(self.model_proto).hexdigest()

  def encode(self, sentences: Sequence[str],
             num_threads: int = -1) -> list[np.ndarray]:
    """Token ids, one int32 array per sentence (no specials added)."""
    ids = self._sp.encode(list(sentences), out_type=int,
                          num_threads=num_threads)
    return [np.asarray(x, dtype=np.int32) for x in ids]

  def encode_with_offsets(self, sentences: Sequence[str],
                          num_threads: int = -1
                          ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids and, per token, the character offset it ends before.

    A piece's text may start with the space that precedes its word, so a
    token is placed by its last character: ``ends[i] - 1`` lies inside the
    token's own text. A piece of whitespace alone (a bare "▁" before an
    unknown character, or the dummy "▁" before a first word that has no
    "▁"-piece of its own) is placed with the token after it. Offsets count
    characters of the sentence (not bytes).
    """
    out = []
    for sentence, proto in zip(sentences, self._sp.encode(
        list(sentences), return_type='proto', num_threads=num_threads)):
      ids = np.array([p.id for p in proto.pieces], np.int32)
      ends = np.array([p.end for p in proto.pieces], np.int64)  # Bytes.
      if not sentence.isascii():  # Bytes -> characters (0 stays 0).
        char_bytes = np.array([len(c.encode()) for c in sentence], np.int64)
        ends = np.where(ends > 0, np.searchsorted(np.cumsum(char_bytes),
                                                  ends) + 1, 0)
      # SentencePiece's dummy "▁" before the first word ends at 0.
      for i in range(len(ends) - 2, -1, -1):
        if ends[i] == 0 or sentence[ends[i] - 1].isspace():
          ends[i] = ends[i + 1]
      out.append((ids, ends))
    return out

  def token_begins(self, sentences: Sequence[str],
                   num_threads: int = -1) -> list[np.ndarray]:
    """Per sentence, int64 [num_tokens]: the UTF-8 byte of the sentence
    where each token's text begins (the tokens of ``encode``).

    SentencePiece aligns every piece with the text as given, through its
    normalization and case folding; a word's first piece begins at the
    whitespace before the word.
    """
    if not sentences:
      return []
    protos = self._sp.encode(list(sentences), return_type='proto',
                             num_threads=num_threads)
    begins = np.array([p.begin for x in protos for p in x.pieces], np.int64)
    bounds = np.cumsum([0] + [len(x.pieces) for x in protos]).tolist()
    return [begins[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    """bool flags, same shape as ``ids``: does the token start a word?"""
    return self.word_start_table[ids]

  @functools.cached_property
  def punctuation_table(self) -> np.ndarray:
    """bool [vocab_size]: is the piece (less its word-start "▁")
    punctuation that BERT's basic tokenizer splits off as a word of its
    own (``is_punctuation``); never a special."""
    return np.array([i >= NUM_SPECIAL and is_punctuation(
        self._sp.id_to_piece(i).lstrip(_WORD_START))
                     for i in range(self.vocab_size)], dtype=bool)


def is_punctuation(text: str) -> bool:
  """Every character punctuation as BERT's basic tokenizer splits it off
  (``_is_punctuation``: Unicode P*, and ASCII's other non-alphanumeric
  symbols)."""
  return bool(text) and all(
      unicodedata.category(c).startswith('P') or
      (c.isascii() and c.isprintable() and not c.isalnum() and c != ' ')
      for c in text)


def _case(character: str) -> int:
  """0 uncased, 1 lower case, 2 upper or title case."""
  if character.isupper() or character.istitle():
    return 2
  return int(character.islower())


@functools.cache
def _bmp_cases() -> np.ndarray:
  """int8 [65536]: ``_case`` of each code point of Unicode's Basic
  Multilingual Plane (built once per process, in about 10 ms)."""
  return np.array([_case(chr(c)) for c in range(0x10000)], np.int8)


def _cases(code_points: np.ndarray) -> np.ndarray:
  """int8, ``_case`` of each of ``code_points`` (uint32)."""
  cases = np.zeros(len(code_points), np.int8)
  bmp = code_points < 0x10000
  cases[bmp] = _bmp_cases()[code_points[bmp]]
  astral = np.flatnonzero(~bmp)
  if astral.size:
    values, inverse = np.unique(code_points[astral], return_inverse=True)
    cases[astral] = np.array([_case(chr(v)) for v in values.tolist()],
                             np.int8)[inverse]
  return cases


def capitalized_words(sentences: Sequence[str],
                      begins: Sequence[np.ndarray],
                      word_starts: Sequence[np.ndarray]) -> list[np.ndarray]:
  """Which tokens start a capitalized word of the original text.

  A word runs from a word-start token to the next word start of its
  sentence (or the sentence's end); it is capitalized when the first cased
  character of its original text is upper (or title) case: "Paris",
  "(Paris", "USA", "McDonald", "2nd" no, "iPhone" no. (An [UNK] token
  starts a word, as in ``word_start_table``: it splits the word it is in.)
  Vectorized over all the sentences at once.

  Args:
    sentences: the original text, one sentence per item.
    begins: per sentence, int [num_tokens], the UTF-8 byte where each
      token's text begins (``Tokenizer.token_begins``).
    word_starts: per sentence, bool [num_tokens].

  Returns:
    Per sentence, bool [num_tokens]: True on the word-start tokens of
    capitalized words, False elsewhere.

  Raises:
    ValueError: ``begins`` and ``word_starts`` count different tokens.
  """
  if not sentences:
    return []
  sizes = np.array([len(b) for b in begins], np.int64)
  if sizes.tolist() != [len(w) for w in word_starts]:
    raise ValueError('begins and word_starts must hold the same tokens.')
  flags = np.zeros(int(sizes.sum()), bool)
  starts = np.flatnonzero(np.concatenate([np.zeros(0, bool), *word_starts]))
  if starts.size:
    # The text as code points, sentences apart (an uncased '\n' between):
    # character and UTF-8 byte offsets of every character.
    text = '\n'.join(sentences)
    code_points = np.frombuffer(text.encode('utf-32-le', 'surrogatepass'),
                                np.uint32)
    char_bytes = 1 + ((code_points >= 0x80).astype(np.int64) +
                      (code_points >= 0x800) + (code_points >= 0x10000))
    byte_offset = np.concatenate([[0], np.cumsum(char_bytes)])
    sentence_start = np.cumsum([0] + [len(s) + 1 for s in sentences])
    sentence = np.repeat(np.arange(len(sizes)), sizes)[starts]
    first = np.searchsorted(byte_offset, np.concatenate(begins)[starts] +
                            byte_offset[sentence_start[sentence]])
    end = sentence_start[sentence + 1] - 1
    same = sentence[1:] == sentence[:-1]
    end[:-1] = np.where(same, first[1:], end[:-1])
    cases = _cases(code_points)
    cased = np.flatnonzero(cases)
    if cased.size:
      j = np.searchsorted(cased, first)
      at = cased[np.minimum(j, cased.size - 1)]
      flags[starts] = (j < cased.size) & (at < end) & (cases[at] == 2)
  bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
  return [flags[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def train(sentences: Iterable[str], vocab_size: int, model_type: str,
          character_coverage: float = 0.9999, seed: int = 0,
          max_sentences: int = 2_000_000,
          num_threads: int = TRAINING_THREADS,
          lowercase: bool = False) -> Tokenizer:
  """Trains a SentencePiece model with BERT's specials at ids 0-4.

  Args:
    sentences: training text, one sentence per item.
    vocab_size: pieces including the 5 specials. If the corpus is too small
      for it, SentencePiece stops early with fewer pieces.
    model_type: 'unigram' or 'bpe'.
    character_coverage: fraction of characters covered by the vocabulary.
    seed: SentencePiece's sampling of ``max_sentences`` uses its own seed; we
      pass sentences in a fixed order so training is deterministic.
    max_sentences: sentences used for training (the first N; callers pass
      ``pretokenize.sample_corpus``' sample of the corpus).
    num_threads: SentencePiece splits its work by thread count, and the
      learned scores depend on the split: a fixed count (not the machine's
      core count) makes the model the same bytes on every machine.
    lowercase: case-fold the text (SentencePiece's ``nmt_nfkc_cf``
      normalization, instead of ``nmt_nfkc``), in training and in every
      encoding with the model: the tokens do not show case
      (``Tokenizer.lowercases``).
  """
  if model_type not in MODEL_TYPES:
    raise TokenizerError(f'tokenizer.model_type={model_type!r}; use one of '
                         f'{MODEL_TYPES}.')
  if vocab_size <= NUM_SPECIAL + 1:
    raise TokenizerError(f'tokenizer.vocab_size={vocab_size} must exceed '
                         f'{NUM_SPECIAL + 1}.')
  del seed  # Training is deterministic given the sentence order.
  model = io.BytesIO()

  num_sentences = 0

  def limited():
    nonlocal num_sentences
    for sentence in itertools.islice(sentences, max_sentences):
      num_sentences += 1
      yield sentence

  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=limited(), model_writer=model,
        vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID, pad_piece='[PAD]', unk_id=UNK_ID, unk_piece='[UNK]',
        bos_id=-1, eos_id=-1, control_symbols=list(SPECIAL_PIECES[2:]),
        hard_vocab_limit=False, num_threads=num_threads,
        normalization_rule_name=_NORMALIZATION[lowercase], minloglevel=2,
        split_digits=True, byte_fallback=False)
  except RuntimeError as e:
    # SentencePiece's own messages for these cases are assertions.
    if not num_sentences:
      raise NoTrainingText('SentencePiece training failed: there is no text '
                           'to train on (0 sentences).') from e
    if 'all_chars_count' in str(e) or 'required_chars_.empty()' in str(e):
      raise NoTrainingText(
          'SentencePiece training failed: none of the '
          f'{num_sentences} training sentences holds a character it keeps '
          '(its normalization removes control and zero-width characters and '
          'U+FFFD, what invalid UTF-8 becomes).') from e
    raise TokenizerError(f'SentencePiece training failed: {e}') from e
  return Tokenizer(model.getvalue())
