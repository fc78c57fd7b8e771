"""The Grain input pipeline: instances -> masking -> fixed-shape batches.

  InstanceDataset (random access, endless, shuffled per epoch), or for a
  corpus mixture MixedInstances over one per component (mixture.py)
  InstanceBatches                  this host's share, built a batch at a
                                   time (vectorized), fixed shapes [B, L]
    .map(mask)                     vectorized masking of the whole batch
    .to_iter_dataset(ReadOptions)  threads + prefetch; checkpointable

Global batch ``b`` is elements ``[b * B, (b + 1) * B)`` of the stream; each
host reads only the rows of it that its devices hold (``rows``, from the
batch's sharding), and masking depends only on an element's index: the bytes
of a global batch, and the row each element lands in, do not depend on the
number of hosts or workers.
"""

from __future__ import annotations

import dataclasses

from absl import flags
import grain
import numpy as np

from data_pipelines import continual as continual_lib
from data_pipelines import discourse as discourse_lib
from data_pipelines import instances as instances_lib
from data_pipelines import masking as masking_lib
from data_pipelines import mixture as mixture_lib
from data_pipelines import pretokenize
from data_pipelines import tasks as tasks_lib
from data_pipelines.counter_rng import Stream

# What the model sees; the rest stays on the host.
MODEL_FEATURES = ('input_ids', 'token_type_ids', 'attention_mask',
                  'masked_positions', 'masked_ids', 'masked_weights',
                  'masked_unit_start', 'next_sentence_labels')
STATISTICS = 'masking_statistics'

# What ``pretokenize.prepare`` or ``mixture.prepare`` returns.
Prepared = pretokenize.PreparedData | mixture_lib.MixturePrepared


@dataclasses.dataclass(frozen=True)
class _MaskAndPack(grain.transforms.Map):
  """Builds a batch's tasks, masks it, and keeps the fields the model reads.

  The stream's ``tasks`` (data_pipelines/tasks/: the corrupting one first,
  so that masking sees the sequence it made) run before masking; with
  ``mlm`` False the batch is not masked (its MLM slots are empty). Fields of
  the run's other tasks (``all_tasks``: those of other streams, as
  ``tasks.batch_fields`` gives them) are zeros with ``<task>_present`` 0;
  ``task_id`` >= 0 adds ``task_type_ids`` (ERNIE 2.0's task embedding).
  """
  config: masking_lib.MaskingConfig
  seed: int
  tasks: tuple = ()              # ((name, params), ...) this stream builds.
  all_tasks: tuple = ()          # ((name, {field: (shape, dtype)}), ...).
  mlm: bool = True
  task_id: int = -1

  def map(self, batch):
    batch = dict(batch)
    batch['next_sentence_labels'] = batch.pop('next_sentence_label')
    for name, params in sorted(self.tasks,
                               key=lambda t: not tasks_lib.get(t[0]).corrupts):
      apply = tasks_lib.get(name).apply
      if apply is not None:
        batch = apply(batch, params, self.seed)
    if self.mlm:
      batch = masking_lib.mask_batch(batch, self.config, self.seed)
      batch = unlabel_rewritten(batch, [n for n, _ in self.tasks])
    else:
      batch.update(_no_predictions(batch['input_ids'].shape[0],
                                   self.config.max_predictions_per_seq))
    out = {k: batch[k] for k in MODEL_FEATURES}
    out.update(_task_fields(batch, dict(self.tasks), self.all_tasks))
    if self.task_id >= 0:
      out['task_type_ids'] = np.full(batch['input_ids'].shape,
                                     self.task_id, np.int32)
    # Host-side telemetry; the trainer pops it before the batch goes to
    # the devices. A batch that is not masked counts nothing.
    out[STATISTICS] = (masking_lib.statistics(batch) if self.mlm else
                       np.zeros(masking_lib.NUM_STATISTICS))
    return out


def unlabel_rewritten(batch: dict, names) -> dict:
  """Weight 0 where MLM put [MASK] or a random token, for the tasks among
  ``names`` whose labels say what became of the token shown there
  (``HostTask.shown_token_labels``): the input no longer shows that token,
  so the label would not fit it (a random token labelled "not replaced",
  a [MASK] over an inserted one)."""
  fields = [tasks_lib.get(n).weight_field for n in names
            if tasks_lib.get(n).shown_token_labels]
  if not fields:
    return batch
  rewritten = ((batch['masked_weights'] > 0)
               & (batch['masked_corruption'] != masking_lib.CORRUPT_KEEP))
  rows = np.broadcast_to(np.arange(len(rewritten))[:, None],
                         rewritten.shape)
  shown = np.ones(batch['input_ids'].shape, bool)
  shown[rows[rewritten], batch['masked_positions'][rewritten]] = False
  return dict(batch, **{f: batch[f] * shown.astype(batch[f].dtype)
                        for f in fields})


