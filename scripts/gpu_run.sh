#!/usr/bin/env bash
# Verify on an air-gapped GPU machine (no package access): the vLLM trees and wheels travel
# in vendor/ (scripts/build_vllm_tree.py; vendor/suite-wheels: what the suite needs and the
# image lacks, plotly, from `pip download --no-deps --only-binary=:all: --python-version 3.12
# -d vendor/suite-wheels plotly==7.1.0`).
# vendor/vllm-trees.tar.xz (scripts/vllm_releases.py prepare --pack) holds the python-only trees
# of every release the `releases` step verifies; it is unpacked into vendor/ first.
# Usage: OUT=/some/dir [STEPS="releases coldstart verdict runs runbench pytest kernels"] [COLD_PYTEST="suites/ -m gpu -n 4"] [VERDICT_ARGS="--backend triton"]
#        [PYTEST_ARGS="suites/test_triton_gpu.py -m gpu"] [KERNEL_ARGS="--backends triton,vllm-mrv2"] bash scripts/gpu_run.sh
#   -> $OUT/gpu_results.tgz (logs, JSON, reports)
set -u
OUT=${OUT:-reports/gpu}
STEPS=${STEPS:-releases verdict runs runbench pytest kernels}
WORK=/tmp/gpu-results
mkdir -p "$OUT" "$WORK" /tmp/vdeps
for w in vendor/wheelhouse/*.whl vendor/suite-wheels/*.whl; do
  [ -e "$w" ] && python -m zipfile -e "$w" /tmp/vdeps
done
[ -f vendor/vllm-trees.tar.xz ] && tar -xJf vendor/vllm-trees.tar.xz -C vendor
export PYTHONPATH=/tmp/vdeps SPECDEC_VLLM_SRC=$PWD/vendor/vllm-0.33.0 SPECDEC_VLLM_019_SRC=$PWD/vendor/vllm-0.19.1
# The lent image sets PYTHONDONTWRITEBYTECODE and ships no .pyc: every process (each worker,
# each test's subprocess) would compile torch's and vLLM's sources again, ~10 s per vLLM import.
# An installed environment has its bytecode; a writable cache gives the same after first use.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
# A Triton cache built on an earlier machine of the same GPU architecture (benchmarks/bench_cold_start.py
# --cache-out, carried as vendor/triton-cache.tar.gz): the kernels it holds load instead of compiling.
if [ -f vendor/triton-cache.tar.gz ]; then
  mkdir -p /tmp/triton-carried && tar -xzf vendor/triton-cache.tar.gz -C /tmp/triton-carried
  export TRITON_CACHE_DIR=/tmp/triton-carried/triton-cache
fi
step() {  # step NAME TIMEOUT CMD...: run with a time limit, log, note the exit code and seconds
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  echo "[$name] exit $? after $(( $(date +%s) - start )) s (limit $limit s)" | tee -a "$WORK/steps.txt"
}
has() { [[ " $STEPS " == *" $1 "* ]]; }
{ nvidia-smi; python -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$WORK/machine.txt" 2>&1
# Every release's V1 and MRV2 in one run, one history run per release (scripts/vllm_releases.py).
has releases && step releases "${RELEASES_TIMEOUT:-540}" python scripts/vllm_releases.py run --trees vendor --profile gpu \
  --device cuda --history "$WORK/releases.sqlite" --out "$WORK/releases" --json "$WORK/vllm-releases.json" ${RELEASES_ARGS:-}
has coldstart && step bench_cold_start "${COLD_TIMEOUT:-540}" python benchmarks/bench_cold_start.py --json "$WORK/bench_cold_start.json" \
  --cache-out "$WORK/triton-cache.tar.gz" ${COLD_PYTEST:+--pytest "$COLD_PYTEST" --pytest-cache-out "$WORK/triton-cache-pytest.tar.gz"} ${COLD_ARGS:-}
has verdict && step bench_verdict "${VERDICT_TIMEOUT:-240}" python benchmarks/bench_verdict.py --json "$WORK/bench_verdict.json" ${VERDICT_ARGS:-}
if has runs; then
  for b in triton vllm-mrv2 vllm-v1; do
    step "run_gpu_$b" "${RUN_TIMEOUT:-120}" python -m harness run --backend "$b" --profile gpu --device cuda \
      --out "$WORK/run-gpu-$b" --no-progress
  done
fi
has runbench && step bench_run "${RUNBENCH_TIMEOUT:-300}" python benchmarks/bench_run.py --device cuda --profile gpu --warmup \
  --json "$WORK/bench_run.json" ${RUNBENCH_ARGS:---backend triton --backend vllm-mrv2}
has pytest && step pytest_gpu "${PYTEST_TIMEOUT:-300}" python -m pytest ${PYTEST_ARGS:-suites/ -m gpu -n 4 --dist worksteal} -q -p no:cacheprovider -rA --durations=25
[ -d reports/fuzz-failures ] && cp -r reports/fuzz-failures "$WORK/"  # a failing fuzz example, to replay here
has kernels && step bench_kernels "${BENCH_TIMEOUT:-360}" python benchmarks/bench_kernels.py --json "$WORK/bench_kernels.json" ${KERNEL_ARGS:-}
tar -czf "$OUT/gpu_results.tgz" -C "$WORK" .
cat "$WORK/steps.txt"
