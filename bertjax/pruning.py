"""Making a trained encoder smaller: attention heads pruned by importance
(Michel et al., NeurIPS 2019) and layers kept from a LayerDrop run (Fan et
al., ICLR 2020).

Both work on a parameter tree with the encoder's layers as ``layer_{i}``
(a ``bert`` run's, or a fine-tuning model's) and its ``BertConfig``, and
return both smaller: a pruned layer stores only the heads it keeps
(``BertConfig.pruned_heads`` names the others by their index in the
unpruned layer, as transformers' ``pruned_heads`` does), and a model of
kept layers has only those. experiments/compress.py writes either as a
workdir that fine-tuning, export and further training start from.

Head importance (Michel et al. Sec. 4.1, and their code): each head's
output is multiplied by a gate xi_h = 1, and I_h = sum over the batches b
of |dL_b/dxi_h|, the absolute value of each batch's gradient (the paper's
code takes it per example and token, transformers' bertology example of a
running total), then divided by the L2 norm of its layer's scores (the
paper's Sec. 4.1 normalisation).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import bert as bert_lib

GATES = 'head_gates'


def layer_names(params: dict) -> list[str]:
  """``layer_0`` ... ``layer_{N-1}`` of ``params``, in order."""
  names = [k for k in params if k.startswith('layer_')]
  return sorted(names, key=lambda k: int(k.split('_')[1]))


def attention_parameters(params: dict) -> int:
  """Parameters of every layer's attention (Q/K/V and output projections)."""
  return sum(int(np.prod(np.shape(leaf))) for name in layer_names(params)
             for leaf in jax.tree.leaves(params[name]['attention']))


def head_gates(apply: Callable, params: dict, batch: dict) -> dict:
  """The gates' tree (ones) for ``apply(variables, batch, mutable)``:
  ``{'layer_i': {'attention': {'gate': [heads_i]}}}`` and so on, as the
  model's modules nest."""
  # Traced for shapes only: no forward pass is computed.
  _, state = jax.eval_shape(
      lambda p, b: apply({'params': p}, b, [GATES]), params, batch)
  return jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), state[GATES])


def head_importance(loss: Callable, apply: Callable, params: dict,
                    batches: Iterable[dict]) -> list[np.ndarray]:
  """Michel et al.'s importance of each stored head, per layer.

  Args:
    loss: ``loss(variables, batch) -> scalar``, the model applied with
      ``variables`` (``params`` and the ``head_gates`` collection) in
      deterministic mode, and its loss on ``batch``.
    apply: ``apply(variables, batch, mutable) -> (outputs, state)``, to
      create the gates once.
    params: the model's parameters.
    batches: the data to score on (at least one batch).

  Returns:
    One float64 array per layer (in ``layer_{i}`` order) of its stored
    heads' scores, each layer's divided by its L2 norm.
  """
  batches = iter(batches)
  first = next(batches, None)
  if first is None:
    raise ValueError('head importance needs at least one batch of data.')
  gates = head_gates(apply, params, first)
  # The parameters are an argument, not constants compiled into the program.
  grad = jax.jit(jax.grad(lambda g, p, b: loss({'params': p, GATES: g}, b)))
  total = None
  for batch in [first, *batches]:
    scores = jax.tree.map(lambda g: np.abs(np.asarray(g, np.float64)),
                          grad(gates, params, batch))
    total = scores if total is None else jax.tree.map(np.add, total, scores)
  out = []
  for name in layer_names(total):
    scores = np.asarray(total[name]['attention']['gate'])
    out.append(scores / (np.linalg.norm(scores) + 1e-20))
  return out


def least_important(importance: list[np.ndarray], count: int
                    ) -> dict[int, list[int]]:
  """The ``count`` heads of lowest importance over all layers (ties to the
  earlier layer and head), never a layer's last one: {layer: [stored
  heads]}."""
  order = sorted((float(score), layer, head)
                 for layer, scores in enumerate(importance)
                 for head, score in enumerate(scores))
  left = [len(scores) for scores in importance]
  chosen: dict[int, list[int]] = {}
  found = 0
  for _, layer, head in order:
    if found == count:
      break
    if left[layer] > 1:
      left[layer] -= 1
      found += 1
      chosen.setdefault(layer, []).append(head)
  if found < count:
    raise ValueError(f'cannot remove {count} heads: {found} can go with '
                     'every layer keeping one.')
  return {layer: sorted(heads) for layer, heads in sorted(chosen.items())}