def _task_fields(batch: dict, built, all_tasks) -> dict:
  """The fields of every task of the run: the batch's own for the tasks
  ``built``, zeros for the others; and each one's ``<task>_present``."""
  rows = batch['input_ids'].shape[0]
  out = {}
  for name, fields in all_tasks:
    present = tasks_lib.present_field(name)
    for field, (shape, dtype) in fields.items():
      if field != present:
        out[field] = (batch[field] if name in built else
                      np.zeros((rows,) + tuple(shape), dtype))
    out[present] = np.full(rows, float(name in built), np.float32)
  return out


def _no_predictions(rows: int, slots: int) -> dict:
  """Empty MLM slots: a batch of a stream without masked LM."""
  zeros = np.zeros((rows, slots), np.int32)
  return {'masked_positions': zeros, 'masked_ids': zeros,
          'masked_weights': np.zeros((rows, slots), np.float32),
          'masked_unit_start': zeros,
          'masked_corruption': np.full((rows, slots),
                                       masking_lib.CORRUPT_KEEP, np.int8)}


def instance_config(cfg, layout: str = '', task_names=(), tokenizer=None
                    ) -> instances_lib.InstanceConfig:
  """The instance builder's settings for a stream of ``layout`` ('' =
  ``data.layout``) whose tasks are ``task_names``; ``tokenizer`` spells
  the discourse markers of the ``discourse`` layout."""
  layout = layout or cfg.data.layout
  extra = {flag: True for name in task_names
           for flag in tasks_lib.get(name).instance_flags}
  if layout == 'sentence_distance':
    extra['distance_probabilities'] = tuple(
        cfg.tasks.sentence_distance.probabilities)
  if layout == 'discourse':
    path = cfg.tasks.discourse_relation.markers_path
    extra['discourse_markers'] = discourse_lib.discourse_marker_ids(
        tokenizer, path)[0]
    extra['discourse_markers_path'] = path
  return instances_lib.InstanceConfig(
      layout=layout, max_seq_length=cfg.data.max_seq_length,
      short_seq_prob=cfg.data.short_seq_prob, **extra)


def masking_config(cfg, prepared: Prepared) -> masking_lib.MaskingConfig:
  return masking_lib.MaskingConfig.from_config(
      cfg.masking, prepared.tokenizer.vocab_size,
      prepared.train_unigram_counts,
      punctuation=(prepared.tokenizer.punctuation_table
                   if cfg.masking.split_punctuation else None))


def _instances(prepared: pretokenize.PreparedData, cfg, split: str,
               spec: continual_lib.StreamSpec,
               **kwargs) -> instances_lib.InstanceDataset:
  source = prepared.train_source if split == 'train' else prepared.eval_source
  index = prepared.train_index if split == 'train' else prepared.eval_index
  config = instance_config(cfg, spec.layout, spec.tasks, prepared.tokenizer)
  builder = instances_lib.InstanceBuilder(source, index, config, cfg.seed)
  # A continual run's streams read the corpus in orders of their own: two
  # of one layout would otherwise build the same instances step for step.
  order_key = () if spec.task_id < 0 else (Stream.CONTINUAL, spec.task_id)
  return instances_lib.InstanceDataset(
      builder, seed=cfg.seed, dupe_factor=cfg.data.dupe_factor,
      dynamic=cfg.masking.dynamic, order_key=order_key, **kwargs)


def split_instances(prepared: Prepared, cfg, split: str,
                    num_epochs: int | None = None,
                    spec: continual_lib.StreamSpec | None = None):
  """The instances of ``split`` ('train' or 'eval') for stream ``spec``
  (None: the run's only one).

  For one corpus, its ``InstanceDataset`` (``num_epochs`` of it; None =
  endless). For a mixture, the ``MixedInstances`` of the components'
  endless datasets of that split, whatever ``num_epochs``: a mixture has no
  epochs.
  """
  spec = spec or continual_lib.streams(cfg)[0]
  if isinstance(prepared, mixture_lib.MixturePrepared):
    return mixture_lib.MixedInstances(
        [_instances(p, cfg, split, spec) for p in prepared.components],
        prepared.probabilities, cfg.seed)
  return _instances(prepared, cfg, split, spec, num_epochs=num_epochs)


def _mask_and_pack(prepared: Prepared, cfg,
                   spec: continual_lib.StreamSpec) -> _MaskAndPack:
  """Stream ``spec``'s tasks and masking, with every field of the run."""
  vocab_size = prepared.tokenizer.vocab_size
  all_tasks = tasks_lib.batch_fields(cfg, continual_lib.run_tasks(cfg))
  return _MaskAndPack(
      masking_config(cfg, prepared), cfg.seed,
      tasks=tuple((n, tasks_lib.run_params(cfg, n, vocab_size))
                  for n in spec.tasks),
      all_tasks=tuple(sorted(all_tasks.items())), mlm=spec.mlm,
      task_id=spec.task_id)


