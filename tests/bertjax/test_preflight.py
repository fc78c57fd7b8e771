"""bertjax.preflight: the train step compiled for TPU slices on this CPU
host (libtpu's compiler, no TPU), its memory, FLOPs and collectives."""

import json
import os
import subprocess
import sys

import pytest

from bertjax import preflight
import preset_helpers

REPO = preset_helpers.REPO
# The demo preset, tiny; data parallel over every chip unless changed.
TINY = {**preset_helpers.TINY, 'batch_size': 32}


def _config(**fields):
  cfg = preset_helpers.load_preset('demo')
  return preset_helpers.set_fields(cfg, {**TINY, **fields})


def _axes(report) -> set[str]:
  return {axes for by_axes in report['collectives'].values()
          for axes in by_axes}


@pytest.mark.parametrize('accelerator, kind, devices', [
    ('v5e:2x2', 'TPU v5 lite', 4), ('v4-8', 'TPU v4', 4)])
def test_a_tiny_config_compiles_for_a_slice(accelerator, kind, devices):
  report = preflight.preflight(_config(), accelerator)
  assert (report['devices'], report['device_kind']) == (devices, kind)
  assert report['mesh'] == {'replica': 1, 'data': devices, 'fsdp': 1,
                            'tensor': 1}
  memory = report['memory_bytes']
  assert 0 < memory['arguments'] and memory['total'] < 2**30
  assert report['fits'] and report['margin_bytes'] == (
      report['hbm_bytes'] - memory['total'])
  flops = report['flops_per_device']
  # The analytic count is the dense matmuls alone, a part of what the
  # program does; a 32-wide model spends about as much again elsewhere
  # (softmax, LayerNorm, the optimizer: x2.17 here). At BERT's widths the
  # two agree to a few percent (README, "Pre-flight").
  assert 1.0 <= flops['compiled_over_analytic'] <= 2.5, flops
  # Pure data parallelism: the gradients are all-reduced over 'data', and
  # nothing else communicates.
  assert _axes(report) == {'data'}
  assert report['collectives']['all-reduce']['data']['count'] >= 1
  bound = report['bound_at_peak']
  assert bound['min_step_seconds'] == pytest.approx(
      flops['compiled'] / bound['peak_bf16_flops_per_chip'])
  assert 'all-reduce' in report['_hlo']['train_step']


def test_two_slices_put_the_replica_axis_across_them():
  # As the trainer on the pod: one replica per slice, else refused.
  with pytest.raises(preflight.PreflightError,
                     match='set --config.sharding.replicas=2'):
    preflight.preflight(_config(), 'v5e-4', num_slices=2)
  report = preflight.preflight(_config(**{'sharding.replicas': 2}), 'v5e-4',
                               num_slices=2)
  assert report['devices'] == 8
  assert report['mesh'] == {'replica': 2, 'data': 4, 'fsdp': 1, 'tensor': 1}
  # The gradients cross the data-center network between the slices
  # (libtpu's Megascale transfers); within a slice they stay on 'data'.
  assert report['collectives']['all-reduce']['replica']['count'] >= 1
  assert _axes(report) == {'data', 'replica'}, report['collectives']


