"""bertjax's SentencePiece tokenizer <-> a Hugging Face tokenizer directory.

An export writes, beside the model's weights:

- ``tokenizer.model``: the SentencePiece model, for re-import into bertjax;
- ``tokenizer.json``: the fast tokenizer ``transformers.AutoTokenizer``
  loads;
- ``tokenizer_config.json``, ``special_tokens_map.json``: the special
  tokens, ``model_max_length`` and the model's input names.

``tokenizer.json`` is built from the SentencePiece proto with the
``tokenizers`` library (neither transformers nor torch is needed) and gives
bertjax's ids: the same pieces and scores (Unigram) or the merges the piece
scores imply (BPE), SentencePiece's normalization and whitespace handling,
[PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4, and ``[CLS] A [SEP] B [SEP]``
with token types 0 then 1 for every family (bertjax's models all use that
layout). What cannot be the same is said in ``save_tokenizer``'s docstring.

An import (``load_tokenizer``) reads the SentencePiece model back; it must
have bertjax's layout at ids 0-4 (bertjax's exports; ALBERT's
``spiece.model``, whose ``<pad>`` and ``<unk>`` are renamed, and whose
tokenizer's preprocessing goes into its normalization table).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import unicodedata

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from data_pipelines import tokenizer as tokenizer_lib

FAMILIES = ('bert', 'roberta', 'albert', 'electra', 'distilbert', 'ernie',
            'mobilebert')
# The SentencePiece model's name in an export, and the names it has in
# transformers directories we import from, in the order they are looked for.
MODEL_FILE = 'tokenizer.model'
SENTENCEPIECE_FILES = (MODEL_FILE, 'spiece.model', 'sentencepiece.bpe.model')
# ALBERT's spiece.model: bertjax's layout but for the pad and unk names.
ALBERT_PIECES = ('<pad>', '<unk>', '[CLS]', '[SEP]', '[MASK]')
# Families whose transformers models take no token_type_ids.
_NO_TOKEN_TYPES = ('roberta', 'distilbert')
_WORD_START = '\u2581'
_FLT_MIN = 1.1754943508222875e-38  # numeric_limits<float>::min().
_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece


# ---------------------------------------------------------------------------
# Export.


def save_tokenizer(tokenizer: tokenizer_lib.Tokenizer, directory: str,
                   family: str, model_max_length: int) -> list[str]:
  """Writes ``tokenizer`` into ``directory`` as transformers loads it.

  ``transformers.AutoTokenizer.from_pretrained(directory)`` then gives
  ``[2] + ids(a) + [3]`` for a text ``a`` and ``[2] + ids(a) + [3] + ids(b)
  + [3]`` (token types 0 to the first [SEP], 1 after) for a pair, where
  ``ids`` is ``tokenizer.encode``. Two kinds of input differ:

  - A special token's text inside the input ("[MASK]"): SentencePiece reads
    it as plain characters, transformers as the special token (as every
    BERT tokenizer does, and as the fill-mask pipeline needs).
  - Some text that is not in NFC. SentencePiece's table maps the longest
    rule at each character; tokenizers' ``Precompiled`` maps each grapheme
    by its shortest rule, or one character at a time, and so would drop
    marks of decomposed text (NFD e U+0302 U+0301 became "ê") and leave
    NFD Hangul uncomposed. The export composes to NFC first, which makes
    NFC and NFD text agree; what still differs is a letter that carries a
    mark followed by another mark NFC composes with it ("Â" U+0300: the
    table composes fully decomposed sequences only), marks out of canonical
    order, the deprecated U+0340-U+0344, a mark after a character the table
    rewrites ("Ａ" or "ﬁ" and U+0301, a no-break space: the mark is
    dropped), and sequences only the table composes (half-width katakana
    with a voicing mark, compatibility jamo).

  Args:
    tokenizer: bertjax's tokenizer.
    directory: where to write (created if missing); existing files of the
      same names are replaced, each atomically.
    family: the transformers family of the model beside it, one of
      ``FAMILIES``: RoBERTa and DistilBERT models take no token_type_ids.
    model_max_length: the longest input the model takes, in tokens.

  Returns:
    The names of the files written.

  Raises:
    TokenizerError: ``family`` is unknown, or the SentencePiece model uses
      an option the export cannot reproduce.
  """
  if family not in FAMILIES:
    raise tokenizer_lib.TokenizerError(
        f'family={family!r}; use one of {FAMILIES}.')
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizer.model_proto)
  fast = _fast_tokenizer(proto)
  specials = dict(zip(('pad_token', 'unk_token', 'cls_token', 'sep_token',
                       'mask_token'), tokenizer_lib.SPECIAL_PIECES))
  input_names = ['input_ids', 'attention_mask']
  if family not in _NO_TOKEN_TYPES:
    input_names.insert(1, 'token_type_ids')
  config = dict(
      specials,
      # The generic fast class reads tokenizer.json as it is; a family's
      # own class (BertTokenizerFast, AlbertTokenizerFast) would rebuild
      # parts of it (lower-casing, WordPiece, its own specials).
      tokenizer_class='PreTrainedTokenizerFast',
      model_max_length=model_max_length,
      model_input_names=input_names,
      do_lower_case=False,
      # Decoding gives SentencePiece's text, not English-tuned spacing.
      clean_up_tokenization_spaces=False,
      padding_side='right',
      truncation_side='right')
  os.makedirs(directory, exist_ok=True)
  files = {
      MODEL_FILE: tokenizer.model_proto,
      'tokenizer.json': fast.to_str(pretty=True).encode(),
      'tokenizer_config.json': _json_bytes(config),
      'special_tokens_map.json': _json_bytes(specials),
  }
  for name, data in files.items():
    _write_atomically(os.path.join(directory, name), data)
  return list(files)


def _json_bytes(value: dict) -> bytes:
  return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
          + '\n').encode()


def _write_atomically(path: str, data: bytes) -> None:
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'wb') as f:
    f.write(data)
  os.replace(tmp, path)  # A crash never leaves half a file.


def _check_exportable(proto) -> None:
  """Raises TokenizerError for options tokenizer.json cannot reproduce."""
  trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
  problems = []
  if trainer.model_type not in (trainer.UNIGRAM, trainer.BPE):
    problems.append(f'model_type {trainer.model_type} (only unigram and bpe '
                    'are exported)')
  if trainer.byte_fallback:
    problems.append('byte_fallback')
  if trainer.treat_whitespace_as_suffix:
    problems.append('treat_whitespace_as_suffix')
  if not normalizer.escape_whitespaces:
    problems.append('escape_whitespaces=false')
  types = {p.type for p in proto.pieces}
  if _Piece.UNUSED in types:
    problems.append('unused pieces')
  if _Piece.BYTE in types:
    problems.append('byte pieces')
  if _Piece.USER_DEFINED in types and trainer.model_type != trainer.UNIGRAM:
    problems.append('user-defined symbols in a bpe model')
  unknown = [i for i, p in enumerate(proto.pieces) if p.type == _Piece.UNKNOWN]
  if unknown != [tokenizer_lib.UNK_ID]:
    problems.append(f'unknown piece at ids {unknown}, not '
                    f'[{tokenizer_lib.UNK_ID}]')
  if problems:
    raise tokenizer_lib.TokenizerError(
        'the SentencePiece model cannot be exported as an equivalent '
        f'tokenizer.json: it has {", ".join(problems)}. Train the tokenizer '
        'with tokenizer.train().')


def _fast_tokenizer(proto):
  """A ``tokenizers.Tokenizer`` that encodes as ``proto`` does."""
  # Imported here: only an export needs tokenizers; an import reads the
  # SentencePiece model alone.
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders  # pylint: disable=g-import-not-at-top
  from tokenizers import models  # pylint: disable=g-import-not-at-top
  from tokenizers import normalizers  # pylint: disable=g-import-not-at-top
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import processors  # pylint: disable=g-import-not-at-top
  _check_exportable(proto)
  trainer, spec = proto.trainer_spec, proto.normalizer_spec
  if trainer.model_type == trainer.UNIGRAM:
    model = models.Unigram(_unigram_vocab(proto), unk_id=tokenizer_lib.UNK_ID,
                           byte_fallback=False)
  else:
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    model = models.BPE(vocab, _bpe_merges(proto),
                       unk_token=proto.pieces[tokenizer_lib.UNK_ID].piece,
                       # SentencePiece emits a run of unknown characters as
                       # one unknown piece.
                       fuse_unk=True, byte_fallback=False, dropout=None)
  fast = tokenizers.Tokenizer(model)

  steps = []
  if spec.precompiled_charsmap:
    table = normalizers.Precompiled(spec.precompiled_charsmap)
    crlf = table.normalize_str('\r') + table.normalize_str('\n')
    if crlf != '\r\n' and table.normalize_str(crlf) == crlf:
      # "\r\n" is one grapheme, of which Precompiled (below) would map the
      # "\r" alone; SentencePiece maps both characters.
      steps.append(normalizers.Replace('\r\n', crlf))
    if spec.name in ALBERT_NORMALIZATIONS:
      # Two characters, so two graphemes, which Precompiled maps one by one.
      steps += [normalizers.Replace('``', '"'), normalizers.Replace("''", '"')]
    if spec.name in ('nmt_nfkc', 'nfkc', 'nmt_nfkc_cf', 'nfkc_cf',
                     *ALBERT_NORMALIZATIONS):
      # Precompiled maps a grapheme by its shortest rule where SentencePiece
      # takes the longest, dropping the rest (see the docstring of
      # save_tokenizer); composing first hands it precomposed characters,
      # which it maps one by one as SentencePiece does.
      steps.append(normalizers.NFC())
    steps.append(table)
  if spec.remove_extra_whitespaces:
    # SentencePiece keeps one space of a run (after its table turned tabs,
    # newlines and other spaces into ' ') and none at the start; at the end
    # it drops "▁"s, which a table that keeps a literal "▁" leaves there.
    steps += [normalizers.Replace(tokenizers.Regex(' {2,}'), ' '),
              normalizers.Replace(
                  tokenizers.Regex(rf'\A +|[ {_WORD_START}]+\z'), '')]
  if spec.add_dummy_prefix:
    # Prepend (unlike Metaspace's prepend_scheme) adds the "▁" even to a
    # text that starts with a literal "▁", as SentencePiece does; it adds
    # nothing to an empty text.
    steps.append(normalizers.Prepend(_WORD_START))
  fast.normalizer = normalizers.Sequence(steps)
  _check_user_defined(proto, fast.normalizer)
  # Metaspace turns the remaining spaces into "▁" and, as SentencePiece
  # never puts "▁" inside a piece, splits the text before each one.
  fast.pre_tokenizer = pre_tokenizers.Metaspace(
      replacement=_WORD_START, prepend_scheme='never',
      split=trainer.split_by_whitespace)
  fast.decoder = decoders.Metaspace(
      replacement=_WORD_START,
      prepend_scheme='always' if spec.add_dummy_prefix else 'never',
      split=True)

  # Ids 0-4 are already the model's pieces: registering them as special
  # tokens keeps their ids, matches them whole in the text, and lets
  # skip_special_tokens drop them.
  fast.add_special_tokens([
      tokenizers.AddedToken(piece, special=True, normalized=False)
      for piece in tokenizer_lib.SPECIAL_PIECES])
  cls, sep = '[CLS]', '[SEP]'
  fast.post_processor = processors.TemplateProcessing(
      single=f'{cls}:0 $A:0 {sep}:0',
      pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
      special_tokens=[(cls, tokenizer_lib.CLS_ID),
                      (sep, tokenizer_lib.SEP_ID)])
  return fast


def _check_user_defined(proto, normalizer) -> None:
  """Raises TokenizerError for a user-defined symbol the normalizer alters.

  SentencePiece matches user-defined symbols before normalizing; the
  exported tokenizer finds them in normalized text, which is the same
  only for symbols normalization leaves as they are (ALBERT's are).
  """
  prefix = _WORD_START if proto.normalizer_spec.add_dummy_prefix else ''
  altered = [p.piece for p in proto.pieces if p.type == _Piece.USER_DEFINED
             and normalizer.normalize_str(p.piece) != prefix + p.piece]
  if altered:
    raise tokenizer_lib.TokenizerError(
        f'the user-defined symbols {altered[:5]} change under the '
        "model's normalization, which SentencePiece skips for them and "
        'tokenizer.json cannot: the export would encode them differently.')


def _unigram_vocab(proto) -> list[tuple[str, float]]:
  """(piece, score) per id, scored as SentencePiece's lattice scores them.

  SentencePiece scores a user-defined symbol (ALBERT's "(", "-", ...)
  ``length * max_score + 1``, where ``max_score`` starts from FLT_MIN, the
  smallest positive float: with the log-probabilities of a trained model,
  all negative, that is 1 and the symbol always wins its span.
  """
  max_score = max([_FLT_MIN] + [p.score for p in proto.pieces
                                if p.type == _Piece.NORMAL])
  return [(p.piece, len(p.piece) * max_score + 1.0
           if p.type == _Piece.USER_DEFINED else p.score)
          for p in proto.pieces]


def _bpe_merges(proto) -> list[tuple[str, str]]:
  """The merges that reproduce SentencePiece's BPE encoding.

  SentencePiece joins, again and again, the adjacent pair whose join is the
  best-scored piece (the leftmost of equals). So every split of a piece into
  two pieces is a merge, ranked by the joined piece's score. Only normal
  pieces take part: SentencePiece never forms a control or unknown piece.
  (Two splits of one piece get two ranks here, where SentencePiece would
  take the leftmost; we found no input on which that matters.)
  """
  normal = {p.piece for p in proto.pieces if p.type == _Piece.NORMAL}
  ranked = []
  for i, p in enumerate(proto.pieces):
    if p.type != _Piece.NORMAL:
      continue
    for cut in range(1, len(p.piece)):
      left, right = p.piece[:cut], p.piece[cut:]
      if left in normal and right in normal:
        ranked.append((-p.score, i, cut, left, right))
  ranked.sort()
  return [(left, right) for *_, left, right in ranked]


# ---------------------------------------------------------------------------
# Import.


def load_tokenizer(directory: str) -> tokenizer_lib.Tokenizer:
  """bertjax's tokenizer from a transformers directory.

  Reads ``tokenizer.model`` (bertjax's exports), else ``spiece.model``
  (ALBERT's), else ``sentencepiece.bpe.model``. Its ids 0-4 must be [PAD]
  [UNK] [CLS] [SEP] [MASK]; ALBERT's ``<pad>`` and ``<unk>`` at ids 0 and 1
  are renamed (ids and scores unchanged). ALBERT's tokenizer rewrites the
  text before SentencePiece sees it (``_fold_albert_preprocessing``): the
  import puts that into the model's normalization table, so the ids are
  transformers' AlbertTokenizer's (for scripts with spacing vowel signs,
  not quite those of the original pretraining: see there).

  Raises:
    TokenizerError: the directory has no SentencePiece model (a WordPiece
      ``vocab.txt``, a byte-level BPE ``vocab.json``), or its ids 0-4 are
      other pieces. The message says what was found and what can be done.
  """
  if not os.path.isdir(directory):
    raise tokenizer_lib.TokenizerError(f'{directory!r} is not a directory.')
  path = next((os.path.join(directory, name) for name in SENTENCEPIECE_FILES
               if os.path.isfile(os.path.join(directory, name))), None)
  if path is None:
    raise tokenizer_lib.TokenizerError(
        f'{directory!r} has no SentencePiece model '
        f'({" or ".join(SENTENCEPIECE_FILES)}); it has '
        f'{_describe_tokenizer(directory)}. {_NEEDS}')
  with open(path, 'rb') as f:
    data = f.read()
  proto = sentencepiece_model_pb2.ModelProto()
  try:
    proto.ParseFromString(data)
  except Exception as e:  # pylint: disable=broad-except
    raise tokenizer_lib.TokenizerError(
        f'{path!r} is not a SentencePiece model: {e}') from e
  pieces = tuple(p.piece for p in proto.pieces[:tokenizer_lib.NUM_SPECIAL])
  if pieces == tokenizer_lib.SPECIAL_PIECES:
    return tokenizer_lib.Tokenizer(data)
  if pieces == ALBERT_PIECES:
    lowercase, keep_accents = _albert_options(directory)
    _fold_albert_preprocessing(proto, lowercase, keep_accents)
    return tokenizer_lib.Tokenizer(_renamed(proto))
  raise tokenizer_lib.TokenizerError(
      f'{path!r} is a SentencePiece model whose ids 0-4 are {pieces}. '
      f'{_NEEDS}')


# What ALBERT's tokenizer does when tokenizer_config.json does not say:
# transformers' AlbertTokenizer defaults, google-research/albert's uncased
# models.
_ALBERT_DEFAULTS = {'do_lower_case': True, 'keep_accents': False}
ALBERT_NORMALIZATIONS = tokenizer_lib.ALBERT_NORMALIZATIONS


def _albert_options(directory: str) -> tuple[bool, bool]:
  """(do_lower_case, keep_accents) from the directory's
  tokenizer_config.json, transformers' defaults where it is silent."""
  options = dict(_ALBERT_DEFAULTS)
  path = os.path.join(directory, 'tokenizer_config.json')
  if os.path.isfile(path):
    try:
      with open(path, encoding='utf-8') as f:
        config = json.load(f)
    except ValueError as e:
      raise tokenizer_lib.TokenizerError(
          f'{path!r} is not JSON ({e}); it says whether ALBERT\'s tokenizer '
          'lowercases (do_lower_case) and keeps accents (keep_accents).'
          ) from e
    options.update({k: config[k] for k in options
                    if isinstance(config.get(k), bool)})
  return options['do_lower_case'], options['keep_accents']


def _fold_albert_preprocessing(proto, lowercase: bool,
                               keep_accents: bool) -> None:
  """Makes ``proto``'s normalization table do ALBERT's preprocessing too.

  ALBERT's tokenizer (transformers' AlbertTokenizer) turns `` and ''
  into ", then, unless ``keep_accents``, decomposes (NFKD) and drops the
  marks, then, with ``do_lower_case``, lowercases; only then does
  SentencePiece normalize. The new table maps each character, and each
  decomposed sequence, to what that chain gives (tokenizers' own
  normalizers, as transformers' AlbertTokenizer runs them, then the
  model's table), and `` and '' to ". What still differs: a sequence the
  model's table composes across characters that no single character
  decomposes to (compatibility jamo typed one by one). And where
  transformers' chain departs from google-research/albert's
  ``preprocess_text``, which the models were pretrained with, this table
  follows transformers: StripAccents drops every mark, where
  ``preprocess_text`` drops only those of nonzero combining class (so
  Indic and Thai vowel signs, kept there, are dropped here), and a
  per-character table cannot lowercase a final sigma to ς as Python's
  ``str.lower`` does. English text is unaffected.
  """
  # Imported here, as in the export: only an ALBERT import needs it.
  from tokenizers import normalizers  # pylint: disable=g-import-not-at-top
  steps = [normalizers.Replace('``', '"'), normalizers.Replace("''", '"')]
  if not keep_accents:
    steps += [normalizers.NFKD(), normalizers.StripAccents()]
  if lowercase:
    steps.append(normalizers.Lowercase())
  chain = normalizers.Sequence(steps)
  # The model's own table, without its whitespace handling (kept below).
  bare = sentencepiece_model_pb2.ModelProto()
  bare.CopyFrom(proto)
  spec = bare.normalizer_spec
  spec.add_dummy_prefix = spec.remove_extra_whitespaces = False
  spec.escape_whitespaces = False
  table = spm.SentencePieceProcessor(model_proto=bare.SerializeToString())

  def chained(texts: list[str]) -> list[str]:
    # One call for all: NUL (which no step alters) separates the texts.
    return chain.normalize_str('\0'.join(texts)).split('\0')

  chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
  before = chained(chars[1:])   # Not NUL itself, the separator.
  single = dict(zip(chars, table.normalize(['\0'] + before)))
  rules = {c: out for c, out in single.items() if out != c}
  sequences = sorted({'``', "''"} | {
      x for c, y in zip(chars[1:], before)
      for x in (unicodedata.normalize('NFKD', c), y) if len(x) > 1})
  for text, out in zip(sequences, table.normalize(chained(sequences))):
    if out != ''.join(single[c] for c in text):
      rules[text] = out
  spec = proto.normalizer_spec
  spec.precompiled_charsmap = _compiled_table(rules)
  spec.name = ALBERT_NORMALIZATIONS[0 if lowercase else 1]


def _compiled_table(rules: dict[str, str]) -> bytes:
  """SentencePiece's compiled normalization table of ``rules`` (longest
  match first), built by its trainer from a rule file."""
  def hex_points(text: str) -> str:
    return ' '.join(f'{ord(c):X}' for c in text)

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'rules.tsv')
    with open(path, 'w', encoding='utf-8') as f:
      f.writelines(f'{hex_points(a)}\t{hex_points(b)}\n'
                   for a, b in rules.items())
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(['a']), model_writer=model, vocab_size=4,
        model_type='char', normalization_rule_tsv=path, bos_id=-1,
        eos_id=-1, hard_vocab_limit=False, minloglevel=2, num_threads=1)
  trained = sentencepiece_model_pb2.ModelProto()
  trained.ParseFromString(model.getvalue())
  return trained.normalizer_spec.precompiled_charsmap


_NEEDS = (
    'bertjax needs a SentencePiece model with ids 0-4 = '
    f'{" ".join(tokenizer_lib.SPECIAL_PIECES)} (bertjax\'s exports, '
    "ALBERT's spiece.model): its data pipeline, masking and models use those "
    'ids, and the checkpoint\'s embedding rows belong to its tokenizer, so '
    'another tokenizer cannot be swapped in. Use a checkpoint whose '
    'tokenizer has that layout, or pretrain from scratch with a bertjax '
    'tokenizer (tokenizer.train()).')


def _describe_tokenizer(directory: str) -> str:
  """What tokenizer files ``directory`` holds, in words."""
  found = []
  if os.path.isfile(os.path.join(directory, 'vocab.txt')):
    found.append('a WordPiece vocab.txt')
  if os.path.isfile(os.path.join(directory, 'vocab.json')):
    found.append('a BPE vocab.json' + (
        ' and merges.txt' if os.path.isfile(
            os.path.join(directory, 'merges.txt')) else ''))
  if os.path.isfile(os.path.join(directory, 'tokenizer.json')):
    found.append('a tokenizer.json' + _tokenizer_json_model(
        os.path.join(directory, 'tokenizer.json')))
  return ', '.join(found) or 'no tokenizer files'


def _tokenizer_json_model(path: str) -> str:
  try:
    with open(path) as f:
      model_type = json.load(f).get('model', {}).get('type')
  except (OSError, ValueError, AttributeError):
    return ''
  return f' ({model_type} model)' if model_type else ''


def _renamed(proto) -> bytes:
  """ALBERT's proto with ids 0 and 1 renamed to [PAD] and [UNK]."""
  renames = dict(zip(ALBERT_PIECES[:2], tokenizer_lib.SPECIAL_PIECES[:2]))
  for piece in proto.pieces[:2]:
    piece.piece = renames[piece.piece]
  # The trainer spec names them too; keep it consistent with the pieces.
  trainer = proto.trainer_spec
  trainer.pad_piece = renames.get(trainer.pad_piece, trainer.pad_piece)
  trainer.unk_piece = renames.get(trainer.unk_piece, trainer.unk_piece)
  return proto.SerializeToString()
