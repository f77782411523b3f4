"""Build a python-only vLLM tree and an offline wheelhouse for machines without package access.

    python scripts/build_vllm_tree.py                      # vllm==0.33.0 from PyPI -> vendor/vllm-0.33.0
    python scripts/build_vllm_tree.py --wheel vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl
    python scripts/build_vllm_tree.py --git ~/src/vllm --tree-version 0.34.0.dev0
    python scripts/build_vllm_tree.py --no-wheelhouse --no-prune --out /tmp/vllm-full

The tree holds only ``vllm/**.py`` plus ``vllm-X.dist-info/METADATA`` (Name, Version): without
the metadata vLLM's version probe raises inside its Triton check and vLLM silently disables
Triton. Use it with ``--vllm-src vendor/vllm-X`` or ``SPECDEC_VLLM_SRC``; compiled modules are
replaced by empty stand-ins (``harness.backends.vllm.env``).

Pruning (default): the tree keeps the modules that importing both vLLM backends loads (plus
``vllm.platforms.cuda`` and every sibling file of those modules, for imports made later at run
time), found by importing the staged tree in a subprocess, so this machine needs the import
closure installed (``pip install --no-deps -r requirements-vllm.txt``). The wheelhouse holds
cp312 manylinux wheels of that closure (``requirements-vllm.txt`` less vLLM itself and what a
GPU image with torch already has, ``--have``) for ``pip install --no-index --no-deps --find-links``.
With none left out (``--have /dev/null``) the wheelhouse of 0.33.0's closure is 50 MiB
(transformers, pillow, uvloop, tokenizers: the image has them), over the limit below.
Tree and wheelhouse must stay under 60 MiB together (the device runner carries 64 MiB).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MIB = 60
SIBLING_FOLDER_LIMIT = 512 * 1024  # bytes of .py in a folder whose unloaded files are kept
# Closure members a GPU image with torch already has, and pins that are not part of the closure.
SKIP_IN_WHEELHOUSE = {"vllm"}
NEEDS_GLIBC_2_31 = {"llguidance"}
PROBE = """
import json, sys
from harness.backends.vllm import env as vllm_env
vllm_env.prepare()
vllm_env._stub_compiled_modules()  # as on a CUDA machine, where they are stand-ins
from harness.backends.vllm.mrv2 import VllmMrv2Backend
from harness.backends.vllm.v1 import VllmV1Backend
from harness.scenarios.catalog import catalog, find
from harness.scenarios.profiles import get_profile
from harness.scenarios.materialize import materialize, trials
scenarios = catalog(get_profile("smoke"))
def bound(cls):  # a backend this release's API does not bind (api-drift) loads what it got to
    try:
        return [cls()]
    except RuntimeError as e:
        if "vLLM API changed" not in str(e):
            raise
        print(e, file=sys.stderr)
        return []
for backend in bound(VllmMrv2Backend) + bound(VllmV1Backend):  # run-time imports too
    for name in ("standard-near-target", "block-fixed", "synthetic-mean-rate", "strict-fixed", "standard-logit-bias", "standard-top-k-top-p"):
        s = find(scenarios, name)
        batch = trials(s, materialize(s), 0, 1).batch
        if backend.supports(batch) is None:
            backend.sample(batch)
import vllm.platforms.cuda  # the platform a GPU machine resolves
print(json.dumps(sorted({getattr(mod, "__file__", None) or "" for name, mod in sys.modules.items() if name.split(".")[0] == "vllm"})))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--version", default="0.33.0", help="vLLM release to download from PyPI (default 0.33.0)")
    src.add_argument("--wheel", type=Path, help="a vLLM wheel file")
    src.add_argument("--git", type=Path, help="a vLLM git checkout (needs --tree-version or a tag)")
    p.add_argument("--tree-version", help="version to record for --git (default: git describe)")
    p.add_argument("--out", type=Path, help="tree folder (default vendor/vllm-VERSION)")
    p.add_argument("--no-prune", action="store_true", help="keep every .py file")
    p.add_argument("--wheelhouse", type=Path, default=ROOT / "vendor" / "wheelhouse")
    p.add_argument("--no-wheelhouse", action="store_true")
    p.add_argument("--python-version", default="3.12", help="wheelhouse target Python (default 3.12)")
    p.add_argument("--requirements", type=Path, default=ROOT / "requirements-vllm.txt")
    p.add_argument(
        "--have",
        type=Path,
        default=ROOT / "scripts" / "device_image_packages.txt",
        help="'name' or 'name==version' lines of the target image (python -m pip freeze there): their wheels are left out"
        " (default: the lent GPU machines' image, scripts/device_image_packages.txt)",
    )
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        if args.git:
            version = args.tree_version or _git_version(args.git)
            files = {str(f.relative_to(args.git)): f.read_bytes() for f in (args.git / "vllm").rglob("*.py")}
        else:
            wheel = args.wheel or _download_wheel(args.version, Path(tmp))
            files, version = _wheel_sources(wheel)
        out = args.out or ROOT / "vendor" / f"vllm-{version}"
        _write_tree(out, files, version)
    if not args.no_prune:
        _prune(out)
    sizes = {f"tree {out}": _size(out)}
    if not args.no_wheelhouse:
        _wheelhouse(args.wheelhouse, args.requirements, args.python_version, _names(args.have.read_text()) if args.have else set())
        sizes[f"wheelhouse {args.wheelhouse}"] = _size(args.wheelhouse)
    total = sum(sizes.values())
    for name, size in sizes.items():
        print(f"{size / 2**20:7.1f} MiB  {name}")
    print(f"{total / 2**20:7.1f} MiB  total (limit {LIMIT_MIB} MiB)")
    if total > LIMIT_MIB * 2**20:
        print("error: over the limit; prune the tree or drop wheels the device image already has", file=sys.stderr)
        return 1
    return 0


