r"""Fine-tuning a pretrained run on a downstream task (bertjax.finetune).

``arg`` is a comma-separated list of ``key=value``:

* ``task``: ``embedded`` (default: which standard-library package a
  docstring paragraph comes from, built from the demo corpus; no download),
  a TFDS name (``glue/sst2``, ``glue/mrpc``, ``glue/stsb``, ``squad``,
  ``conll2003``, ...) or ``files`` (JSONL/CSV: set ``task.kind``,
  ``task.train_path``, ``task.eval_path`` and the field names);
* ``mode``: ``full`` (default), ``frozen``, ``adapters``,
  ``weighted_layers`` or ``gradual_unfreeze``;
* ``recipe``: ``bert`` (default) or ``electra``, with ``size`` (``small``,
  ``base`` (default) or ``large``) for ELECTRA's rates.

TFDS and file tasks take the BERT paper's settings (Devlin et al. 2019,
Appendix A.3): batch 32, 3 epochs, peak lr 2e-5 (the paper searches
{5e-5, 3e-5, 2e-5}), 10% warmup then linear decay, Adam with weight decay
0.01, dropout 0.1. Modes that train only a head or adapters take 1e-3
(Houlsby et al. 2019 search {3e-5 .. 3e-3}; a fixed encoder tolerates a
large rate), with adapters of 64.

SQuAD takes run_squad.py's windows (max_seq_length 384, doc_stride 128,
max_query_length 64) and the paper's SQuAD v1.1 rate, 5e-5.

``recipe=electra`` takes google-research/electra's fine-tuning
(configure_finetuning.py, model/optimization.py, the classification
heads of finetune/classification/classification_tasks.py) for a run
pretrained with experiments/configs/electra.py:

- the head reads the [CLS] state with no pooler (``pooling='first'``),
  through dropout 0.1 and one linear layer;
- AdamW without bias correction (eps 1e-6, weight decay 0.01 on all but
  LayerNorm and biases: the code's; the paper's Table 7 says 0), global
  clip 1.0, ELECTRA's schedule (linear decay times ``min(1, t / W)``, W a
  tenth of the steps, unrounded);
- layer-wise lr decay 0.8 (0.9 for large): the head at the full rate, the
  top layer at 0.8^2, the embeddings at 0.8^(layers + 2);
- the paper's rates (Table 7): 3e-4 small, 1e-4 base, 5e-5 large (the
  code's default is 1e-4 for small as well);
- 3 epochs; 10 for RTE and STS-B, 2 for SQuAD (with 512 tokens); MRPC
  and STS-B train on each pair in both orders (``double_unordered``);
- every weight trains (``mode=full``; other modes are refused);
- the loss is the sum over the batch's examples, not the mean
  (``loss_reduction='sum'``: run_finetuning.py's ``tf.reduce_sum``), so
  the global clip at 1.0 acts on 32 examples' summed gradient; STS-B's
  labels are scaled to [0, 1] (``regression_normalize=(0, 5)``,
  ``RegressionTask._add_features``).

The linear layer starts from Glorot uniform (``head_init='glorot'``:
``tf.layers.dense``'s default, which ELECTRA's heads take). Departures:
SQuAD is v1.1 (ELECTRA's ``squad`` is 2.0) with BERT's span head and mean
loss (ELECTRA's predicts the end given the start, ``joint_prediction``);
an epoch is the full batches of a fresh permutation, the last partial
batch left out, where ELECTRA pads the examples to a whole batch with
zero-loss rows (``preprocessing.py``: RTE 770 steps here, 780 there),
writes them once in an unseeded shuffle and reads them repeated through
a 100-example shuffle buffer; on a TPU, ELECTRA's sum is per core and
``CrossShardOptimizer`` averages the cores.

The embedded task keeps its own sizing (examples, epochs, rate), which
the demo's tiny model needs, and takes the rest.

Reference code: google-research/bert run_classifier.py (``create_model``:
the pooled [CLS] output, dropout, one linear layer; optimization.py
``create_optimizer`` with 10% warmup) and run_squad.py (the span head).

The embedded task is sized for the demo's tiny model on a CPU: 256
training examples per class (a low-resource task, where pretraining
matters), 8 epochs, peak lr 2e-4 (1e-3 for head- or adapter-only modes).

  python experiments/finetune.py --config=experiments/configs/finetune.py \
      --config.init=/tmp/bertjax-demo --workdir=/tmp/bertjax-demo-finetuned \
      --compare_scratch

  python experiments/finetune.py \
      --config=experiments/configs/finetune.py:task=glue/mrpc,mode=adapters \
      --config.init=$WORK/bert-base-p2 --workdir=$WORK/bert-base-mrpc
"""

from bertjax import finetune


# ELECTRA's fine-tuning rate and layer-wise decay, by model size.
_ELECTRA = {'small': (3e-4, 0.8), 'base': (1e-4, 0.8), 'large': (5e-5, 0.9)}


def get_config(arg=None):
  args = finetune.config_lib.parse_arg(arg, task='embedded', mode='full',
                                       recipe='bert', size='')
  if args['recipe'] not in ('bert', 'electra'):
    raise ValueError(f"recipe={args['recipe']}; use bert or electra.")
  if args['size'] and args['recipe'] != 'electra':
    raise ValueError('size= picks ELECTRA\'s rates; give it with '
                     'recipe=electra.')
  if args['recipe'] == 'electra':
    return _electra(args['task'], args['mode'], args['size'] or 'base')
  return _bert(args['task'], args['mode'])


def _bert(task, mode):
  c = finetune.base_config()
  c.mode = mode
  c.task.name = task
  head_only = c.mode in ('frozen', 'adapters', 'weighted_layers')
  if c.task.name == 'embedded':
    c.task.examples_per_class = 256
    c.num_epochs = 8.0
    c.optimizer.learning_rate = 1e-3 if head_only else 2e-4
    c.log_every_steps = 20
  elif c.task.name == 'squad':
    # run_squad.py's windows; the paper's SQuAD v1.1 rate (A.3, Sec. 4.2).
    c.max_seq_length, c.doc_stride = 384, 128
    c.optimizer.learning_rate = 1e-3 if head_only else 5e-5
  elif head_only:
    c.optimizer.learning_rate = 1e-3
  return c


def _electra(task, mode, size):
  if size not in _ELECTRA:
    raise ValueError(f'size={size}; use one of {sorted(_ELECTRA)}.')
  if mode != 'full':
    raise ValueError(f"mode={mode} with recipe=electra: ELECTRA's recipe "
                     'fine-tunes every weight; use mode=full.')
  c = _bert(task, mode)
  c.pooling, c.head_init = 'first', 'glorot'
  o = c.optimizer
  o.schedule = 'electra'
  if task != 'embedded':
    o.learning_rate = _ELECTRA[size][0]
  o.layerwise_lr_decay = _ELECTRA[size][1]
  if task in ('glue/rte', 'glue/stsb'):
    c.num_epochs = 10.0
  elif task == 'squad':
    c.num_epochs, c.max_seq_length = 2.0, 512
  c.task.double_unordered = task in ('glue/mrpc', 'glue/stsb')
  if task == 'glue/stsb':
    c.task.regression_normalize = (0.0, 5.0)
  if task != 'squad':   # Sentence-level heads: ELECTRA sums their losses.
    c.loss_reduction = 'sum'
  return c
