"""A model imported from Hugging Face (experiments/import_hf.py), continued.

The import writes ``IMPORTED/config.json``: the checkpoint's architecture,
its tokenizer and ``init_from=IMPORTED`` (the imported parameters, with a
fresh optimizer), on top of bertjax's defaults (BERT's optimizer and data
settings: google-research/bert's optimization.py, as bert.py). Continue
pretraining with it, overriding any training field:

  python -m bertjax.train \\
      --config=experiments/configs/imported.py:IMPORTED/config.json \\
      --workdir=$WORK/continued --config.data.corpus.source=files \\
      --config.data.corpus.path='/data/corpus/*.txt'
"""

import json

from bertjax import config_lib


def get_config(arg=None):
  if not arg:
    raise ValueError('give the import\'s config: '
                     'experiments/configs/imported.py:IMPORTED/config.json')
  with open(arg) as f:
    return config_lib.from_saved(json.load(f))
