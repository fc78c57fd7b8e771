r"""Multi-task fine-tuning of a pretrained run on several tasks at once
(bertjax.multitask).

``arg`` is a comma-separated list of ``key=value``:

* ``mixing``: ``proportional`` (default: T5's examples-proportional mixing
  with a cap K = 512 examples) or ``temperature`` (T5's temperature-scaled
  mixing, T = 2, no cap).

The tasks are the two embedded tasks (no download), sized for the demo's
tiny model on a 2-core CPU (about a minute): ``embedded`` (which
standard-library package a docstring paragraph comes from, 8 classes) with
32 training examples per class (256) and ``embedded_top4`` (the same
question over the 4 largest packages) with all of its training examples
(2,401 on CPython 3.11, 9 times as many). 300 steps of 32 at
max_seq_length 64: the steps of two 150-step single-task runs. Peak lr
5e-4 (the rest the BERT paper's: 10% warmup then linear decay,
AdamWeightDecay 0.01, dropout 0.1). The heads read the mean of the
tokens (``pooling='mean'``): the demo's [CLS] takes longer to learn from
(single-task ``embedded_top4``, seed 2, 150 steps: accuracy 0.36 from
[CLS], 0.85 from the mean).

Rates (``multitask.mixing_rates``): proportional with K = 512 gives
256 : 512, a third of the steps to ``embedded`` (uncapped it would get a
tenth); temperature T = 2 gives sqrt(256) : sqrt(2401), about a quarter.

  python experiments/multitask.py --config=experiments/configs/multitask.py \
      --config.init=runs/demo --workdir=runs/demo-multitask

  python experiments/multitask.py \
      --config=experiments/configs/multitask.py:mixing=temperature \
      --config.init=runs/demo --workdir=runs/demo-multitask-t2 \
      --config.mixing_temperature=3

Per-task fine-tuning from the multi-task run: its workdir is an ``init``
of experiments/finetune.py.
"""

from bertjax import multitask


def get_config(arg=None):
  args = multitask.finetune.config_lib.parse_arg(arg, mixing='proportional')
  c = multitask.base_config()
  c.tasks.embedded = multitask.task_config('embedded', examples_per_class=32)
  c.tasks.embedded_top4 = multitask.task_config('embedded_top4')
  c.mixing = args['mixing']
  if c.mixing == 'temperature':
    c.mixing_temperature = 2.0
  else:
    c.mixing_cap = 512
  c.num_steps = 300
  c.max_seq_length = 64
  c.pooling = 'mean'
  c.batch_size = 32
  c.optimizer.learning_rate = 5e-4
  c.log_every_steps = 50
  c.checkpoint_every_steps = 100
  return c
