"""bertjax's tokenizer as a transformers tokenizer: same ids, and back."""

import io
import itertools
import json
import os

import numpy as np
import pytest
import sentencepiece as spm
import transformers
from sentencepiece import sentencepiece_model_pb2

from bertjax.interop import hf_tokenizer
from data_pipelines import corpus
from data_pipelines import tokenizer as tokenizer_lib

MODEL_TYPES = ('unigram', 'bpe')
MAX_LENGTH = 64
# Mixed in (repeated) so that some non-ASCII characters have pieces; others
# (the snowman, the emoji) stay unknown.
_MULTILINGUAL = ['Le café est ouvert, naïve Zoë.', 'Ωμέγα και άλφα.',
                 '東京と京都に行きました。', 'Straße über Größe.',
                 'Tiếng Việt có dấu.']
# Text of every kind the exported tokenizer has to get right.
SENTENCES = [
    'The module provides a way of using operating system dependent '
    'functionality.',
    '  Leading and trailing spaces  ',
    'doubled  spaces,   tripled,\ttab\tand\nnewline\r\nand CRLF',
    'Digits 12345 and 3.14159; the year 2024-01-31 and x2y.',
    'Punctuation: (parens), [brackets], {braces}; "quotes", \'single\' - '
    'dash/slash!?',
    'café naïve Ωμέγα 東京',
    'Straße über Größe; Tiếng Việt có dấu.',
    # Decomposed (NFD) accents, as macOS file names have them.
    'cafe\u0301 nai\u0308ve Vie\u0323\u0302t Tie\u0302\u0301ng',
    'Full-width ＡＢＣ１２３, the ﬁne ligature, ① circled, '
    'no-break\u00a0space and ideographic\u3000space.',
    'unknown ☃ characters ☃☃ and 🙂 emoji',
    'a literal \u2581 and \u2581\u2581 meta symbol \u2581start',
    '\u2581leading meta symbol',
    'zero\u200bwidth, soft\u00adhyphen, nul\x00 and bell\x07 controls',
    'x', '', ' ', '\t\n',
]


def _corpus_sentences(n):
  return list(itertools.islice(
      (s for document in corpus.embedded_documents() for s in document), n))


@pytest.fixture(scope='module')
def held_out():
  """Prose the tokenizers were not trained on."""
  return _corpus_sentences(2300)[2000:]


@pytest.fixture(scope='module')
def tokenizers():
  """model type -> a trained bertjax tokenizer (each trained once)."""
  sentences = _corpus_sentences(2000) + _MULTILINGUAL * 20
  return {model_type: tokenizer_lib.train(sentences, vocab_size=300,
                                          model_type=model_type)
          for model_type in MODEL_TYPES}


@pytest.fixture(scope='module')
def exported(tokenizers, tmp_path_factory):
  """(model type, family) -> (bertjax tokenizer, AutoTokenizer, directory)."""
  out = {}
  for model_type, ours in tokenizers.items():
    for family in hf_tokenizer.FAMILIES:
      directory = str(tmp_path_factory.mktemp(f'{model_type}_{family}'))
      # As in an export: the model's config.json is beside the tokenizer.
      with open(os.path.join(directory, 'config.json'), 'w') as f:
        json.dump({'model_type': family}, f)
      hf_tokenizer.save_tokenizer(ours, directory, family,
                                  model_max_length=MAX_LENGTH)
      theirs = transformers.AutoTokenizer.from_pretrained(directory)
      out[(model_type, family)] = (ours, theirs, directory)
  return out


def _fuzz(ours, n=1500, seed=0):
  """Random strings of the model's pieces, spaces and odd characters."""
  rng = np.random.default_rng(seed)
  pieces = [ours.id_to_piece(i).replace('\u2581', ' ')
            for i in range(tokenizer_lib.NUM_SPECIAL, ours.vocab_size)]
  odd = list('  \t\n\u00a0\u3000\u2581.,;:!?()[]"\'-0123456789éüñΩ東☃🙂ＡﬁŉⅣ')
  return [''.join(rng.choice(pieces) if rng.random() < 0.7 else
                  rng.choice(odd) for _ in range(rng.integers(1, 15)))
          for _ in range(n)]


def _ids(ours, text):
  return ours.encode([text])[0].tolist()