def _download_wheel(version: str, folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"vllm=={version}", "-d", str(folder)], check=True)
    return next(folder.glob("vllm-*.whl"))


def _wheel_sources(wheel: Path) -> tuple[dict, str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", n))
        version = re.search(r"^Version: (.+)$", z.read(meta).decode(), re.M).group(1).strip()
        files = {n: z.read(n) for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")}
    return files, version


def _git_version(checkout: Path) -> str:
    try:
        tag = subprocess.run(["git", "-C", str(checkout), "describe", "--tags"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("error: --git needs --tree-version (git describe found no tag)") from None
    return tag.strip().lstrip("v")


def _write_tree(out: Path, files: dict, version: str) -> None:
    if out.exists():
        shutil.rmtree(out)
    for name, data in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    meta = out / f"vllm-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (meta / "top_level.txt").write_text("vllm\n")
    print(f"wrote {len(files)} files of vLLM {version} to {out}")


def _prune(out: Path) -> None:
    env = {**os.environ, "SPECDEC_VLLM_SRC": str(out), "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"error: importing the staged tree failed (is the closure installed?):\n{res.stderr[-3000:]}")
    loaded = [Path(f).resolve() for f in json.loads(res.stdout.strip().splitlines()[-1]) if f]
    root = (out / "vllm").resolve()
    if not loaded or not all(f.is_relative_to(root) for f in loaded):
        raise SystemExit(f"error: the probe imported vLLM from outside {root}")
    # Siblings of loaded modules stay (imports made later, on other devices), except in big
    # folders such as model_executor/models where only the loaded files are kept.
    keep_dirs = {d for d in {f.parent for f in loaded} if _size(d, "*.py", recursive=False) <= SIBLING_FOLDER_LIMIT}
    keep = set(loaded)
    removed = 0
    for f in list(root.rglob("*.py")):
        if f.parent not in keep_dirs and f.resolve() not in keep:
            f.unlink()
            removed += 1
    for d in sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    print(f"pruned {removed} files: kept the {len(loaded)} modules the backends load and their siblings in {len(keep_dirs)} folders")


def _names(text: str) -> set[str]:
    """Normalized distribution names of requirement / freeze lines."""
    lines = (line.split("#")[0].strip() for line in text.splitlines())
    return {re.sub(r"[-_.]+", "-", re.split(r"[=<>!~ @]", line)[0]).lower() for line in lines if line}


def _wheelhouse(folder: Path, requirements: Path, python_version: str, have: set[str]) -> None:
    pins = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    pins = [p for p in pins if p and not _names(p) & (SKIP_IN_WHEELHOUSE | have)]
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tag = python_version.replace(".", "")
    older = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    groups = {
        tuple(older): [p for p in pins if re.split(r"[=<>!~ ]", p)[0] not in NEEDS_GLIBC_2_31],
        ("manylinux_2_31_x86_64", *older): [p for p in pins if re.split(r"[=<>!~ ]", p)[0] in NEEDS_GLIBC_2_31],
    }
    for platforms, group in groups.items():
        if group:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                   "--implementation", "cp", "--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none",
                   *(x for p in platforms for x in ("--platform", p)), "-d", str(folder), *group]  # fmt: skip
            subprocess.run(cmd, check=True)


def _size(path: Path, pattern: str = "*", recursive: bool = True) -> int:
    return sum(f.stat().st_size for f in (path.rglob(pattern) if recursive else path.glob(pattern)) if f.is_file())


if __name__ == "__main__":
    sys.exit(main())
