"""A distillation teacher's workdir written directly, without training: its
config, a tokenizer file and a checkpoint, as bertjax.train saves them.
Shared by the DistilBERT and TinyBERT tests."""

import hashlib
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from bertjax import objectives
from bertjax import train
from bertjax.models import bert
from bertjax.objectives import distillation

VOCAB = 400


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
    state = train.TrainState(step=jnp.asarray(3, jnp.int32), params=params,
                             opt_state={'mu': params})
    with ocp.CheckpointManager(
        os.path.join(workdir, distillation.CHECKPOINTS),
        item_handlers={'state': ocp.StandardCheckpointHandler()}) as manager:
      manager.save(3, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state)))
  return params
