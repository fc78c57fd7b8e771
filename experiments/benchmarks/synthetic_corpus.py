r"""A deterministic synthetic corpus of any size, for data-preparation runs.

Text in google-research/bert's format (a sentence per line, a blank line
between documents) with the statistics that make tokenizing it cost what a
real corpus costs:

- words drawn from 60,000 made-up words (syllables of English letters, 1-4
  syllables each) with Zipf's law (exponent 1.1), so a SentencePiece model
  of 8,000-32,000 pieces has to split the rare ones into pieces, as it does
  in English text;
- sentences of 5-40 words (log-normal, median 17: Wikipedia's is about 20),
  capitalised and ended with a period, some with a comma or digits;
- documents of 3-60 sentences (log-normal, median 14).

The same (megabytes, seed) gives the same bytes; files of ``--file_mb``
each. Writing 1 GB takes about two minutes.

  python experiments/benchmarks/synthetic_corpus.py --out=/tmp/corpus \
      --megabytes=100
"""

from __future__ import annotations

import argparse
import os

import numpy as np

_ONSETS = ('', 'b', 'c', 'd', 'f', 'g', 'h', 'j', 'k', 'l', 'm', 'n', 'p',
           'r', 's', 't', 'v', 'w', 'y', 'z', 'br', 'ch', 'cl', 'dr', 'fl',
           'gr', 'pl', 'pr', 'sh', 'sk', 'sl', 'sp', 'st', 'str', 'th', 'tr')
_NUCLEI = ('a', 'e', 'i', 'o', 'u', 'ai', 'ea', 'ee', 'ie', 'oo', 'ou', 'y')
_CODAS = ('', '', '', 'n', 'r', 's', 't', 'l', 'd', 'm', 'ng', 'st', 'ck',
          'nd', 'rt', 'x')
NUM_WORDS = 60_000
_CHUNK_SENTENCES = 20_000


def vocabulary(rng: np.random.Generator) -> np.ndarray:
  """``NUM_WORDS`` distinct made-up words, most frequent first."""
  words, seen = [], set()
  while len(words) < NUM_WORDS:
    syllables = 1 + min(int(rng.geometric(0.45)) - 1, 3)
    word = ''.join(_ONSETS[rng.integers(len(_ONSETS))]
                   + _NUCLEI[rng.integers(len(_NUCLEI))]
                   + _CODAS[rng.integers(len(_CODAS))]
                   for _ in range(syllables))
    if word not in seen:
      seen.add(word)
      words.append(word)
  # Frequent words are short, as in natural language.
  words.sort(key=lambda w: (len(w), w))
  return np.array(words, dtype=object)


def _sentences(rng: np.random.Generator, words: np.ndarray,
               zipf: np.ndarray, count: int) -> list[str]:
  lengths = np.clip(np.rint(rng.lognormal(np.log(17), 0.5, count)),
                    5, 40).astype(int)
  ids = rng.choice(len(words), size=int(lengths.sum()), p=zipf)
  tokens = words[ids]
  commas = rng.random(len(tokens)) < 0.06
  tokens[commas] = np.char.add(tokens[commas].astype(str), ',')
  numbers = rng.random(len(tokens)) < 0.02
  tokens[numbers] = rng.integers(1, 3000, int(numbers.sum())).astype(str)
  out, start = [], 0
  for n in lengths:
    sentence = ' '.join(tokens[start:start + n]).rstrip(',')
    out.append(sentence[:1].upper() + sentence[1:] + '.')
    start += n
  return out


def write(out_dir: str, megabytes: float, seed: int = 0,
          file_mb: float = 32) -> list[str]:
  """Writes the corpus as ``corpus-NNNNN.txt`` files; returns their paths.

  Reuses a corpus already written there with the same settings.
  """
  os.makedirs(out_dir, exist_ok=True)
  stamp = os.path.join(out_dir, '.complete')
  settings = f'{megabytes} {seed} {file_mb}\n'
  if os.path.exists(stamp) and open(stamp).read() == settings:
    return sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir)
                  if f.startswith('corpus-'))
  for name in os.listdir(out_dir):
    if name.startswith('corpus-'):
      os.remove(os.path.join(out_dir, name))
  rng = np.random.default_rng(seed)
  words = vocabulary(rng)
  zipf = 1.0 / np.arange(1, NUM_WORDS + 1) ** 1.1
  zipf /= zipf.sum()
  total, limit = 0, int(megabytes * 2**20)
  file_limit = int(file_mb * 2**20)
  paths, f, in_file = [], None, file_limit
  pending: list[str] = []
  while total < limit:
    if not pending:
      pending = _sentences(rng, words, zipf, _CHUNK_SENTENCES)[::-1]
    if in_file >= file_limit:
      if f:
        f.close()
      paths.append(os.path.join(out_dir, f'corpus-{len(paths):05d}.txt'))
      f, in_file = open(paths[-1], 'w', encoding='utf-8'), 0
    size = int(np.clip(np.rint(rng.lognormal(np.log(14), 0.7)), 3, 60))
    document = [pending.pop() for _ in range(min(size, len(pending)))]
    text = '\n'.join(document) + '\n\n'
    f.write(text)
    in_file += len(text)
    total += len(text)
  f.close()
  with open(stamp, 'w') as s:
    s.write(settings)
  return paths


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--megabytes', type=float, default=100)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--file_mb', type=float, default=32)
  args = parser.parse_args(argv)
  paths = write(args.out, args.megabytes, args.seed, args.file_mb)
  print(f'{len(paths)} files, '
        f'{sum(os.path.getsize(p) for p in paths) / 2**20:.1f} MB in '
        f'{args.out}')


if __name__ == '__main__':
  main()