ALL = list(itertools.product(MODEL_TYPES, hf_tokenizer.FAMILIES))


@pytest.mark.parametrize('model_type,family', ALL)
def test_single_texts_get_bertjax_ids(exported, held_out, model_type,
                                      family):
  ours, theirs, _ = exported[(model_type, family)]
  texts = SENTENCES + held_out + _fuzz(ours)
  expected = [[2] + ids.tolist() + [3] for ids in ours.encode(texts)]
  got = theirs(texts)['input_ids']
  wrong = [(t, g, e) for t, g, e in zip(texts, got, expected) if g != e]
  assert not wrong, wrong[:3]


@pytest.mark.parametrize('model_type,family', ALL)
def test_pairs_get_bertjax_ids_and_token_types(exported, held_out,
                                               model_type, family):
  ours, theirs, _ = exported[(model_type, family)]
  firsts = SENTENCES + held_out[:50]
  seconds = firsts[1:] + firsts[:1]
  got = theirs(firsts, seconds, return_token_type_ids=True)
  for a, b, ids, types in zip(firsts, seconds, got['input_ids'],
                              got['token_type_ids']):
    a_ids, b_ids = _ids(ours, a), _ids(ours, b)
    assert ids == [2] + a_ids + [3] + b_ids + [3], (a, b)
    assert types == [0] * (len(a_ids) + 2) + [1] * (len(b_ids) + 1)


@pytest.mark.parametrize('family', hf_tokenizer.FAMILIES)
def test_token_type_ids_are_inputs_only_where_the_model_takes_them(
    exported, family):
  _, theirs, _ = exported[('unigram', family)]
  has_types = family not in ('roberta', 'distilbert')
  assert ('token_type_ids' in theirs.model_input_names) == has_types
  assert ('token_type_ids' in theirs('a', 'b')) == has_types
  assert theirs('a', 'b')['attention_mask'] == [1] * len(
      theirs('a', 'b')['input_ids'])


@pytest.mark.parametrize('model_type', MODEL_TYPES)
def test_specials_padding_and_truncation(exported, model_type):
  ours, theirs, _ = exported[(model_type, 'bert')]
  assert theirs.convert_ids_to_tokens([0, 1, 2, 3, 4]) == list(
      tokenizer_lib.SPECIAL_PIECES)
  assert (theirs.pad_token_id, theirs.unk_token_id, theirs.cls_token_id,
          theirs.sep_token_id, theirs.mask_token_id) == (0, 1, 2, 3, 4)
  assert len(theirs) == theirs.vocab_size == ours.vocab_size
  assert theirs.model_max_length == MAX_LENGTH
  batch = theirs(['Short.', 'A somewhat longer sentence than that.'],
                 padding=True)
  short, long_ = batch['input_ids']
  n = len(_ids(ours, 'Short.')) + 2
  assert len(short) == len(long_) > n
  assert short[n:] == [0] * (len(short) - n)          # Padded on the right.
  assert batch['attention_mask'][0] == [1] * n + [0] * (len(short) - n)
  assert batch['token_type_ids'][0] == [0] * len(short)
  truncated = theirs(' '.join(SENTENCES[:1] * 20), truncation=True)
  assert len(truncated['input_ids']) == MAX_LENGTH
  assert truncated['input_ids'][-1] == 3


@pytest.mark.parametrize('model_type', MODEL_TYPES)
def test_special_token_text_is_the_special_token(exported, model_type):
  # The one deliberate difference: transformers reads "[MASK]" in the text
  # as the mask token (the fill-mask pipeline relies on it); bertjax's
  # SentencePiece model reads it as characters.
  ours, theirs, _ = exported[(model_type, 'bert')]
  assert theirs('Paris is the [MASK] of France.')['input_ids'] == (
      [2] + _ids(ours, 'Paris is the') + [4] + _ids(ours, 'of France.')
      + [3])


