"""Imports a Hugging Face checkpoint so that bertjax continues pretraining it.

  python experiments/import_hf.py --hf_dir=exported/demo --out=imported/demo
  python -m bertjax.train \\
      --config=experiments/configs/imported.py:imported/demo/config.json \\
      --workdir=runs/continued

Reads ``model.safetensors`` (or ``pytorch_model.bin``, with torch) of
BertForPreTraining, ErnieForPreTraining (with or without ``use_task_id``),
RobertaForMaskedLM, AlbertForPreTraining or ELECTRA
(``--hf_dir`` the ElectraForPreTraining discriminator, ``--generator_dir``
the ElectraForMaskedLM generator), and its SentencePiece tokenizer, which
must have bertjax's layout ([PAD], [UNK], [CLS], [SEP], [MASK] at ids 0-4:
bertjax's own exports and ALBERT's ``spiece.model``). Writes ``--out``:
``config.json`` (the checkpoint's architecture on bertjax's defaults, with
``init_from`` pointing here), ``tokenizer.model`` and the parameters.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

from bertjax import errors  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.interop import hf_convert  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.interop import hf_tokenizer  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--hf_dir', required=True,
                      help='a transformers model directory.')
  parser.add_argument('--generator_dir', default=None,
                      help='ELECTRA: the ElectraForMaskedLM directory.')
  parser.add_argument('--out', required=True,
                      help='a new directory to write.')
  args = parser.parse_args(argv)
  try:
    tokenizer = hf_tokenizer.load_tokenizer(args.hf_dir)
    imported = hf_convert.import_model(args.hf_dir, args.generator_dir)
    config = hf_convert.write_import(imported, tokenizer, args.out,
                                     source=os.path.abspath(args.hf_dir))
  except (errors.UserError, ValueError) as e:
    parser.exit(2, f'import_hf: {e}\n')
  print(f'{imported.family} checkpoint imported into {args.out}; continue '
        'pretraining with\n  python -m bertjax.train '
        f'--config=experiments/configs/imported.py:{config} '
        '--workdir=WORKDIR')


if __name__ == '__main__':
  main()