def _model_layers(params: dict, model: bert_lib.BertConfig) -> list[str]:
  """``layer_names(params)``, one per layer of ``model`` (else an error)."""
  names = layer_names(params)
  if len(names) != model.num_layers:
    raise ValueError(f'the parameters have {len(names)} layers and the '
                     f'model {model.num_layers}: give unshared, unscanned '
                     'layers.')
  return names


def _kept_heads(model: bert_lib.BertConfig, layer: int) -> list[int]:
  """The original indices of ``layer``'s stored heads, in storage order."""
  pruned = set(model.pruned_heads[layer]) if model.pruned_heads else set()
  return [h for h in range(model.num_heads) if h not in pruned]


def remove_heads(params: dict, model: bert_lib.BertConfig,
                 remove: dict[int, Iterable[int]]
                 ) -> tuple[dict, bert_lib.BertConfig]:
  """``params`` and ``model`` without the heads ``remove`` names ({layer:
  stored head indices}); the other heads keep their order and values.

  Raises:
    ValueError: a layer or head that is not there, or a layer left with no
      head.
  """
  names = _model_layers(params, model)
  unknown = set(remove) - set(range(len(names)))
  if unknown:
    raise ValueError(f'no layer {sorted(unknown)}: the model has '
                     f'{len(names)}.')
  params = dict(params)
  pruned = []
  for layer, name in enumerate(names):
    kept = _kept_heads(model, layer)
    drop = sorted(set(remove.get(layer, ())))
    if any(not 0 <= h < len(kept) for h in drop) or len(drop) >= len(kept):
      raise ValueError(f'layer {layer} stores {len(kept)} heads: cannot '
                       f'remove {drop} (a layer keeps at least one head).')
    stay = np.asarray([h for h in range(len(kept)) if h not in drop])
    attention = dict(params[name]['attention'])
    attention['qkv_kernel'] = np.asarray(attention['qkv_kernel'])[:, :, stay]
    attention['qkv_bias'] = np.asarray(attention['qkv_bias'])[:, stay]
    attention['out_kernel'] = np.asarray(attention['out_kernel'])[stay]
    params[name] = dict(params[name], attention=attention)
    removed = set(range(model.num_heads)) - {kept[h] for h in stay}
    pruned.append(tuple(sorted(removed)))
  pruned = tuple(pruned) if any(pruned) else ()
  return params, dataclasses.replace(model, pruned_heads=pruned)


def keep_layers(params: dict, model: bert_lib.BertConfig,
                layers: Iterable[int]) -> tuple[dict, bert_lib.BertConfig]:
  """``params`` and ``model`` with only ``layers`` (in order, renumbered
  from 0), the rest of the tree as it was: LayerDrop's pruning at
  inference (Fan et al. Sec. 4)."""
  layers = list(layers)
  names = _model_layers(params, model)
  if (not layers or sorted(set(layers)) != layers
      or not all(0 <= i < len(names) for i in layers)):
    raise ValueError(f'layers={layers}: give distinct increasing layers in '
                     f'[0, {len(names)}), at least one.')
  out = {k: v for k, v in params.items() if k not in names}
  for j, i in enumerate(layers):
    out[f'layer_{j}'] = params[names[i]]
  pruned = (tuple(model.pruned_heads[i] for i in layers)
            if model.pruned_heads else ())
  return out, dataclasses.replace(model, num_layers=len(layers),
                                  pruned_heads=pruned)


def zero_filled(params: dict, model: bert_lib.BertConfig) -> dict:
  """``params`` with every pruned head back in its place as zeros: the
  unpruned shapes, computing what the pruned model computes (a head with
  zero Q, K and V adds nothing through its zero output columns). For
  readers without head pruning (transformers 5 removed it)."""
  if not model.pruned_heads:
    return params
  params = dict(params)
  for layer, name in enumerate(layer_names(params)):
    kept = np.asarray(_kept_heads(model, layer))
    attention = dict(params[name]['attention'])
    for key, axis in (('qkv_kernel', 2), ('qkv_bias', 1), ('out_kernel', 0)):
      value = np.asarray(attention[key])
      shape = list(value.shape)
      shape[axis] = model.num_heads
      full = np.zeros(shape, value.dtype)
      index = [slice(None)] * value.ndim
      index[axis] = kept
      full[tuple(index)] = value
      attention[key] = full
    params[name] = dict(params[name], attention=attention)
  return params