@pytest.mark.parametrize('model_type', MODEL_TYPES)
def test_decode_gives_sentencepiece_text(exported, held_out, model_type):
  ours, theirs, _ = exported[(model_type, 'bert')]
  plain = [SENTENCES[0], 'café naïve Ωμέγα', 'Digits 12345 and 3.14.']
  for text in plain:
    ids = theirs(text)['input_ids']
    assert theirs.decode(ids, skip_special_tokens=True) == text
    assert theirs.decode(ids) == f'[CLS] {text}[SEP]'
  # Anything without unknown pieces (SentencePiece decodes those as
  # " ⁇ ", transformers as [UNK]) decodes to SentencePiece's text.
  for text in SENTENCES + held_out[:100]:
    ids = _ids(ours, text)
    if tokenizer_lib.UNK_ID not in ids:
      assert theirs.decode(ids) == ours.decode(ids), text


@pytest.mark.parametrize('model_type', MODEL_TYPES)
@pytest.mark.parametrize('options', [
    {'normalization_rule_name': 'identity'},   # Keeps tabs, literal "▁".
    {'normalization_rule_name': 'nfkc'},
    {'add_dummy_prefix': False},
    {'remove_extra_whitespaces': False},
    {'split_by_whitespace': False},
], ids=lambda options: '-'.join(f'{k}={v}' for k, v in options.items()))
def test_other_sentencepiece_options_are_reproduced(held_out, tmp_path,
                                                    model_type, options):
  # bertjax trains with SentencePiece's defaults; a model brought from
  # elsewhere (through load_tokenizer) may not have them.
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(_corpus_sentences(1000)), model_writer=model,
      vocab_size=200, model_type=model_type, pad_id=0, pad_piece='[PAD]',
      unk_id=1, unk_piece='[UNK]', bos_id=-1, eos_id=-1,
      control_symbols=['[CLS]', '[SEP]', '[MASK]'], hard_vocab_limit=False,
      minloglevel=2, num_threads=2, **options)
  ours = tokenizer_lib.Tokenizer(model.getvalue())
  hf_tokenizer.save_tokenizer(ours, str(tmp_path), 'bert', MAX_LENGTH)
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  texts = SENTENCES + held_out[:100] + _fuzz(ours, n=500)
  expected = [[2] + ids.tolist() + [3] for ids in ours.encode(texts)]
  got = theirs(texts)['input_ids']
  wrong = [(t, g, e) for t, g, e in zip(texts, got, expected) if g != e]
  assert not wrong, wrong[:3]


def test_files_written(exported):
  ours, _, directory = exported[('bpe', 'roberta')]
  names = sorted(os.listdir(directory))
  assert names == ['config.json', 'special_tokens_map.json',
                   'tokenizer.json', 'tokenizer.model',
                   'tokenizer_config.json']               # No temp files.
  with open(os.path.join(directory, 'tokenizer.model'), 'rb') as f:
    assert f.read() == ours.model_proto
  with open(os.path.join(directory, 'tokenizer_config.json')) as f:
    config = json.load(f)
  assert config['tokenizer_class'] == 'PreTrainedTokenizerFast'
  assert config['model_input_names'] == ['input_ids', 'attention_mask']
  assert config['do_lower_case'] is False
  assert config['mask_token'] == '[MASK]'
  with open(os.path.join(directory, 'tokenizer.json')) as f:
    fast = json.load(f)
  assert fast['model']['type'] == 'BPE'
  assert [t['id'] for t in fast['added_tokens']] == [0, 1, 2, 3, 4]
  assert all(t['special'] for t in fast['added_tokens'])


def test_save_returns_names_and_creates_the_directory(tokenizers, tmp_path):
  directory = str(tmp_path / 'new' / 'dir')
  written = hf_tokenizer.save_tokenizer(tokenizers['unigram'], directory,
                                        'bert', model_max_length=8)
  assert sorted(written) == sorted(os.listdir(directory))
  with pytest.raises(tokenizer_lib.TokenizerError, match='family'):
    hf_tokenizer.save_tokenizer(tokenizers['unigram'], directory, 'gpt2', 8)


def test_options_the_export_cannot_reproduce_are_refused(tokenizers,
                                                         tmp_path):
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizers['bpe'].model_proto)
  proto.pieces[10].type = proto.pieces[10].USER_DEFINED
  bpe = tokenizer_lib.Tokenizer(proto.SerializeToString())
  with pytest.raises(tokenizer_lib.TokenizerError,
                     match='user-defined symbols in a bpe model'):
    hf_tokenizer.save_tokenizer(bpe, str(tmp_path), 'bert', 8)
  assert not os.listdir(tmp_path)                   # Nothing half written.


