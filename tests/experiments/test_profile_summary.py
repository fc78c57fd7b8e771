"""experiments/benchmarks/profile_summary.py on hand-written traces."""

import jax
import pytest

from experiments.benchmarks import profile_summary

# Two streams on one GPU (times in ps from each line's timestamp, in ns),
# a derived line that repeats a kernel, and a host plane.
TRACE = '''
planes {
  id: 1 name: "/device:GPU:0"
  lines { id: 1 name: "Stream #13(Compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 }
    events { metadata_id: 2 offset_ps: 6000000 duration_ps: 1000000 }
    events { metadata_id: 1 offset_ps: 8000000 duration_ps: 3000000 } }
  lines { id: 2 name: "Stream #14(MemcpyH2D)" timestamp_ns: 1000
    events { metadata_id: 3 offset_ps: 4000000 duration_ps: 2500000 } }
  lines { id: 3 name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 } }
  event_metadata { key: 1 value { id: 1 name: "sm90_xmma_gemm_bf16bf16" } }
  event_metadata { key: 2 value { id: 2 name: "loop_add_fusion" } }
  event_metadata { key: 3 value { id: 3 name: "MemcpyH2D" } }
}
planes { id: 2 name: "/host:CPU"
  lines { id: 1 name: "python" timestamp_ns: 0
    events { metadata_id: 1 offset_ps: 0 duration_ps: 99000000 } }
  event_metadata { key: 1 value { id: 1 name: "step" } }
}
'''


def test_sums_stream_kernels_by_name():
  summary = profile_summary.summarize(
      jax.profiler.ProfileData.from_text_proto(TRACE))
  assert [(k['name'], k['ns'], k['count']) for k in summary['kernels']] == [
      ('sm90_xmma_gemm_bf16bf16', 8000, 2), ('MemcpyH2D', 2500, 1),
      ('loop_add_fusion', 1000, 1)]
  assert summary['categories'] == {
      'matmul (cuBLAS/CUTLASS)': 8000, 'copy/memset': 2500,
      profile_summary.OTHER: 1000}
  assert summary['total_kernel_ns'] == 11500
  # Busy: [0, 7) us (the copy overlaps both neighbours) and [8, 11) us.
  assert summary['busy_ns'] == 7000 + 3000
  assert summary['span_ns'] == 11000


def test_top_limits_kernels_but_not_totals():
  summary = profile_summary.summarize(
      jax.profiler.ProfileData.from_text_proto(TRACE), top=1)
  assert len(summary['kernels']) == 1
  assert summary['total_kernel_ns'] == 11500


def test_table_reports_per_step_figures():
  summary = profile_summary.summarize(
      jax.profiler.ProfileData.from_text_proto(TRACE))
  text = profile_summary.table(summary, steps=2)
  assert 'Device busy 0.01 ms of 0.01 ms traced per step (90.9%).' in text
  assert '| `sm90_xmma_gemm_bf16bf16` | 0.00 | 1 | 69.6% |' in text


def test_cpu_trace_has_no_kernels():
  summary = profile_summary.summarize(jax.profiler.ProfileData.from_text_proto(
      TRACE.split('planes { id: 2')[0].replace('/device:GPU:0', '/host:CPU')
  ))
  assert summary['kernels'] == [] and summary['busy_ns'] == 0
  assert 'no device kernels' in profile_summary.table(summary, steps=1)


@pytest.mark.parametrize('name, expected', [
    ('cudnn_generated_fort_native_sdpa_sm90_flash_fprop', 'attention (cuDNN)'),
    ('nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNT', 'matmul (cuBLAS/CUTLASS)'),
    ('cutlass_80_tensorop_bf16_s16816gemm', 'matmul (cuBLAS/CUTLASS)'),
    ('Memset', 'copy/memset'),
    ('loop_threefry2x32_fusion', 'random bits'),
    ('input_reduce_fusion_3', profile_summary.OTHER)])
def test_category_by_name(name, expected):
  assert profile_summary.category(name) == expected