def test_an_oversized_config_is_refused_with_what_to_change(tmp_path):
  """Through the command: 8192 wide, float32 and replicated, two layers
  need about 27 GiB a chip; the TPU compiler refuses, and the command
  writes the report, says what to change and exits with status 1."""
  out = tmp_path / 'out'
  result = subprocess.run(
      [sys.executable, '-m', 'bertjax.preflight',
       f'--config={os.path.join(preset_helpers.CONFIGS, "demo.py")}',
       '--topology=v5e-4', f'--out={out}',
       *[f'--config.{k}={v}' for k, v in TINY.items()],
       '--config.model.hidden_size=8192', '--config.model.num_heads=8',
       '--config.model.intermediate_size=32768'],
      cwd=REPO, capture_output=True, text=True,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert result.returncode == 1, result.stderr[-3000:]
  assert 'DOES NOT FIT' in result.stdout
  for change in ('lower the batch per chip (8 rows now',
                 '--config.model.remat=full',
                 '--config.sharding.mesh_shape="(1, -1, 1)" (fsdp 1 now)',
                 '--config.model.scan_layers=True',
                 '--config.model.dtype=bfloat16'):
    assert change in result.stderr
  report = json.loads((out / 'preflight.json').read_text())
  assert not report['fits']
  assert report['required_bytes'] > report['available_bytes'] > 15 * 2**30


@pytest.mark.parametrize('accelerator, name, per_host', [
    ('v4-8', 'v4:2x2x1', (2, 2, 1)), ('v4-32', 'v4:2x2x4', (2, 2, 1)),
    ('v5p-128', 'v5p:4x4x4', (2, 2, 1)), ('v5e-8', 'v5e:2x4', (2, 4, 1)),
    ('v5litepod-16', 'v5e:4x4', (2, 2, 1)), ('v6e-256', 'v6e:16x16',
                                             (2, 2, 1)),
    ('v5e:2x2', 'v5e:2x2', (2, 2, 1))])
def test_accelerator_types_name_cloud_tpus_topologies(accelerator, name,
                                                      per_host):
  _, topology, options = preflight.topology(accelerator)
  assert (topology, options['chips_per_host_bounds']) == (name, per_host)


@pytest.mark.parametrize('accelerator, message', [
    ('v9-8', 'GENERATION-SIZE'), ('v5e-12', 'power of two'),
    ('v5e:2x2x1', '2 sides')])
def test_bad_topologies_are_refused(accelerator, message):
  with pytest.raises(preflight.PreflightError, match=message):
    preflight.topology(accelerator)


@pytest.mark.parametrize('needed, usable, expected', [
    ('26.56G', '15.75G', (26.56 * 2**30, 15.75 * 2**30)),
    ('1.08T', '30.75G', (1.08 * 2**40, 30.75 * 2**30))])
def test_the_compilers_out_of_memory_is_a_refusal(needed, usable, expected):
  error = RuntimeError(
      'RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory '
      f'required for HLO temporaries ({needed}) exceeds available HBM '
      f'({usable}).')
  report = {}
  with pytest.raises(preflight.DoesNotFit, match='RESOURCE_EXHAUSTED'):
    preflight._refuse_if_out_of_memory(error, report, 1.0)  # pylint: disable=protected-access
  assert (report['required_bytes'], report['available_bytes']) == (
      pytest.approx(expected[0]), pytest.approx(expected[1]))
  assert not report['fits']


def test_without_libtpu_the_error_names_the_extra(monkeypatch):
  monkeypatch.setattr(preflight.importlib.util, 'find_spec',
                      lambda name: None)
  with pytest.raises(preflight.PreflightError, match=r"\[tpu-aot\]"):
    preflight.slice_devices('v5e-4')


@pytest.mark.parametrize('groups, expected', [
    ("replica_groups={{0,1},{2,3}}", [(0, 1), (2, 3)]),
    ('replica_groups=[2,4]<=[4,2]T(1,0)', [(0, 2, 4, 6), (1, 3, 5, 7)]),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}",
     [(0, 1), (2, 3), (4, 5), (6, 7)]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([2,2,2]"
     "T(1,0,2)) {'axis_0'}", [(0, 2), (1, 3), (4, 6), (5, 7)]),
    ('source_target_pairs={{0,1},{1,0}}', [(0, 1), (1, 0)])])
def test_every_spelling_of_replica_groups(groups, expected):
  assert preflight._groups(f'x = f32[8] all-reduce(y), {groups}, z') == (  # pylint: disable=protected-access
      expected)


def test_collectives_are_counted_with_their_result_bytes():
  mesh = preflight.jax.sharding.Mesh(
      preflight.np.array(preflight.jax.devices()[:1] * 1).reshape(1, 1, 1, 1),
      ('replica', 'data', 'fsdp', 'tensor'))
  hlo = '\n'.join([
      '%a = bf16[128,768]{1,0} all-gather(%p), replica_groups={{0}}',
      '%b = (f32[16], f32[16]) all-reduce-start(%q), replica_groups={{0}}',
      '%c = f32[16] all-reduce-done(%b)',
      '%d = f32[4,4] all-reduce(%r), replica_groups={{0}}'])
  assert preflight.collectives(hlo, mesh) == {
      'all-gather': {'none': {'count': 1, 'bytes': 128 * 768 * 2}},
      'all-reduce': {'none': {'count': 2, 'bytes': 16 * 4 + 16 * 4}}}
