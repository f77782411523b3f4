#!/usr/bin/env bash
# Verify on an air-gapped GPU machine (no package access): the vLLM trees and wheels travel
# in vendor/ (scripts/build_vllm_tree.py; vendor/suite-wheels from `pip download`).
# Usage: OUT=/some/dir bash scripts/gpu_run.sh   (logs, JSON and the report land in $OUT)
set -u
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT" /tmp/vdeps
for w in vendor/wheelhouse/*.whl vendor/suite-wheels/*.whl; do
  [ -e "$w" ] && python -m zipfile -e "$w" /tmp/vdeps
done
export PYTHONPATH=/tmp/vdeps SPECDEC_VLLM_SRC=$PWD/vendor/vllm-0.33.0 SPECDEC_VLLM_019_SRC=$PWD/vendor/vllm-0.19.1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python -c "import torch, triton, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/nvidia-smi.txt" 2>&1
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-150}" python benchmarks/bench_kernels.py --json "$OUT/bench_kernels.json" > "$OUT/bench_kernels.log" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s" >> "$OUT/bench_kernels.log"
start=$(date +%s)
timeout "${PYTEST_TIMEOUT:-240}" python -m pytest suites/ -m gpu -q -p no:cacheprovider -rA > "$OUT/pytest_gpu.log" 2>&1
echo "pytest exit $? after $(( $(date +%s) - start )) s" >> "$OUT/pytest_gpu.log"
start=$(date +%s)
timeout "${RUN_TIMEOUT:-150}" python -m harness run --backend triton --backend vllm-mrv2 --backend vllm-v1 --profile gpu --device cuda \
  --exclude standard-large-vocab --out /tmp/run-gpu --no-progress > "$OUT/run_gpu.log" 2>&1
echo "run exit $? after $(( $(date +%s) - start )) s" >> "$OUT/run_gpu.log"
cp /tmp/run-gpu/results.json "$OUT/run_gpu_results.json" 2>/dev/null
cp /tmp/run-gpu/index.html "$OUT/run_gpu_report.html" 2>/dev/null
exit 0
