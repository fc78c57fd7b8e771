"""The transfer diagnosis on a tiny pretrained run."""

import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'tests', 'bertjax'))
_spec = importlib.util.spec_from_file_location(
    'diagnose_transfer', os.path.join(REPO, 'experiments',
                                      'diagnose_transfer.py'))
diagnose_transfer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diagnose_transfer)


def _cells(markdown: str, section: str) -> dict:
  body = markdown.split(f'## {section}')[1].split('## ')[0]
  return {line.split(' | ')[0].lstrip('| '): [
      float(c) for c in line.rstrip(' |').split(' | ')[1:]]
          for line in body.strip().split('\n')[2:]}


@pytest.mark.e2e
def test_diagnosis_reads_layout_representations_scales_and_gradients(
    tmp_path):
  import test_hf_convert  # pylint: disable=g-import-not-at-top
  from bertjax import finetune  # pylint: disable=g-import-not-at-top
  run = test_hf_convert._train_tiny(tmp_path / 'run', tmp_path / 'data')  # pylint: disable=protected-access
  cfg = finetune.base_config()
  cfg.task.examples_per_class = 8
  cfg.max_seq_length = 32
  cfg.batch_size = 8
  markdown = diagnose_transfer.diagnose(run, cfg)
  inputs = _cells(markdown, 'Inputs')
  # [CLS] A [SEP], single segment downstream; NSP pairs in pretraining.
  assert inputs['rows starting with [CLS]'] == [1.0, 1.0]
  assert inputs['rows ending (last real token) with [SEP]'] == [1.0, 1.0]
  assert inputs['token type 1 share of real tokens'][0] == 0.0
  assert inputs['token type 1 share of real tokens'][1] > 0.1
  scales = _cells(markdown, 'Scales')
  # Fresh LayerNorms have gain 1; two Adam steps moved the pretrained ones.
  assert scales['LayerNorm gains: min'][1] == 1.0
  assert scales['LayerNorm gains: min'][0] < 1.0
  representations = _cells(markdown, 'Representations')
  assert all(-1.0 <= v <= 1.0 for k, pair in representations.items()
             if 'cosine' in k for v in pair)
  gradients = _cells(markdown, 'First fine-tuning step (one batch)')
  assert set(k.split(': ')[-1] for k in gradients if 'gradient' in k) == {
      'classifier', 'embeddings', 'layer_0', 'layer_1', 'pooler'}
  assert all(v > 0 for pair in gradients.values() for v in pair)
  assert 'the run\'s (trained by NSP/SOP)' in markdown
  # With pooling='first' (ELECTRA's) the classifier reads the [CLS] state:
  # there is no pooler to read or to saturate.
  cfg.pooling = 'first'
  markdown = diagnose_transfer.diagnose(run, cfg)
  representations = _cells(markdown, 'Representations')
  assert (representations['head input ([CLS] state, no pooler): mean '
                          'pairwise cosine'] ==
          representations['[CLS] state: mean pairwise cosine'])
  assert 'head input: share saturated (abs > 0.99)' not in representations
  gradients = _cells(markdown, 'First fine-tuning step (one batch)')
  assert 'gradient norm: pooler' not in gradients
  assert "not used (pooling='first')" in markdown
