"""The command's progress bar: MB of text read, documents, tokens/s."""

from __future__ import annotations

import sys
import time

import tqdm

from bertjax import storage

# Typical size of text over its compressed size, for the progress bar's
# estimate of a compressed corpus's text.
_COMPRESSION_RATIOS = {'.gz': 3.0, '.bz2': 3.8, '.zst': 3.2, '.zstd': 3.2}


def estimated_text_size(files) -> int:
  """About the bytes of text of ``files``, local or in a bucket (compressed
  ones estimated)."""
  total = 0
  for file in files:
    ratio = next((r for ext, r in _COMPRESSION_RATIOS.items()
                  if file.endswith(ext)), 1.0)
    total += int(storage.getsize(file) * ratio)
  return total


class Progress:
  """A tqdm bar over the corpus's text (MB; an ETA where its size is
  known), with documents and tokens/s; and the summary's figures."""

  def __init__(self, total_bytes: int | None):
    self._bar = tqdm.tqdm(
        total=total_bytes / 2**20 if total_bytes else None, unit='MB',
        file=sys.stderr, dynamic_ncols=True,
        bar_format=('{l_bar}{bar}| {n:,.0f}/{total:,.0f} {unit} '
                    '[{elapsed}<{remaining}{postfix}]' if total_bytes else
                    '{n:,.0f} {unit} [{elapsed}{postfix}]'))
    self.start = time.perf_counter()
    self.tokens = self.documents = 0
    self.written = self.reused = 0

  def __call__(self, summary: dict, reused: bool) -> None:
    if reused:
      self.reused += 1
    else:
      self.written += 1
      self.tokens += summary['train']['tokens'] + summary['eval']['tokens']
    self.documents += summary['num_raw_documents']
    seconds = time.perf_counter() - self.start
    self._bar.set_postfix_str(
        f'{self.documents:,} docs, '
        f'{self.tokens / max(seconds, 1e-9) / 1e3:,.0f}k tokens/s',
        refresh=False)
    self._bar.update(summary['text_size'] / 2**20)

  def close(self) -> None:
    self._bar.close()
