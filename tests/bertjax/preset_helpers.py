"""Shared by the end-to-end tests: load a preset, set fields, read metrics."""

import importlib.util
import json
import os
import socket
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.objectives import bert as bert_objective

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, 'experiments', 'configs')
# Metrics that depend on the machine's speed, left out of run comparisons.
TIMING_FIELDS = ('tokens_per_second', 'tflops_per_second', 'mfu')
# A tiny run on the embedded corpus: 60 documents, a 32-wide model.
TINY_DATA = {
    'data.corpus.max_documents': 60,
    'data.tokenizer.vocab_size': 400,
    'data.max_seq_length': 32,
    'data.eval_fraction': 0.1,
    'masking.max_predictions_per_seq': 5,
    'batch_size': 8,
    'eval.num_batches': 2,
}
TINY_MODEL = {
    'model.hidden_size': 32,
    'model.num_heads': 2,
    'model.intermediate_size': 64,
    'model.max_position_embeddings': 32,
}
TINY = {**TINY_DATA, **TINY_MODEL, 'optimizer.warmup_steps': 2}


def _load_file(name: str, path: str):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_module(name: str):
  """The module ``experiments/configs/NAME.py``."""
  return _load_file(f'{name}_preset', os.path.join(CONFIGS, f'{name}.py'))


def load_experiment(script: str, name: str = ''):
  """The script ``experiments/SCRIPT`` as a module, named ``name`` (else
  after its file)."""
  return _load_file(name or os.path.splitext(os.path.basename(script))[0],
                    os.path.join(REPO, 'experiments', script))


def load_preset(name: str, arg=None):
  """``experiments/configs/NAME.py``'s ``get_config(arg)``."""
  return load_module(name).get_config(arg)


def set_fields(cfg, fields: dict):
  """Sets dotted ``fields`` ({'model.hidden_size': 32, ...}) in ``cfg``."""
  for key, value in fields.items():
    *parents, leaf = key.split('.')
    section = cfg
    for p in parents:
      section = section[p]
    section[leaf] = value
  return cfg


def read_jsonl(workdir: str, name: str = 'metrics.jsonl') -> list[dict]:
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def free_port() -> int:
  """A free TCP port on localhost (for a multi-process job's coordinator)."""
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def run_two_processes(script: str, *args: str, timeout: float = 180
                      ) -> list[dict]:
  """Runs ``script *args PORT INDEX`` as the two processes of a job on
  loopback (one fake CPU device each); asserts both exit 0 and returns
  the JSON each printed on its last line."""
  port = str(free_port())
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=1')
  procs = [subprocess.Popen([sys.executable, script, *args, port, str(i)],
                            env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], '\n'.join(
      out[-3000:] for out in outs)
  return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def random_bert_params(cfg, vocab_size: int, scale: float, seed: int = 0):
  """The bert objective's parameter tree for ``cfg`` (its shapes only are
  traced), every value drawn from N(0, ``scale``): no bias zero and no
  norm the identity, so a test that maps or slices the tree checks every
  tensor's place."""
  ids = jnp.zeros((1, cfg.data.max_seq_length), jnp.int32)
  batch = {'input_ids': ids, 'token_type_ids': ids, 'attention_mask': ids,
           'masked_positions': ids[:, :4], 'masked_unit_start': ids[:, :4]}
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: rng.normal(0, scale, x.shape).astype(np.float32),
      nn.unbox(jax.eval_shape(bert_objective.make_task(cfg, vocab_size).init,
                              jax.random.key(3), batch)))
