r"""Fine-tuning a pretrained run on a downstream task (bertjax.finetune).

``arg`` is a comma-separated list of ``key=value``:

* ``task``: ``embedded`` (default: which standard-library package a
  docstring paragraph comes from, built from the demo corpus; no download),
  a TFDS name (``glue/sst2``, ``glue/mrpc``, ``glue/stsb``, ``squad``,
  ``conll2003``, ...) or ``files`` (JSONL/CSV: set ``task.kind``,
  ``task.train_path``, ``task.eval_path`` and the field names);
* ``mode``: ``full`` (default), ``frozen``, ``adapters``,
  ``weighted_layers`` or ``gradual_unfreeze``.

TFDS and file tasks take the BERT paper's settings (Devlin et al. 2019,
Appendix A.3): batch 32, 3 epochs, peak lr 2e-5 (the paper searches
{5e-5, 3e-5, 2e-5}), 10% warmup then linear decay, Adam with weight decay
0.01, dropout 0.1. Modes that train only a head or adapters take 1e-3
(Houlsby et al. 2019 search {3e-5 .. 3e-3}; a fixed encoder tolerates a
large rate), with adapters of 64.

SQuAD takes run_squad.py's windows (max_seq_length 384, doc_stride 128,
max_query_length 64) and the paper's SQuAD v1.1 rate, 5e-5.

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


def get_config(arg=None):
  args = finetune.config_lib.parse_arg(arg, task='embedded', mode='full')
  c = finetune.base_config()
  c.mode = args['mode']
  c.task.name = args['task']
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
