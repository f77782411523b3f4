#!/usr/bin/env bash
# The installed user story, outside the checkout: build the wheel, install it in a fresh
# environment, then from a user's folder holding only an adapter (examples/hf_speculative_sampling)
# run the console script and the pytest plugin on it. Exit 0 only if both pass.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip() { "$work/venv/bin/pip" --disable-pip-version-check --quiet "$@"; }

# Build from a copy of the tracked files: building in place leaves an egg-info in the
# checkout, which would register the plugin in the checkout's own test runs.
mkdir "$work/src"
git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && xargs -0 cp --parents -t "$work/src" 2>/dev/null || true)
python3 -m venv "$work/venv"
pip wheel --no-deps "$work/src" -w "$work/dist"
# The local CPU torch first: the wheel's unpinned torch is then satisfied, not a CUDA download.
pip install torch==2.13.0
pip install -c "$root/requirements.txt" -c "$root/requirements-vllm.txt" "$work"/dist/specdec_verify-*.whl \
  pytest transformers
cp -r "$root/examples/hf_speculative_sampling" "$work/my-kernels"
cd "$work/my-kernels"
export PYTHONPATH=  # nothing from the checkout
"$work/venv/bin/specdec-verify" run --backend hf_sampler:Sampler --profile smoke --out "$work/out" --no-progress
"$work/venv/bin/pytest" --specdec-backend hf_sampler:Sampler --specdec-profile smoke -q -p no:cacheprovider
echo "installed user story: passed"
