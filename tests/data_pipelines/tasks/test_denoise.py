"""The denoising tasks: labels against loops on hand-built rows, rates,
determinism and config checks."""

import math

import numpy as np
import pytest

from data_pipelines import masking
from data_pipelines import pipeline
from data_pipelines import tasks
from data_pipelines.tasks import denoise
from data_pipelines.tokenizer import (CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID,
                                      SEP_ID)

VOCAB_SIZE = 1000
SEED = 3
DENOISE_TASKS = ('token_deletion', 'token_insertion', 'token_replacement',
                 'token_shuffle', 'sentence_permutation', 'document_rotation')


# ---------------------------------------------------------------------------
# Batches: every per-token field but token_type_ids and sentence_ids is a
# function of the token, so a test can follow the tokens.


def word_start_of(token):
  return token in (CLS_ID, SEP_ID) or token % 3 != 0


def unit_label_of(token):
  return 0 if token < NUM_SPECIAL else token % 3


def capitalized_of(token):
  return token >= NUM_SPECIAL and token % 5 == 0


def make_batch(rows, seq_len, pair=False, first_index=0, mask_epoch=0,
               capitalized=True):
  """A batch of ``rows``: each a list of parts ended by [SEP] (a pair's A
  and B, or full_sentences' documents), each a list of sentences, each a
  list of token ids >= NUM_SPECIAL. ``pair``: part i has token type i."""
  shape = (len(rows), seq_len)
  batch = {
      'input_ids': np.full(shape, PAD_ID, np.int32),
      'token_type_ids': np.zeros(shape, np.int32),
      'attention_mask': np.zeros(shape, np.int32),
      'sentence_ids': np.full(shape, -1, np.int32),
  }
  for b, parts in enumerate(rows):
    tokens, types, sentences = [CLS_ID], [0], [-1]
    for i, part in enumerate(parts):
      for sentence in part:
        tokens += sentence
        types += [i if pair else 0] * len(sentence)
        sentences += [max(sentences) + 1] * len(sentence)
      tokens.append(SEP_ID)
      types.append(i if pair else 0)
      sentences.append(-1)
    assert len(tokens) <= seq_len
    batch['input_ids'][b, :len(tokens)] = tokens
    batch['token_type_ids'][b, :len(tokens)] = types
    batch['attention_mask'][b, :len(tokens)] = 1
    batch['sentence_ids'][b, :len(tokens)] = sentences
  real = batch['attention_mask'] > 0
  ids = batch['input_ids']
  batch['word_starts'] = np.vectorize(word_start_of)(ids) & real
  batch['unit_labels'] = np.vectorize(unit_label_of)(ids).astype(np.int8)
  if capitalized:
    batch['capitalized'] = np.vectorize(capitalized_of)(ids).astype(bool)
  batch['example_index'] = np.arange(first_index, first_index + len(rows),
                                     dtype=np.int64)
  batch['mask_epoch'] = np.full(len(rows), mask_epoch, np.int64)
  batch['next_sentence_label'] = np.zeros(len(rows), np.int32)
  return batch


