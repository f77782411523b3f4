#!/usr/bin/env bash
# Hugging Face transformers releases verified end to end, side by side (docs/engines.md):
# the last release before PR #33534 (its assistant decoded greedily, #32867), the first after
# it, the first with the static ensemble (assistant_ensemble_weight), and the installed one.
# Each release goes in its own folder (pip --target, with the tokenizers and huggingface_hub
# it requires), verified as hf@FOLDER in one run on the same seeds.
# Usage: bash scripts/hf_releases.sh [SITES=vendor/hf-sites] [OUT=reports/hf-releases] [extra engine args...]
set -eu
SITES=${1:-vendor/hf-sites}
OUT=${2:-reports/hf-releases}
shift $(( $# < 2 ? $# : 2 ))
PY=${PYTHON:-.venv/bin/python}
install() {  # install VERSION PACKAGES...: into $SITES/transformers-VERSION, whole or not at all
  local dest="$SITES/transformers-$1"
  [ -d "$dest/transformers" ] && return 0
  rm -rf "$dest.partial"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest.partial" "transformers==$1" "${@:2}"
  mv "$dest.partial" "$dest"
}
mkdir -p "$SITES"
install 4.44.2 tokenizers==0.19.1 huggingface_hub==0.24.7
install 4.45.0 tokenizers==0.20.0 huggingface_hub==0.25.1
install 5.14.0 tokenizers==0.22.2 huggingface_hub==1.33.0 httpx==0.28.1 httpcore==1.0.9
exec "$PY" -m harness engine --engine hf --engine "hf@$SITES/transformers-4.44.2" --engine "hf@$SITES/transformers-4.45.0" \
  --engine "hf@$SITES/transformers-5.14.0" --profile smoke --out "$OUT" "$@"