# ---------------------------------------------------------------------------
# Import.


def _albert_proto(data: bytes) -> bytes:
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(data)
  proto.pieces[0].piece, proto.pieces[1].piece = '<pad>', '<unk>'
  proto.trainer_spec.pad_piece, proto.trainer_spec.unk_piece = ('<pad>',
                                                                '<unk>')
  return proto.SerializeToString()


@pytest.mark.parametrize('model_type', MODEL_TYPES)
def test_load_gives_back_the_exported_model(exported, model_type):
  ours, _, directory = exported[(model_type, 'electra')]
  loaded = hf_tokenizer.load_tokenizer(directory)
  assert loaded.model_proto == ours.model_proto


def test_load_renames_albert_pad_and_unk(tokenizers, held_out, tmp_path):
  ours = tokenizers['unigram']
  (tmp_path / 'spiece.model').write_bytes(_albert_proto(ours.model_proto))
  # A cased ALBERT tokenizer that keeps accents: the text as bertjax's.
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps(
      {'do_lower_case': False, 'keep_accents': True}))
  loaded = hf_tokenizer.load_tokenizer(str(tmp_path))
  assert [loaded.id_to_piece(i) for i in range(5)] == list(
      tokenizer_lib.SPECIAL_PIECES)
  assert loaded.vocab_size == ours.vocab_size
  assert [loaded.id_to_piece(i) for i in range(ours.vocab_size)] == [
      ours.id_to_piece(i) for i in range(ours.vocab_size)]
  for a, b in zip(loaded.encode(held_out[:50]), ours.encode(held_out[:50])):
    np.testing.assert_array_equal(a, b)
  before, after = (sentencepiece_model_pb2.ModelProto() for _ in range(2))
  before.ParseFromString(ours.model_proto)
  after.ParseFromString(loaded.model_proto)
  assert [(p.score, p.type) for p in after.pieces] == [
      (p.score, p.type) for p in before.pieces]


@pytest.mark.parametrize('options', [
    {}, {'do_lower_case': False, 'keep_accents': True}])
