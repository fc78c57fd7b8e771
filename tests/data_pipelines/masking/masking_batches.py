"""Batches and helpers shared by the masking tests."""

import numpy as np

from data_pipelines import gazetteer as gazetteer_lib
from data_pipelines import masking
from data_pipelines.masking import MaskingConfig
from data_pipelines.tokenizer import CLS_ID, NUM_SPECIAL, PAD_ID
from data_pipelines.tokenizer import SEP_ID

VOCAB_SIZE = 300
CONFIG = MaskingConfig(max_predictions_per_seq=20, vocab_size=VOCAB_SIZE)
WORD_STRATEGIES = ('whole_word', 'ngram', 'span')


def make_batch(batch_size, seq_len, seed=0, min_len=3, first_index=0,
               mask_epoch=0):
  """Padded NSP-like rows: [CLS] A [SEP] B [SEP] [PAD]...; ids >= 5."""
  rng = np.random.default_rng(seed)
  ids = np.full((batch_size, seq_len), PAD_ID, np.int32)
  lengths = rng.integers(min_len, seq_len + 1, size=batch_size)
  for row, n in enumerate(lengths):
    ids[row, :n] = rng.integers(NUM_SPECIAL, VOCAB_SIZE, size=n)
    ids[row, 0] = CLS_ID
    ids[row, rng.integers(1, n - 1)] = SEP_ID
    ids[row, n - 1] = SEP_ID
  attention_mask = (np.arange(seq_len)[None, :] < lengths[:, None])
  return {
      'input_ids': ids,
      'attention_mask': attention_mask.astype(np.int32),
      'token_type_ids': np.zeros_like(ids),
      'example_index': np.arange(first_index, first_index + batch_size,
                                 dtype=np.int64),
      'mask_epoch': np.full(batch_size, mask_epoch, np.int64),
  }


def assert_row_invariants(out, ids, candidates, row):
  """Positions ascending and unique, never specials or padding; labels are
  the original ids; every other position is untouched."""
  used = out['masked_weights'][row] > 0
  positions = out['masked_positions'][row][used]
  assert np.all(np.diff(positions) > 0)
  assert np.all(candidates[row][positions])
  assert np.array_equal(out['masked_ids'][row][used], ids[row][positions])
  untouched = np.ones(ids.shape[1], bool)
  untouched[positions] = False
  assert np.array_equal(out['input_ids'][row][untouched], ids[row][untouched])


def used_slots(out):
  return out['masked_weights'] > 0


def make_word_batch(batch_size, seq_len, seed=0, min_len=3, start_prob=0.5,
                    mid_sep=True, first_index=0, mask_epoch=0):
  """make_batch rows plus ``word_starts``.

  Each real token starts a word with probability ``start_prob`` (so words
  average 1 / start_prob tokens); specials are flagged too, padding is not.
  Without ``mid_sep`` the middle [SEP] becomes an ordinary token, so a row is
  [CLS] one run of words [SEP].
  """
  batch = make_batch(batch_size, seq_len, seed=seed, min_len=min_len,
                     first_index=first_index, mask_epoch=mask_epoch)
  ids = batch['input_ids']
  real = batch['attention_mask'] > 0
  if not mid_sep:
    last = real.sum(axis=1, keepdims=True) - 1
    inner = (ids == SEP_ID) & (np.arange(seq_len)[None, :] < last)
    ids[inner] = NUM_SPECIAL
  rng = np.random.default_rng(seed + 7919)
  word_starts = (rng.random(ids.shape) < start_prob) | np.isin(
      ids, [CLS_ID, SEP_ID])
  batch['word_starts'] = word_starts & real
  batch['unit_labels'] = np.zeros(ids.shape, np.int8)  # No entity units.
  return batch


def word_index(batch):
  """int [B, L]: word number of each maskable token, -1 elsewhere.

  A word starts at a maskable token whose flag is set or whose left
  neighbour is not maskable (a continuation piece right after [SEP] cannot
  join the word before it).
  """
  candidates = masking.maskable(batch['input_ids'])
  previous = np.pad(candidates, ((0, 0), (1, 0)))[:, :-1]
  starts = candidates & (batch['word_starts'].astype(bool) | ~previous)
  return np.where(candidates, np.cumsum(starts, axis=1) - 1, -1)


def units_of(batch, out):
  """One dict per unit (grouped by ``masked_unit_start``), row by row."""
  words = word_index(batch)
  used = used_slots(out)
  table = []
  for row in range(len(used)):
    positions = out['masked_positions'][row][used[row]]
    starts = out['masked_unit_start'][row][used[row]]
    last_word = words[row].max()
    for start in np.unique(starts):
      p = positions[starts == start]
      w = np.unique(words[row, p])
      table.append(dict(row=row, start=int(start), positions=p, words=w,
                        num_words=len(w), ends_row=w[-1] == last_word))
  return table


def budgets(batch, config):
  return masking.num_to_predict(batch['attention_mask'].sum(axis=1),
                                config.rate, config.max_predictions_per_seq)


def leftover_fits_a_free_word(batch, out, budget):
  """bool [B]: could one more unselected word fit in the unused budget?"""
  words = word_index(batch)
  used = used_slots(out)
  leftover = budget - used.sum(axis=1)
  result = np.zeros(len(used), bool)
  for row in range(len(used)):
    selected = np.zeros(words.shape[1], bool)
    selected[out['masked_positions'][row][used[row]]] = True
    w = words[row]
    free_words = np.unique(w[(w >= 0) & ~selected])
    sizes = np.array([(w == x).sum() for x in free_words], np.int64)
    result[row] = (sizes <= leftover[row]).any()
  return result


def make_entity_batch(batch_size, seq_len, seed=0):
  """Word batches whose words are grouped into entity and phrase units.

  Every third word (from the first maskable one) starts a unit of 2-3
  words, alternately an entity and a phrase, never crossing a special.
  """
  batch = make_word_batch(batch_size, seq_len, seed=seed, mid_sep=False)
  ids = batch['input_ids']
  labels = np.zeros(ids.shape, np.int8)
  rng = np.random.default_rng(seed + 31)
  for row in range(batch_size):
    real = np.flatnonzero(masking.maskable(ids[row]))
    starts = [p for p in real if batch['word_starts'][row][p]]
    w, kind = 0, 0
    while w + 3 < len(starts):
      n = int(rng.integers(2, 4))
      begin = (gazetteer_lib.ENTITY_BEGIN, gazetteer_lib.PHRASE_BEGIN)[kind]
      end = starts[w + n] if w + n < len(starts) else real[-1] + 1
      labels[row, starts[w]] = begin
      labels[row, starts[w] + 1:end] = begin + 1
      w, kind = w + n + 3, 1 - kind
  batch['unit_labels'] = labels
  return batch
