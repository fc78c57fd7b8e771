"""Exports a bertjax run to a Hugging Face transformers directory.

  python experiments/export.py --workdir=runs/demo --out=exported/demo

writes ``config.json``, ``model.safetensors`` (numpy; no torch needed), the
run's tokenizer for ``AutoTokenizer`` and a README saying what the
transformers class has no place for. The family (BertForPreTraining,
RobertaForMaskedLM, AlbertForPreTraining, ElectraForPreTraining +
ElectraForMaskedLM, DistilBertForMaskedLM) follows the run's config;
``--family=bert`` exports a RoBERTa-style run as BertForPreTraining.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

from bertjax import errors  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.interop import hf_convert  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import storage  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True,
                      help='a training run\'s --workdir.')
  parser.add_argument('--out', required=True,
                      help='a new directory to write (never overwritten).')
  parser.add_argument('--step', type=int, default=None,
                      help='the checkpoint step (default: the latest).')
  parser.add_argument('--family', choices=hf_convert.FAMILIES, default=None,
                      help='default: from the run\'s config.')
  args = parser.parse_args(argv)
  try:
    written = hf_convert.export_run(args.workdir, args.out, args.step,
                                    args.family)
  except (errors.UserError, ValueError) as e:
    parser.exit(2, f'export: {e}\n')
  for directory in written:
    architecture = storage.read_text(os.path.join(
        directory, 'config.json')).split('"architectures": [')[1].split('"')[1]
    print(f'{directory}: {architecture}')


if __name__ == '__main__':
  main()