def _stream_batches(prepared: Prepared, cfg, spec, split: str, rows,
                    num_batches: int | None = None):
  """Stream ``spec``'s batches of ``split``, built, masked and packed."""
  ds = split_instances(prepared, cfg, split,
                       None if num_batches is None else 1, spec)
  if num_batches is not None:
    num_batches = min(num_batches, len(ds) // cfg.batch_size)
    if num_batches == 0:
      raise pretokenize.DataError(
          f'the eval split has {len(ds)} instances of stream {spec.name!r} '
          f'(data.layout={spec.layout!r}), fewer than one batch of '
          f'{cfg.batch_size}; raise data.eval_fraction or lower batch_size.')
  ds = instances_lib.InstanceBatches(ds, cfg.batch_size, rows, num_batches)
  return ds.map(_mask_and_pack(prepared, cfg, spec))


def train_dataset(prepared: Prepared, cfg, rows: np.ndarray | None = None
                  ) -> grain.IterDataset:
  """The endless training stream of this host's masked batches (for a
  continual run, the streams' batches in the schedule's order).

  ``rows``: the rows of each global batch this host reads (sorted); None =
  all of them.
  """
  specs = continual_lib.streams(cfg)
  if continual_lib.is_continual(cfg):
    ds = continual_lib.ScheduledBatches(
        [_stream_batches(prepared, cfg, s, 'train', rows) for s in specs],
        continual_lib.Schedule(cfg.continual.stage_steps, specs, cfg.seed))
  else:
    ds = _stream_batches(prepared, cfg, specs[0], 'train', rows)
  ds = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=cfg.data.num_threads,
      prefetch_buffer_size=cfg.data.prefetch_batches))
  num_workers = cfg.data.get('num_workers', 0)
  if num_workers:
    # Grain's workers read absl flags; outside an absl app (tests,
    # notebooks) they would raise before the flags are parsed.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    # Worker processes each build whole batches; Grain interleaves them in
    # order, so the stream does not depend on the number of workers.
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=num_workers, per_worker_buffer_size=2))
  return ds


def eval_batches(prepared: Prepared, cfg, rows: np.ndarray | None = None,
                 sum_over_processes=None) -> list[dict]:
  """The fixed held-out batches: epoch 0 of the eval split, masked once.

  At most ``eval.num_batches`` global batches; fewer when the split is small.
  For a mixture: the first ``eval.num_batches`` global batches of the
  mixture of the components' (endless) eval splits. For a continual run,
  those of each stream in turn, so each task is measured on its own. Each
  task's ``check_data`` runs on its stream's batches (before anything is
  compiled); with ``rows`` of a multi-host run, pass
  ``sum_over_processes`` (bertjax.runtime.distributed's) so it fails only
  on data no process's rows can teach from, and then on every process
  (``check_task_data``).
  """
  out = []
  for spec in continual_lib.streams(cfg):
    ds = _stream_batches(prepared, cfg, spec, 'eval', rows,
                         cfg.eval.num_batches)
    batches = [ds[i] for i in range(len(ds))]
    for name in spec.tasks:   # Data that cannot teach a task fails here.
      check_data = tasks_lib.get(name).check_data
      if check_data is not None:
        check_task_data(check_data, batches, sum_over_processes)
    out.extend(batches)
  return out


def check_task_data(check_data, batches: list[dict],
                    sum_over_processes=None) -> None:
  """``check_data(batches)``; with ``sum_over_processes`` (each process
  holding its rows of the batches: a collective, every process calls it)
  the data fails only when every process's rows fail, and then every
  process raises, so none waits on the others at the next collective."""
  try:
    check_data(batches)
    error = None
  except pretokenize.DataError as e:
    error = e
  passed = np.array([error is None], np.float64)
  if sum_over_processes is not None:
    passed = sum_over_processes(passed)
  if not passed[0]:   # Then no process passed, this one included.
    raise error


def batch_spec(cfg, num_rows: int | None = None) -> dict:
  """Shapes and dtypes of a batch of ``num_rows`` rows (None = the global
  batch), without reading any data."""
  b = cfg.batch_size if num_rows is None else num_rows
  l, p = cfg.data.max_seq_length, cfg.masking.max_predictions_per_seq
  spec = {
      'input_ids': ((b, l), np.int32), 'token_type_ids': ((b, l), np.int32),
      'attention_mask': ((b, l), np.int32),
      'masked_positions': ((b, p), np.int32),
      'masked_ids': ((b, p), np.int32),
      'masked_weights': ((b, p), np.float32),
      'masked_unit_start': ((b, p), np.int32),
      'next_sentence_labels': ((b,), np.int32),
  }
  for fields in tasks_lib.batch_fields(
      cfg, continual_lib.run_tasks(cfg)).values():
    spec.update({k: ((b,) + tuple(shape), dtype)
                 for k, (shape, dtype) in fields.items()})
  if continual_lib.is_continual(cfg):
    spec['task_type_ids'] = ((b, l), np.int32)
  return spec
