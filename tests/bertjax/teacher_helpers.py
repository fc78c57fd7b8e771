"""A distillation teacher's workdir written directly, without training: its
config, a tokenizer file and a checkpoint, as bertjax.train saves them; and
a batch to train a student on. Shared by the DistilBERT, TinyBERT and
MobileBERT tests."""

import hashlib
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bertjax import objectives
from bertjax import train
from bertjax.models import bert
from bertjax.objectives import distillation

VOCAB = 400
STEP = 3   # The written checkpoint's step.


def write_teacher(workdir, cfg, checkpoint=True, tokenizer=b'teacher pieces',
                  seed=7):
  """Writes a teacher of ``cfg``'s model (random weights from ``seed``,
  ``VOCAB`` ids, 8 positions in the init) into ``workdir``; returns its
  parameters."""
  os.makedirs(workdir)
  with open(os.path.join(workdir, distillation.TOKENIZER_MODEL), 'wb') as f:
    f.write(tokenizer)
  model = bert.BertForPreTraining(objectives.bert.encoder_config(cfg, VOCAB))
  ids = jnp.zeros((1, 8), jnp.int32)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(seed), ids, ids, ids,
                                        ids[:, :2])['params'])
  with open(os.path.join(workdir, distillation.RUN_META), 'w') as f:
    json.dump({'config': cfg.to_dict(), 'vocab_size': VOCAB,
               'tokenizer_sha256': hashlib.sha256(tokenizer).hexdigest()}, f)
  if checkpoint:
    state = train.TrainState(step=jnp.asarray(STEP, jnp.int32), params=params,
                             opt_state={'mu': params})
    with ocp.CheckpointManager(
        os.path.join(workdir, distillation.CHECKPOINTS),
        item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
      manager.save(STEP, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state)))
  return params


def write_run_on_corpus(workdir, cfg):
  """``write_teacher`` with the tokenizer the trainer builds for ``cfg``'s
  corpus, which it prepares (tokenizer and pre-tokenized data) in
  ``cfg.data.data_dir``: a saved run that reads that data, untrained."""
  tokenizer, _ = train.prepare_data(cfg, None, workdir)
  assert tokenizer.vocab_size == VOCAB
  return write_teacher(workdir, cfg, tokenizer=tokenizer.model_proto)


def batch(spec: dict, padded_from: int = 0) -> dict:
  """A batch of ``spec`` (pipeline.batch_spec's shapes and dtypes): random
  ids below ``VOCAB``, masked positions 1..P with random labels, every
  slot real; with ``padded_from``, row 1 padded from that position."""
  rng = np.random.default_rng(0)
  out = {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}
  out['input_ids'] = rng.integers(5, VOCAB, out['input_ids'].shape
                                  ).astype(np.int32)
  out['attention_mask'][:] = 1
  if padded_from:
    out['input_ids'][1, padded_from:] = 0
    out['attention_mask'][1, padded_from:] = 0
  p = out['masked_positions'].shape[1]
  out['masked_positions'][:] = np.arange(1, p + 1)
  out['masked_ids'] = rng.integers(5, VOCAB, (len(out['input_ids']), p)
                                   ).astype(np.int32)
  out['masked_weights'][:] = 1
  return out
