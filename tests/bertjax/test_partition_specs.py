"""Golden snapshot of BERT-base's train-state partition specs.

Every leaf of the state the trainer creates for BERT-base (step, parameters
and optimizer state, vocabulary 30522 padded as the trainer pads it) maps,
under the config's logical rules, to mesh axes; the snapshot
``golden/bert_base_partition_specs.json`` holds each leaf's path
('/'-joined), shape and spec (one entry per dim: null, a mesh axis, or a
list of mesh axes). A change to a logical name, a rule or the state's
structure shows up here as a diff of paths.

After an intended change, regenerate the snapshot and review its git diff:

  PYTHONPATH=. python tests/bertjax/test_partition_specs.py --update
"""

import json
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from bertjax import config_lib
from bertjax import objectives
from bertjax import optim
from bertjax import sharding
from bertjax import train
from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'golden',
                      'bert_base_partition_specs.json')


def _path(keys) -> str:
  parts = []
  for k in keys:
    if isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      parts.append(k.name)
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(str(k.idx))
    else:
      parts.append(str(k))
  return '/'.join(parts)


def _spec_entries(spec, ndim: int) -> list:
  entries = [list(a) if isinstance(a, tuple) else a for a in spec]
  return entries + [None] * (ndim - len(entries))


def current_specs() -> dict[str, dict]:
  """{path: {'shape': [...], 'spec': [...]}} of BERT-base's train state."""
  cfg = config_lib.base_config()
  vocab_size = tokenizer_lib.padded_vocab_size(cfg.data.tokenizer.vocab_size)
  task = objectives.get(cfg.objective.name).make_task(cfg, vocab_size)
  tx, _ = optim.make_optimizer(cfg)
  batch_spec = pipeline.batch_spec(cfg)

  def init_state():   # As train.train_and_evaluate's init_state.
    dummy = {k: jnp.zeros(shape, dtype)
             for k, (shape, dtype) in batch_spec.items()}
    params = task.init(jax.random.key(0), dummy)
    return train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                            opt_state=tx.init(params))

  # Specs do not depend on the mesh's sizes: one device stands for any mesh.
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  rules = sharding.logical_rules(cfg)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, _ = sharding.state_shardings(init_state, mesh, rules)
  return {
      _path(keys): {'shape': list(leaf.shape),
                    'spec': _spec_entries(leaf.sharding.spec, leaf.ndim)}
      for keys, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]}


def _dumps(specs: dict) -> str:
  """One leaf per line, sorted, so the snapshot's git diff reads by path."""
  lines = [f'  {json.dumps(path)}: {json.dumps(specs[path])}'
           for path in sorted(specs)]
  return '{\n' + ',\n'.join(lines) + '\n}\n'


def _diff(golden: dict, current: dict) -> str:
  added = sorted(set(current) - set(golden))
  removed = sorted(set(golden) - set(current))
  changed = sorted(p for p in set(golden) & set(current)
                   if golden[p] != current[p])
  out = [f'{len(added)} added, {len(removed)} removed, {len(changed)} '
         f'changed (golden {GOLDEN}):']
  out += [f'  + {p}: {current[p]}' for p in added]
  out += [f'  - {p}: {golden[p]}' for p in removed]
  out += [f'  ~ {p}: {golden[p]} -> {current[p]}' for p in changed]
  out.append('If intended, regenerate: PYTHONPATH=. python '
             'tests/bertjax/test_partition_specs.py --update')
  return '\n'.join(out)


@pytest.fixture(scope='module')
def specs():
  return current_specs()


def test_specs_match_golden(specs):
  with open(GOLDEN) as f:
    golden = json.load(f)
  if golden != specs:
    pytest.fail(_diff(golden, specs), pytrace=False)


def test_large_weights_are_sharded(specs):
  """Under the default rules no weight matrix with a dim of 768 or more is
  replicated on every device."""
  replicated = [p for p, s in specs.items()
                if p.startswith('params/') and len(s['shape']) >= 2
                and max(s['shape']) >= 768 and not any(s['spec'])]
  assert not replicated


def test_optimizer_moments_mirror_params(specs):
  params = {p.removeprefix('params/'): s for p, s in specs.items()
            if p.startswith('params/')}
  for moment in ('mu', 'nu'):
    # The Adam state is the chain's second element (after clipping).
    mirrored = {p.removeprefix(f'opt_state/1/{moment}/'): s
                for p, s in specs.items()
                if p.startswith(f'opt_state/1/{moment}/')}
    assert mirrored == params, moment


if __name__ == '__main__':
  if sys.argv[1:] != ['--update']:
    sys.exit(f'usage: PYTHONPATH=. python {sys.argv[0]} --update')
  os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
  with open(GOLDEN, 'w') as f:
    f.write(_dumps(current_specs()))
  print(f'wrote {GOLDEN}')
