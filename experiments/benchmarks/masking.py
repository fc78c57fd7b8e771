"""Masking throughput on one CPU core: bertjax's strategies vs Hugging Face.

  python experiments/benchmarks/masking.py [--repeats 20]

Needs the ``bench`` extra (``pip install '.[bench]'``: torch, transformers).
Both sides get the same batches (256 x 128 and 32 x 512 tokens, BERT-style
rows: [CLS] A [SEP] B [SEP], about 10% padding, words of 1-3 pieces, and
two-word entity/phrase units for the entity strategy) and run
pinned to one core (``sched_setaffinity`` and one torch thread), every
method called once per round in turn, so that all see the same machine
state. The peer is transformers'
``DataCollatorForLanguageModeling`` (mlm_probability 0.15, 80/10/10), in
token mode and in whole-word mode (``whole_word_mask=True``, which reads word
boundaries from ``offset_mapping``), called on a list of examples as a
training loop would. ``hf masking only`` times its ``torch_mask_tokens`` on a
ready tensor, the masking alone: the like-for-like peer of bertjax's token
strategy, which also starts from a ready array (the collator's time
includes building tensors from the lists). Transformers has no
tensor-only whole-word masking, so whole word is compared with its
collator.

Prints tokens/s (all positions of the batch, padding included, for both),
the ratio to the collator in the same mode, and the ratio to the masking
alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from data_pipelines import masking
from data_pipelines.tokenizer import CLS_ID, PAD_ID, SEP_ID

VOCAB_SIZE = 30522
SHAPES = ((256, 128), (32, 512))


def make_batch(batch_size: int, seq_len: int, seed: int = 0) -> dict:
  """Rows [CLS] A [SEP] B [SEP] [PAD]..., words of 1-3 pieces."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB_SIZE, (batch_size, seq_len)).astype(np.int32)
  lengths = rng.integers(int(seq_len * 0.8), seq_len + 1, batch_size)
  word_starts = rng.random((batch_size, seq_len)) < 0.6
  for row, n in enumerate(lengths):
    ids[row, 0] = CLS_ID
    ids[row, rng.integers(n // 3, 2 * n // 3)] = SEP_ID
    ids[row, n - 1] = SEP_ID
    ids[row, n:] = PAD_ID
  special = (ids == CLS_ID) | (ids == SEP_ID) | (ids == PAD_ID)
  word_starts |= special
  attention = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)
  # Entity/phrase units of two words at about one word in eight.
  unit_labels = np.zeros(ids.shape, np.int8)
  for row in range(batch_size):
    starts = np.flatnonzero(word_starts[row] & ~special[row])
    for i in range(0, len(starts) - 2, 8):
      first, end = starts[i], starts[i + 2]
      if not special[row, first:end].any():
        begin = 1 if i % 16 == 0 else 3   # Entity, then phrase.
        unit_labels[row, first] = begin
        unit_labels[row, first + 1:end] = begin + 1
  return {'input_ids': ids, 'attention_mask': attention,
          'word_starts': word_starts, 'unit_labels': unit_labels,
          'example_index': np.arange(batch_size, dtype=np.int64),
          'mask_epoch': np.zeros(batch_size, np.int64)}


def _offsets(batch: dict) -> np.ndarray:
  """Character offsets consistent with the word starts (gap = new word)."""
  starts = batch['word_starts']
  chars = np.cumsum(3 + starts.astype(np.int64), axis=1)
  begin = chars - 3
  special = ~masking.maskable(batch['input_ids'])
  return np.stack([np.where(special, 0, begin), np.where(special, 0, chars)],
                  axis=-1)


def _hf_tokenizer():
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
  vocab = {t: i for i, t in enumerate(specials)}
  vocab.update({f'w{i}': i for i in range(5, VOCAB_SIZE)})
  model = tokenizers.models.WordLevel(vocab, unk_token='[UNK]')
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=tokenizers.Tokenizer(model), pad_token='[PAD]',
      unk_token='[UNK]', cls_token='[CLS]', sep_token='[SEP]',
      mask_token='[MASK]')


def _time_interleaved(fns: dict, repeats: int) -> dict:
  """Median seconds per call of each of ``fns`` after one warm-up call
  each, the calls interleaved (every function once per round, in turn) so
  that all see the same machine state."""
  samples = {name: [] for name in fns}
  for fn in fns.values():
    fn()
  for _ in range(repeats):
    for name, fn in fns.items():
      t = time.perf_counter()
      fn()
      samples[name].append(time.perf_counter() - t)
  return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=int, default=20)
  args = parser.parse_args()
  os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  tokenizer = _hf_tokenizer()
  hf_token = transformers.DataCollatorForLanguageModeling(
      tokenizer, mlm_probability=0.15, seed=0)
  hf_wwm = transformers.DataCollatorForLanguageModeling(
      tokenizer, mlm_probability=0.15, whole_word_mask=True, seed=0)
  print(f'one core of {platform.processor() or platform.machine()}; numpy '
        f'{np.__version__}, torch {torch.__version__}, transformers '
        f'{transformers.__version__}')
  print(f'{"shape":>9}  {"method":<34} {"Mtok/s":>8} {"vs HF":>7} '
        f'{"vs mask only":>12}')
  for batch_size, seq_len in SHAPES:
    batch = make_batch(batch_size, seq_len)
    tokens = batch_size * seq_len
    budget = max(1, round(seq_len * 0.15))
    examples = [{'input_ids': row.tolist()} for row in batch['input_ids']]
    offsets = _offsets(batch)
    wwm_examples = [{'input_ids': row.tolist(), 'offset_mapping': o.tolist()}
                    for row, o in zip(batch['input_ids'], offsets)]
    ids_tensor = torch.tensor(batch['input_ids'], dtype=torch.long)
    special = torch.tensor(~masking.maskable(batch['input_ids']))
    fns = {
        'hf collator, token': lambda: hf_token(examples),
        'hf collator, whole word': lambda: hf_wwm(wwm_examples),
        'hf masking only (torch_mask_tokens)':
            lambda: hf_token.torch_mask_tokens(
                ids_tensor.clone(), special_tokens_mask=special),
    }
    for strategy in masking.STRATEGIES:
      config = masking.MaskingConfig(
          strategy=strategy, max_predictions_per_seq=budget,
          vocab_size=VOCAB_SIZE,
          corruption_unit='unit' if strategy == 'span' else 'token')
      fns[f'bertjax {strategy}'] = (
          lambda config=config: masking.mask_batch(batch, config, 0))
    seconds = _time_interleaved(fns, args.repeats)
    core = seconds['hf masking only (torch_mask_tokens)']
    for name, t in seconds.items():
      peer = seconds['hf collator, token' if name.endswith(
          ('token', 'torch_mask_tokens)')) else 'hf collator, whole word']
      print(f'{batch_size:>4}x{seq_len:<4}  {name:<34} '
            f'{tokens / t / 1e6:8.2f} {peer / t:6.1f}x {core / t:6.2f}x')


if __name__ == '__main__':
  main()