def random_rows(rng, num_rows, max_tokens, num_parts=1, max_sentence_len=8):
  """Rows for ``make_batch`` of at most ``max_tokens`` tokens (specials
  excluded), each token unique within its row."""
  rows = []
  for _ in range(num_rows):
    pool = iter(rng.permutation(np.arange(NUM_SPECIAL, VOCAB_SIZE)).tolist())
    budget = int(rng.integers(max_tokens // 2, max_tokens + 1)) - num_parts
    parts = []
    for _ in range(num_parts):
      share = budget // num_parts
      sentences = []
      while share > 0 or not sentences:
        n = max(1, min(share, int(rng.integers(1, max_sentence_len + 1))))
        sentences.append([next(pool) for _ in range(n)])
        share -= n
      parts.append(sentences)
    rows.append(parts)
  return rows


def params_of(name, **knobs):
  task = tasks.get(name)
  return dict(task.defaults(), weight=1.0, vocab_size=VOCAB_SIZE,
              max_seq_length=128, **knobs)


def apply(name, batch, **knobs):
  return tasks.get(name).apply(batch, params_of(name, **knobs), SEED)


def real_tokens(batch, row):
  return batch['input_ids'][row][batch['attention_mask'][row] > 0].tolist()


def renumbered(sentences):
  """Sentence numbers in order of appearance (a loop), -1 kept; a sentence
  after a special is a new one."""
  out, last, count = [], -1, -1
  for s in sentences:
    if s >= 0 and s != last:
      count += 1
    out.append(count if s >= 0 else -1)
    last = s
  return out


def sentence_of_token(batch, row):
  """token -> its sentence in ``row`` (the row's tokens are unique)."""
  ids, sentences = batch['input_ids'][row], batch['sentence_ids'][row]
  return {int(t): int(s) for t, s in zip(ids, sentences) if s >= 0}


def assert_fields_follow_tokens(before, after, check_word_starts=True):
  """Fields that are functions of the token match the moved tokens;
  sentence_ids are the moved ones renumbered; padding is padding."""
  real = after['attention_mask'] > 0
  ids = after['input_ids']
  assert np.all(real == (ids != PAD_ID))
  assert np.all(real[:, :-1] | ~real[:, 1:])   # Padding only at the end.
  assert np.array_equal(after['unit_labels'],
                        np.vectorize(unit_label_of)(ids))
  if 'capitalized' in after:
    assert np.array_equal(after['capitalized'],
                          np.vectorize(capitalized_of)(ids))
  if check_word_starts:
    assert np.array_equal(after['word_starts'],
                          np.vectorize(word_start_of)(ids) & real)
  for row in range(len(ids)):
    owner = sentence_of_token(before, row)
    moved = [owner.get(int(t), -1) for t in ids[row]]
    assert after['sentence_ids'][row].tolist() == renumbered(moved)


# ---------------------------------------------------------------------------
# token_deletion.


def test_deletion_matches_a_loop():
  rng = np.random.default_rng(0)
  before = make_batch(random_rows(rng, 40, 30, num_parts=2), 40, pair=True)
  after = apply('token_deletion', before, rate=0.3)
  for row in range(40):
    old, new = real_tokens(before, row), real_tokens(after, row)
    deleted = [t >= NUM_SPECIAL and t not in new for t in old]
    kept = [i for i in range(len(old)) if not deleted[i]]
    assert new == [old[i] for i in kept]
    types = before['token_type_ids'][row]
    assert after['token_type_ids'][row, :len(new)].tolist() == [
        types[i] for i in kept]
    labels = [int(j > 0 and deleted[i - 1]) for j, i in enumerate(kept)]
    assert after['token_deletion_labels'][row, :len(new)].tolist() == labels
    assert after['token_deletion_weights'][row].tolist() == (
        [0.0] + [1.0] * (len(new) - 1) + [0.0] * (40 - len(new)))
    assert not after['token_deletion_labels'][row, len(new):].any()
  assert after['token_deletion_labels'].sum() > 20   # Deletions happened.
  assert_fields_follow_tokens(before, after, check_word_starts=False)


def test_deletion_starts_a_word_at_its_first_kept_piece():
  rng = np.random.default_rng(1)
  before = make_batch(random_rows(rng, 40, 30), 40)
  after = apply('token_deletion', before, rate=0.5)
  for row in range(40):
    old, new = real_tokens(before, row), real_tokens(after, row)
    words, word = [], 0
    for t in old:
      word += word_start_of(t)
      words.append(word)
    kept = [i for i, t in enumerate(old) if t < NUM_SPECIAL or t in new]
    expected = [word_start_of(old[i]) or (
        old[i] >= NUM_SPECIAL and words[i] != words[kept[j - 1]])
                for j, i in enumerate(kept)]
    assert after['word_starts'][row, :len(new)].tolist() == expected


def test_deletion_rate():
  rng = np.random.default_rng(2)
  before = make_batch(random_rows(rng, 200, 126), 128)
  after = apply('token_deletion', before, rate=0.15)
  tokens = (before['sentence_ids'] >= 0).sum()
  deleted = tokens - (after['sentence_ids'] >= 0).sum()
  assert abs(deleted / tokens - 0.15) < 4.5 * math.sqrt(0.15 * 0.85 / tokens)


# ---------------------------------------------------------------------------
# token_insertion.


def test_insertion_removing_inserted_tokens_gives_the_original():
  rng = np.random.default_rng(3)
  before = make_batch(random_rows(rng, 40, 20, num_parts=2), 48, pair=True)
  after = apply('token_insertion', before, rate=0.3)
  labels = after['token_insertion_labels']
  for row in range(40):
    old, new = real_tokens(before, row), real_tokens(after, row)
    is_inserted = labels[row, :len(new)].astype(bool)
    assert [t for t, x in zip(new, is_inserted) if not x] == old
    for j in np.flatnonzero(is_inserted):
      assert NUM_SPECIAL <= new[j] < VOCAB_SIZE
      assert not is_inserted[j + 1] and new[j + 1] >= NUM_SPECIAL
      for name in ('token_type_ids', 'sentence_ids'):
        assert after[name][row, j] == after[name][row, j + 1]
      assert after['word_starts'][row, j]
      assert after['unit_labels'][row, j] == 0
      assert not after['capitalized'][row, j]
    weights = after['token_insertion_weights'][row, :len(new)]
    assert weights.tolist() == [float(t >= NUM_SPECIAL) for t in new]
    assert not weights[len(new):].any() and not labels[row, len(new):].any()
  assert labels.sum() > 40


def test_insertion_past_the_end_keeps_the_first_tokens_and_the_final_sep():
  # Every token gets an insertion; A alone fills most of the row.
  a, b = list(range(10, 22)), list(range(30, 34))
  before = make_batch([[[a], [b]], [[a[:5]], [b]]], 20, pair=True)
  after = apply('token_insertion', before, rate=1.0)
  for row, old in enumerate((a, a[:5])):
    expanded = [CLS_ID]   # None: an inserted token.
    for t in old + [SEP_ID] + b:
      expanded += [None, t] if t != SEP_ID else [t]
    expected = expanded[:19] + [SEP_ID]
    new = real_tokens(after, row)
    assert len(new) == 20
    labels = after['token_insertion_labels'][row].tolist()
    assert labels == [int(t is None) for t in expected]
    for t, x in zip(new, expected):
      assert t == x if x is not None else t >= NUM_SPECIAL
  # Row 0 lost its middle [SEP] with all of B: one [SEP], B's type.
  assert real_tokens(after, 0).count(SEP_ID) == 1
  assert after['token_type_ids'][0, 19] == 1


def test_insertion_rate():
  rng = np.random.default_rng(4)
  before = make_batch(random_rows(rng, 200, 62), 128)
  after = apply('token_insertion', before, rate=0.15)
  tokens = (before['sentence_ids'] >= 0).sum()
  inserted = after['token_insertion_labels'].sum()
  assert abs(inserted / tokens - 0.15) < 4.5 * math.sqrt(0.15 * 0.85 / tokens)


# ---------------------------------------------------------------------------
# token_replacement.


def test_replacement_keeps_unlabelled_tokens_and_changes_labelled_ones():
  rng = np.random.default_rng(5)
  before = make_batch(random_rows(rng, 200, 126), 128)
  after = apply('token_replacement', before, rate=0.15)
  labels = after['token_replacement_labels'].astype(bool)
  old, new = before['input_ids'], after['input_ids']
  assert np.array_equal(new[~labels], old[~labels])
  assert np.all(new[labels] != old[labels])
  assert np.all((new[labels] >= NUM_SPECIAL) & (new[labels] < VOCAB_SIZE))
  tokens = before['sentence_ids'] >= 0
  assert np.array_equal(after['token_replacement_weights'], tokens)
  rate = labels.sum() / tokens.sum()
  assert abs(rate - 0.15) < 4.5 * math.sqrt(0.15 * 0.85 / tokens.sum())
  for name in ('word_starts', 'sentence_ids', 'attention_mask'):
    assert after[name] is before[name]


def test_random_other_tokens_are_uniform_over_the_others():
  vocab_size = NUM_SPECIAL + 4
  input_ids = np.full((1, 40000), NUM_SPECIAL + 1)
  input_ids[0, :10] = 1   # [UNK] may become any ordinary token.
  u = np.random.default_rng(6).random(input_ids.shape)
  drawn = denoise.random_other_tokens(input_ids, u, vocab_size)[0, 10:]
  counts = np.bincount(drawn - NUM_SPECIAL, minlength=4)
  assert counts[1] == 0
  expected = drawn.size / 3
  assert np.all(np.abs(counts[[0, 2, 3]] - expected) <
                4.5 * math.sqrt(expected * 2 / 3))


# ---------------------------------------------------------------------------
# token_shuffle.


def test_shuffle_keeps_each_row_multiset_and_labels_the_moved_tokens():
  rng = np.random.default_rng(7)
  before = make_batch(random_rows(rng, 200, 126), 128)
  rate = 0.15
  after = apply('token_shuffle', before, rate=rate)
  old, new = before['input_ids'], after['input_ids']
  for row in range(200):
    assert sorted(old[row]) == sorted(new[row])
  specials = before['sentence_ids'] < 0
  assert np.array_equal(new[specials], old[specials])
  assert np.array_equal(after['token_shuffle_labels'], new != old)
  # Changed tokens: k ~ Binomial(n, rate) chosen, minus the permutation's
  # fixed points (1 on average when k >= 1; their variance <= 1.25).
  n = (~specials).sum(axis=1)
  expected = (n * rate - (1 - (1 - rate) ** n)).sum()
  sigma = math.sqrt((n * rate * (1 - rate) + 1.25).sum())
  assert abs(after['token_shuffle_labels'].sum() - expected) < 4.5 * sigma


# ---------------------------------------------------------------------------
# sentence_permutation.


def chunks_by_label(batch, row, name):
  """The row cut at its labelled positions and its specials that stay:
  [(label, tokens)], label None for a special."""
  ids = real_tokens(batch, row)
  weights = batch[f'{name}_weights'][row]
  labels = batch[f'{name}_labels'][row]
  ends = denoise.segment_ends(batch)[row]
  chunks = []
  for j, t in enumerate(ids):
    if j == 0 or ends[j]:
      chunks.append((None, [t]))
    elif weights[j] or chunks[-1][0] is None:
      chunks.append((int(labels[j]), [t]))
    else:
      chunks[-1][1].append(t)
  return chunks


def unpermuted(chunks):
  """Sorts the labelled chunks between two specials by label."""
  out, run = [], []
  for label, tokens in chunks + [(None, [])]:
    if label is None:
      out += [t for _, ts in sorted(run) for t in ts] + tokens
      run = []
    else:
      run.append((label, tokens))
  return out


@pytest.mark.parametrize('pair', [False, True])
def test_permutation_unpermuted_by_its_labels_is_the_original(pair):
  rng = np.random.default_rng(8)
  num_parts = 2 if pair else 3   # full_sentences: 3 documents.
  before = make_batch(random_rows(rng, 60, 40, num_parts=num_parts), 48,
                      pair=pair)
  after = apply('sentence_permutation', before, max_sentences=64)
  changed = 0
  for row in range(60):
    chunks = chunks_by_label(after, row, 'sentence_permutation')
    assert unpermuted(chunks) == real_tokens(before, row)
    owner = sentence_of_token(before, row)
    for label, tokens in chunks:
      if label is not None:   # Each chunk is one whole sentence.
        assert {owner.get(t, label) for t in tokens} == {label}
    changed += real_tokens(after, row) != real_tokens(before, row)
  assert changed > 40
  assert np.array_equal(after['token_type_ids'], before['token_type_ids'])
  assert_fields_follow_tokens(before, after)


def test_permutation_document_sep_travels_with_its_sentence():
  before = make_batch([[[[10, 11]], [[20], [30, 31]], [[40]]]] * 400, 16)
  after = apply('sentence_permutation', before)
  outcomes = set()
  for row in range(400):
    new = real_tokens(after, row)
    assert new[0] == CLS_ID and new[-1] == SEP_ID
    # [SEP] after 11 and after 31 (document ends), never after 20 or 40.
    for j, t in enumerate(new[1:-1], 1):
      if t == SEP_ID:
        assert new[j - 1] in (11, 31)
    outcomes.add(tuple(new))
  assert len(outcomes) == 24   # 4 sentences, all 4! orders seen.


def test_permutation_labels_only_indices_below_max_sentences():
  before = make_batch([[[[10 + 2 * s, 11 + 2 * s] for s in range(6)]]], 16)
  after = apply('sentence_permutation', before, max_sentences=4)
  weights = after['sentence_permutation_weights'][0]
  labels = after['sentence_permutation_labels'][0]
  assert sorted(labels[weights > 0]) == [0, 1, 2, 3]
  assert not labels[weights == 0].any()


def test_permutation_rate_and_uniform_orders():
  three = [[[10], [11, 12], [13]]]
  num_rows = 3000
  before = make_batch([three] * num_rows, 8)
  after = apply('sentence_permutation', before, rate=0.5)
  orders = [tuple(after['sentence_permutation_labels'][row][
      after['sentence_permutation_weights'][row] > 0]) for row in
            range(num_rows)]
  counts = np.array([orders.count(p) for p in sorted(set(orders))])
  # Each non-identity order 1/12 of the rows; the identity the other 7/12.
  assert len(counts) == 6 and counts[0] == orders.count((0, 1, 2))
  expected = num_rows * np.array([7 / 12] + [1 / 12] * 5)
  chi_square = ((counts - expected) ** 2 / expected).sum()
  assert chi_square < 25   # 5 degrees of freedom: p ~ 1e-4.


# ---------------------------------------------------------------------------
# document_rotation.


def test_rotation_rotated_back_by_its_label_is_the_original():
  rng = np.random.default_rng(9)
  before = make_batch(random_rows(rng, 100, 40, num_parts=2), 48)
  after = apply('document_rotation', before)
  labels = after['document_rotation_label']
  for row in range(100):
    old, new = real_tokens(before, row), real_tokens(after, row)
    content = new[1:-1]
    start = labels[row] - 1
    assert [CLS_ID] + content[start:] + content[:start] + [SEP_ID] == old
    assert word_start_of(new[1]) and new[1] >= NUM_SPECIAL
  assert np.all(labels > 1)   # Rate 1: every row has word starts to use.
  assert_fields_follow_tokens(before, after)


def test_rotation_rate_and_uniform_start():
  words = [[[10, 11, 12], [13, 14, 15, 16]]]   # 11, 13, 14 and 16 start.
  num_rows = 2000
  before = make_batch([words] * num_rows, 10)
  after = apply('document_rotation', before, rate=0.6)
  first = after['input_ids'][:, 1]
  counts = np.array([(first == t).sum() for t in (10, 11, 13, 14, 16)])
  assert counts.sum() == num_rows
  rotated = num_rows - counts[0]
  assert abs(rotated / num_rows - 0.6) < 4.5 * math.sqrt(0.24 / num_rows)
  chi_square = ((counts[1:] - rotated / 4) ** 2 / (rotated / 4)).sum()
  assert chi_square < 22   # 3 degrees of freedom: p ~ 1e-4.
  assert np.array_equal(after['document_rotation_label'] == 1, first == 10)


def test_rotation_leaves_a_row_of_one_word():
  before = make_batch([[[[10, 12]]]], 6)   # 12 % 3 == 0: not a start.
  after = apply('document_rotation', before)
  assert after['document_rotation_label'].tolist() == [1]
  assert np.array_equal(after['input_ids'], before['input_ids'])


# ---------------------------------------------------------------------------
# All six.


def shuffled_rows(batch, order):
  return {name: values[order] for name, values in batch.items()}


@pytest.mark.parametrize('name', DENOISE_TASKS)
def test_rows_get_the_same_bytes_wherever_they_sit(name):
  rng = np.random.default_rng(10)
  before = make_batch(random_rows(rng, 32, 40, num_parts=2), 48,
                      first_index=100, mask_epoch=2)
  copies = {k: v.copy() for k, v in before.items()}
  after = apply(name, before)
  order = rng.permutation(32)
  after_shuffled = apply(name, shuffled_rows(before, order))
  assert after.keys() == after_shuffled.keys()
  for field, values in after.items():
    assert np.array_equal(values[order], after_shuffled[field]), field
    assert values.tobytes() == apply(name, before)[field].tobytes()
  for field, values in copies.items():   # The input is not touched.
    assert np.array_equal(before[field], values)
  other_epoch = dict(before, mask_epoch=before['mask_epoch'] + 1)
  assert not np.array_equal(apply(name, other_epoch)['input_ids'],
                            after['input_ids'])


@pytest.mark.parametrize('name', DENOISE_TASKS)
def test_declared_fields_are_what_apply_adds(name):
  rng = np.random.default_rng(11)
  before = make_batch(random_rows(rng, 8, 40), 48, capitalized=False)
  task = tasks.get(name)
  after = apply(name, before)
  fields = task.fields(params_of(name), 48)
  assert set(after) == set(before) | set(fields)
  for field, (shape, dtype) in fields.items():
    assert after[field].shape == (8,) + shape and after[field].dtype == dtype
  for field in before:
    assert after[field].dtype == before[field].dtype, field
  assert task.corrupts and task.label_field in fields
  assert task.weight_field in fields or not task.weight_field
  if task.head == 'token':   # Nothing labelled off the tokens (and [SEP]).
    off = after['attention_mask'] == 0
    off[:, 0] = True
    assert not after[task.label_field][off].any()
    assert not after[task.weight_field][off].any()


@pytest.mark.parametrize('name', DENOISE_TASKS)
def test_rows_with_no_tokens_pass_through(name):
  before = make_batch([[[[10]]], [[[10]]], [[[10]]]], 6)
  before['input_ids'][0, 1:] = before['attention_mask'][0, 1:] = 0
  before['input_ids'][0, 1] = SEP_ID   # [CLS] [SEP].
  before['attention_mask'][0, :2] = 1
  before['sentence_ids'][0] = -1
  for field in ('input_ids', 'attention_mask', 'word_starts'):
    before[field][1] = 0   # All padding.
  before['sentence_ids'][1] = -1
  after = apply(name, before, rate=1.0)
  for row in (0, 1):
    assert np.array_equal(after['input_ids'][row], before['input_ids'][row])
  task = tasks.get(name)
  if task.head == 'pointer':   # Not rotated.
    assert after[task.label_field][:2].tolist() == [1, 1]
  else:
    assert not after[task.label_field][:2].any()
  if task.weight_field:
    assert not after[task.weight_field][1].any()


@pytest.mark.parametrize('rate', [0, -0.1, 1.5, '0.1', True, None])
def test_check_rejects_a_bad_rate(rate):
  for name in DENOISE_TASKS:
    errors = []
    tasks.get(name).check(params_of(name, rate=rate), None, errors)
    assert len(errors) == 1 and errors[0].startswith(
        f'tasks.{name}.rate={rate!r} must be a number in (0, 1]; use e.g. ')


def test_check_messages():
  errors = []
  tasks.get('token_deletion').check(params_of('token_deletion', rate=2),
                                    None, errors)
  assert errors == ['tasks.token_deletion.rate=2 must be a number in (0, 1]; '
                    'use e.g. 0.15.']
  for name in DENOISE_TASKS:
    tasks.get(name).check(params_of(name), None, errors)
    tasks.get(name).check(params_of(name, rate=1), None, errors)
  assert len(errors) == 1
  for bad in (1, 2.0, None, True):
    errors = []
    tasks.get('sentence_permutation').check(
        params_of('sentence_permutation', max_sentences=bad), None, errors)
    assert errors == [
        f'tasks.sentence_permutation.max_sentences={bad!r} must be an int '
        '>= 2 (its head\'s classes: sentences with a larger index get no '
        'label); use e.g. 16.']


@pytest.mark.parametrize('name', ['token_insertion', 'token_replacement',
                                  'token_shuffle'])
def test_positions_mlm_rewrites_are_not_labels(name):
  # MLM after the corruption: where it shows [MASK] or a random token, the
  # label (what became of the token shown) no longer fits the input.
  rng = np.random.default_rng(9)
  corrupted = apply(name, make_batch(random_rows(rng, 200, 100), 128))
  masked = masking.mask_batch(
      corrupted, masking.MaskingConfig(vocab_size=VOCAB_SIZE), SEED)
  out = pipeline.unlabel_rewritten(masked, [name])
  weights, kept = masked[f'{name}_weights'], out[f'{name}_weights']
  expected = weights.copy()
  for b, s in zip(*np.nonzero(masked['masked_weights'])):
    if masked['masked_corruption'][b, s] != masking.CORRUPT_KEEP:
      expected[b, masked['masked_positions'][b, s]] = 0
  np.testing.assert_array_equal(kept, expected)
  assert kept.dtype == weights.dtype
  assert not kept[masked['input_ids'] == MASK_ID].any()
  # About 15% x 90% of the labels go; the others stay.
  dropped = ((weights > 0) & (kept == 0)).sum() / (weights > 0).sum()
  assert 0.10 < dropped < 0.17, dropped
  # A task whose labels are about the gaps, not the tokens, keeps them.
  assert pipeline.unlabel_rewritten(masked, ['token_deletion']) is masked
