r"""Task-specific distillation (bertjax.task_distill): TinyBERT's second
phase, a fine-tuned teacher into a student on one task.

``arg`` is ``task=NAME`` (as experiments/configs/finetune.py: ``embedded``
by default, a TFDS name, or ``files``) and ``augment=on|off``.

GLUE-style tasks take task_distill.py's settings (Jiao et al. 2020,
Sec. 4.2, and the README's commands): batch 32, stage 1 (intermediate
layers) 10 epochs at lr 5e-5, stage 2 (prediction layer) 3 epochs at 3e-5,
temperature 1; with ``augment=on``, data_augmentation.py's 20 rewrites per
example (p 0.4, 15 MLM candidates), on which the paper trains stage 1.

The embedded task is sized for the demo's tiny models on a CPU: 40 training
examples per class (the fine-tuning comparison's low-resource form), lr
2e-4 in both stages (finetune.py's embedded rate), 4 rewrites per example.

  python experiments/task_distill.py \
      --config=experiments/configs/task_distill.py:augment=on \
      --config.teacher=runs/demo-finetuned --config.init=runs/tinybert \
      --workdir=runs/tinybert-embedded

Reference code: TinyBERT/task_distill.py (``att_loss + rep_loss`` in the
first run, ``soft_cross_entropy(student_logits / T, teacher_logits / T)``
with ``--pred_distill`` in the second, MSE for STS-B) and
data_augmentation.py.
"""

from bertjax import config_lib
from bertjax import task_distill


def get_config(arg=None):
  args = config_lib.parse_arg(arg, task='embedded', augment='off')
  if args['augment'] not in ('on', 'off'):
    raise ValueError(f'augment={args["augment"]!r}; use on or off.')
  c = task_distill.base_config()
  c.task.name = args['task']
  d = c.distill
  c.augment.copies = 20 if args['augment'] == 'on' else 0
  if c.task.name == 'embedded':
    c.task.examples_per_class = 40
    d.intermediate_learning_rate = d.prediction_learning_rate = 2e-4
    c.augment.copies = 4 if args['augment'] == 'on' else 0
    c.log_every_steps = 20
  return c