def test_albert_import_reads_text_as_albert_tokenizer_does(
    held_out, tmp_path, options):
  """ALBERT's tokenizer lowercases, strips accents and turns `` into "
  before SentencePiece (transformers' defaults, {}); the imported model
  gives AlbertTokenizer's ids, and so does its export."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(s.lower() for s in _corpus_sentences(2000)),
      model_writer=model, vocab_size=300, model_type='unigram', pad_id=0,
      pad_piece='<pad>', unk_id=1, unk_piece='<unk>', bos_id=-1, eos_id=-1,
      control_symbols=['[CLS]', '[SEP]', '[MASK]'], hard_vocab_limit=False,
      minloglevel=2, num_threads=2)
  (tmp_path / 'spiece.model').write_bytes(model.getvalue())
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps(options))
  theirs = transformers.AlbertTokenizer.from_pretrained(str(tmp_path))
  ours = hf_tokenizer.load_tokenizer(str(tmp_path))
  assert ours.lowercases == (not options)
  rng = np.random.default_rng(0)
  pieces = [ours.id_to_piece(i).replace('\u2581', ' ')
            for i in range(tokenizer_lib.NUM_SPECIAL, ours.vocab_size)]
  odd = list(' \t\n\u00a0.,;()"\'`-09éüÉÜŒΩΣİẞﬁⅣＡ가東🙂') + [
      '``', "''", 'NAÏVE Zürich', 'e\u0301', '\u1100\u1161']
  texts = SENTENCES + held_out + [''.join(
      rng.choice(pieces).upper() if rng.random() < 0.3 else
      rng.choice(pieces) if rng.random() < 0.7 else rng.choice(odd)
      for _ in range(rng.integers(1, 15))) for _ in range(1500)]
  expected = [[2] + ids.tolist() + [3] for ids in ours.encode(texts)]
  assert theirs(texts)['input_ids'] == expected
  hf_tokenizer.save_tokenizer(ours, str(tmp_path / 'out'), 'albert',
                              model_max_length=MAX_LENGTH)
  exported = transformers.AutoTokenizer.from_pretrained(
      str(tmp_path / 'out'))
  assert exported(texts)['input_ids'] == expected
  assert hf_tokenizer.load_tokenizer(str(tmp_path)).model_proto == (
      ours.model_proto)   # The same table from the same files.


def test_albert_with_user_defined_symbols_round_trips(held_out, tmp_path):
  # ALBERT's spiece.model was trained with user-defined symbols ("(", "-",
  # ...); SentencePiece gives them a bonus the export reproduces.
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(_corpus_sentences(2000)), model_writer=model,
      vocab_size=300, model_type='unigram', pad_id=0, pad_piece='<pad>',
      unk_id=1, unk_piece='<unk>', bos_id=-1, eos_id=-1,
      control_symbols=['[CLS]', '[SEP]', '[MASK]'],
      user_defined_symbols=['(', ')', '"', '-', '.', '–', 'the', 'ion',
                            'tion', 'er'],
      hard_vocab_limit=False, minloglevel=2, num_threads=2)
  (tmp_path / 'albert').mkdir()
  (tmp_path / 'albert' / 'spiece.model').write_bytes(model.getvalue())
  ours = hf_tokenizer.load_tokenizer(str(tmp_path / 'albert'))
  hf_tokenizer.save_tokenizer(ours, str(tmp_path / 'out'), 'albert',
                              model_max_length=MAX_LENGTH)
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'out'))
  # Strings of the symbols and their parts, where other pieces compete.
  rng = np.random.default_rng(1)
  parts = ['the', 'tion', 'ion', 'er', 't', 'h', 'e', 'i', 'o', 'n', 'r',
           'th', 'he', 'on', 'en', 're', ' ', '(', '-']
  texts = held_out + _fuzz(ours) + [
      ''.join(rng.choice(parts, size=rng.integers(1, 9))) for _ in range(3000)]
  expected = [[2] + ids.tolist() + [3] for ids in ours.encode(texts)]
  assert theirs(texts)['input_ids'] == expected


def test_load_prefers_bertjax_model(tokenizers, tmp_path):
  ours = tokenizers['bpe']
  ours.save(str(tmp_path / 'tokenizer.model'))
  (tmp_path / 'spiece.model').write_bytes(
      _albert_proto(tokenizers['unigram'].model_proto))
  loaded = hf_tokenizer.load_tokenizer(str(tmp_path))
  assert loaded.model_proto == ours.model_proto


def test_load_refuses_wordpiece_and_byte_level_bpe(tmp_path):
  (tmp_path / 'vocab.txt').write_text('[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n')
  with pytest.raises(tokenizer_lib.TokenizerError,
                     match=r'no SentencePiece model .* a WordPiece vocab.txt'
                     r'.* ids 0-4 = \[PAD\] \[UNK\] \[CLS\] \[SEP\] '
                     r'\[MASK\].*tokenizer.train'):
    hf_tokenizer.load_tokenizer(str(tmp_path))
  os.remove(tmp_path / 'vocab.txt')
  (tmp_path / 'vocab.json').write_text('{}')
  (tmp_path / 'merges.txt').write_text('')
  with pytest.raises(tokenizer_lib.TokenizerError,
                     match='a BPE vocab.json and merges.txt'):
    hf_tokenizer.load_tokenizer(str(tmp_path))
  with pytest.raises(tokenizer_lib.TokenizerError, match='not a directory'):
    hf_tokenizer.load_tokenizer(str(tmp_path / 'missing'))


def test_load_refuses_another_sentencepiece_layout(tokenizers, tmp_path):
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizers['unigram'].model_proto)
  for piece, name in zip(proto.pieces, ['<unk>', '<s>', '</s>']):
    piece.piece = name
  (tmp_path / 'sentencepiece.bpe.model').write_bytes(
      proto.SerializeToString())
  with pytest.raises(tokenizer_lib.TokenizerError,
                     match=r"ids 0-4 are \('<unk>', '<s>', '</s>', "
                     r"'\[SEP\]', '\[MASK\]'\)\. bertjax needs"):
    hf_tokenizer.load_tokenizer(str(tmp_path))
  (tmp_path / 'sentencepiece.bpe.model').write_bytes(b'not a model')
  with pytest.raises(tokenizer_lib.TokenizerError,
                     match='not a SentencePiece model'):
    hf_tokenizer.load_tokenizer(str(tmp_path))
