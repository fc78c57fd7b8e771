#!/usr/bin/env bash
# The GPU figures of experiments/benchmarks/results/: the training step
# against the Hugging Face peer at BERT-base/128 and BERT-large/512, each
# with a profile, then variants (no dropout: cuDNN attention; rbg dropout
# bits) and the input-pipeline check. Usage: gpu_suite.sh OUTDIR [PART...]
# with PART in main, variants, pipeline (default: all three).
set -u
out=${1:?usage: gpu_suite.sh OUTDIR [main|variants|pipeline]...}
shift
parts=${*:-main variants pipeline}
mkdir -p "$out"
step() { python3 experiments/benchmarks/step.py "$@"; }
for part in $parts; do
  case $part in
    main)
      timeout 240 step --size=base --seq=128 --batch=256 --steps=10 \
        --rounds=5 --profile=/tmp/profile_base --out="$out/base128"
      timeout 300 step --size=large --seq=512 --batch=32 --steps=5 \
        --rounds=5 --profile=/tmp/profile_large --out="$out/large512" ;;
    variants)
      timeout 100 step --size=base --seq=128 --batch=256 --peer_compile=none \
        --step_rng=rbg --out="$out/base128_rbg"
      timeout 100 step --size=base --seq=128 --batch=256 --peer_compile=none \
        --no-dropout --profile=/tmp/profile_base_nodrop \
        --out="$out/base128_nodropout"
      timeout 100 step --size=base --seq=128 --batch=256 --peer_compile=none \
        --no-dropout --attention=xla --out="$out/base128_nodropout_xla" ;;
    pipeline)
      timeout 240 step --size=base --seq=128 --batch=256 --steps=10 \
        --rounds=5 --input=pipeline --out="$out/base128_pipeline" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
