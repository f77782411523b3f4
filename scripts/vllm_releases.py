"""Verify many vLLM releases in one run, and keep the result as a history and a table.

    # where the package index is reachable: the python-only trees, and one file to carry
    python scripts/vllm_releases.py prepare [--releases 0.19.1,...] [--wheels DIR] --pack vendor/vllm-trees.tar.xz
    # anywhere (an air-gapped GPU machine too): unpack the trees, verify, append, tabulate
    python scripts/vllm_releases.py run --trees vendor/vllm-trees.tar.xz --unpack-to vendor --profile gpu --device cuda \\
        --history reports/releases.sqlite --out reports/releases --json docs/data/vllm-releases.json
    # the table again from finished runs' results.json (no sampling); --history appends them too
    python scripts/vllm_releases.py table reports/releases/run [more runs] --json docs/data/vllm-releases.json

``run`` verifies V1 and MRV2 of every release in ONE ``python -m harness run`` (``NAME@PATH``
workers, one plan shared by all backends; ``--group N``: N releases per run, one run after
another, where one GPU cannot hold every worker's memory), then appends to the history one run per release
(``vllm_version`` the release, its records only; the label the tree's folder name after
``vllm-``: the release, or "main" for ``vendor/vllm-main``), so the drift page puts releases in
order. The JSON has one object per release and implementation: ``{"version",
"implementation": "v1"|"mrv2", "status": "bound"|"api-drift", "passed", "failed": [{"scenario",
"check", "verdict", "reproducer"}], "skipped"}``. Exit status as ``harness run``'s (0 all
passed, 1 a check failed, 2 usage error, 3 nothing verified).
"""

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.backends.loading import split_source  # noqa: E402
from harness.evidence.history import HistoryError, append_run, read_run_document  # noqa: E402

RELEASES = (
    "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0",
    "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0",
)  # fmt: skip
IMPLEMENTATIONS = {"v1": "vllm-v1", "mrv2": "vllm-mrv2"}


def _usage(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def tree_version(tree: Path) -> str:
    """The release a python-only tree declares (``vllm-X.dist-info/METADATA``)."""
    for meta in sorted(tree.glob("vllm-*.dist-info/METADATA")):
        found = re.search(r"^Version: *(\S+)", meta.read_text(errors="replace"), re.M)
        if found:
            return found.group(1)
    _usage(f"{tree} holds no vllm-X.dist-info/METADATA (build it with scripts/build_vllm_tree.py)")


def _releases(text: str | None) -> list[str]:
    releases = [r.strip() for r in text.split(",") if r.strip()] if text else list(RELEASES)
    bad = [r for r in releases if not re.fullmatch(r"\d+\.\d+\.\d+(\S*)", r)]
    if bad:
        _usage(f"--releases: not a vLLM version: {', '.join(bad)}")
    return releases


# --- prepare: wheels -> trees -> one archive -------------------------------------------------------
def prepare(args) -> int:
    trees = []
    for version in _releases(args.releases):
        tree = args.vendor / f"vllm-{version}"
        if not (tree / "vllm" / "__init__.py").is_file() or tree_version(tree) != version:
            cmd = [sys.executable, str(ROOT / "scripts" / "build_vllm_tree.py"), "--no-wheelhouse", "--out", str(tree)]
            wheel = next(iter(sorted(args.wheels.glob(f"vllm-{version}-*.whl"))), None) if args.wheels else None
            cmd += ["--wheel", str(wheel)] if wheel else ["--version", version]
            if subprocess.run(cmd, cwd=ROOT).returncode != 0:
                print(f"error: building the vLLM {version} tree failed", file=sys.stderr)
                return 1
        trees.append(tree)
    if args.pack:
        _pack(trees, args.pack)
    return 0


def _pack(trees: list[Path], archive: Path) -> None:
    """One xz archive: the trees share most files, which a solid archive stores about once."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    part = archive.with_name(archive.name + ".part")
    with tarfile.open(part, "w:xz", preset=9) as tar:
        for tree in trees:
            tar.add(tree, arcname=tree.name, filter=lambda info: None if "__pycache__" in info.name else info)
    part.replace(archive)
    print(f"{archive}: {len(trees)} trees, {archive.stat().st_size / 2**20:.1f} MiB")


def _unpack(archive: Path, into: Path) -> list[Path]:
    with tarfile.open(archive) as tar:
        names = sorted({m.name.split("/")[0] for m in tar.getmembers()})
        tar.extractall(into, filter="data")
    return [into / n for n in names]


# --- run: every release in one harness run ---------------------------------------------------------
def run(args) -> int:
    if not args.trees.exists():
        _usage(f"--trees {args.trees}: no such folder or archive")
    if args.trees.is_file():
        into = args.unpack_to or Path(tempfile.mkdtemp(prefix="vllm-trees-"))
        found = _unpack(args.trees, into)
    else:
        found = sorted(p for p in args.trees.glob("vllm-*") if (p / "vllm" / "__init__.py").is_file())
    by_version = {tree_version(t): t for t in found}
    wanted = _releases(args.releases) if args.releases else sorted(by_version, key=_version_key)
    missing = [v for v in wanted if v not in by_version]
    if missing:
        _usage(f"no tree for vLLM {', '.join(missing)} in {args.trees}")
    impls = [i.strip() for i in args.implementations.split(",")]
    unknown = [i for i in impls if i not in IMPLEMENTATIONS]
    if unknown:
        _usage(f"--implementations: unknown {', '.join(unknown)} (known: {', '.join(IMPLEMENTATIONS)})")
    if args.group < 0:
        _usage(f"--group: expected a number of releases per run >= 0 (0: all in one), got {args.group}")
    size = args.group or len(wanted)
    groups = [wanted[i : i + size] for i in range(0, len(wanted), size)]
    runs = [args.out / ("run" if len(groups) == 1 else f"run-{k + 1}") for k in range(len(groups))]
    for out in [args.out / "run", *(args.out.glob("run-*") if args.out.is_dir() else ())]:
        shutil.rmtree(out, ignore_errors=True)
    codes, docs = [], []
    for versions, out in zip(groups, runs):
        backends = [f"{IMPLEMENTATIONS[i]}@{_relative(by_version[v])}" for v in versions for i in impls]
        cmd = [sys.executable, "-m", "harness", "run", "--profile", args.profile, "--device", args.device, "--out", str(out)]
        cmd += ["--seed", str(args.seed), "--no-progress", "--timeout", str(args.timeout)]
        for b in backends:
            cmd += ["--backend", b]
        for sc in args.scenario or ():
            cmd += ["--scenario", sc]
        for sc in args.exclude or ():
            cmd += ["--exclude", sc]
        codes.append(subprocess.run(cmd, cwd=ROOT).returncode)
        if not (out / "results.json").is_file():
            return codes[-1] or 2
        docs.append(read_run_document(str(out)))
        if args.history:
            for label, sub in split_by_release(docs[-1]).values():
                append_run(str(args.history), sub, label=label)
    _write_table({**docs[0], "records": [r for d in docs for r in d["records"]]}, args)
    return 1 if 1 in codes else max(codes)


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path.resolve())


def _version_key(version: str):
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version), "")
    except InvalidVersion:
        return (1, None, version)


@functools.cache
def _release(backend: str) -> tuple[str, str, str] | None:
    """``vllm-mrv2@vendor/vllm-0.27.1`` -> ("0.27.1", "mrv2", "0.27.1"): the release its tree
    declares, the implementation, and the label (the folder's name after ``vllm-``: "main"
    for ``vendor/vllm-main``)."""
    base, src = split_source(backend)
    impl = next((k for k, v in IMPLEMENTATIONS.items() if v == base), None)
    if impl is None or src is None:
        return None
    tree = Path(src) if Path(src).is_absolute() else ROOT / src
    label = tree.name.removeprefix("vllm-")
    return (tree_version(tree) if tree.is_dir() else label), impl, label


def split_by_release(doc: dict) -> dict[str, tuple[str, dict]]:
    """One run document per release: its backends' records, ``environment["vllm"]`` the release;
    keyed by version, with the label to give it in a history."""
    per: dict[str, tuple[str, dict]] = {}
    for backend in sorted({r["backend"] for r in doc["records"]}):
        found = _release(backend)
        if found is None:
            continue
        version, _, label = found
        env = {**doc.get("environment", {}), "vllm": version, "vllm_source": split_source(backend)[1]}
        _, sub = per.setdefault(version, (label, {**doc, "records": [], "environment": env}))
        sub["records"] += [r for r in doc["records"] if r["backend"] == backend]
    return per


def releases_table(doc: dict) -> list[dict]:
    """The JSON's rows, releases in order, V1 before MRV2."""
    rows = {}
    for r in doc["records"]:
        found = _release(r["backend"])
        if found is None:
            continue
        row = rows.setdefault(
            found, {"version": found[0], "implementation": found[1], "status": "bound", "passed": 0, "failed": [], "skipped": 0}
        )
        if r["kind"] == "api-drift":
            row["status"] = "api-drift"
            row.setdefault("api_drift", r["message"])
        elif r["verdict"] == "pass":
            row["passed"] += 1
        elif r["verdict"] == "skipped":
            row["skipped"] += 1
        elif r["verdict"] in ("fail", "error"):
            row["failed"].append(
                {
                    "scenario": f"{r['scenario']}[{r['template']}]",
                    "check": r["check"],
                    "verdict": r["verdict"],
                    "reproducer": r["reproducer"],
                }
            )
    return [rows[k] for k in sorted(rows, key=lambda k: (_version_key(k[0]), list(IMPLEMENTATIONS).index(k[1])))]


def markdown(table: list[dict]) -> str:
    lines = ["| release | implementation | adapter | passed | failed | skipped | failing checks |", "|---|---|---|---|---|---|---|"]
    for row in table:
        failing = sorted({f"`{f['scenario'].rsplit('[', 1)[0]}` {f['check']}" for f in row["failed"]})
        shown = ", ".join(failing[:6]) + (f" and {len(failing) - 6} more" if len(failing) > 6 else "")
        status = "bound" if row["status"] == "bound" else "**api-drift**"
        lines.append(
            f"| {row['version']} | {row['implementation']} | {status} | {row['passed']} | {len(row['failed'])} | {row['skipped']} | {shown} |"
        )
    return "\n".join(lines) + "\n"


def _write_table(doc: dict, args) -> None:
    table = releases_table(doc)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm-releases.md").write_text(markdown(table))
    print(markdown(table))


def table(args) -> int:
    """One table from one or more finished runs (a sweep run in parts, e.g. one GPU call per half
    of the releases); ``--history``: append them too, one history run per release."""
    try:
        docs = [read_run_document(str(r)) for r in args.results]
    except HistoryError as e:
        _usage(str(e))
    if args.history:
        for doc in docs:
            for label, sub in split_by_release(doc).values():
                append_run(str(args.history), sub, label=label)
    first = args.results[0]
    args.out = args.out or Path(first if first.is_dir() else first.parent)
    _write_table({**docs[0], "records": [r for d in docs for r in d["records"]]}, args)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prepare", help="build the python-only trees (and pack them into one archive)")
    pre.add_argument("--releases", help=f"comma-separated vLLM versions (default: {RELEASES[0]} .. {RELEASES[-1]}, {len(RELEASES)})")
    pre.add_argument("--wheels", type=Path, help="a folder of vLLM wheels to use before downloading")
    pre.add_argument("--vendor", type=Path, default=ROOT / "vendor", help="where the trees go (default vendor/)")
    pre.add_argument("--pack", type=Path, help="write the trees into this .tar.xz too")
    r = sub.add_parser("run", help="verify every release's V1 and MRV2 in one run")
    r.add_argument("--trees", type=Path, default=ROOT / "vendor", help="a folder of vllm-X trees, or a .tar.xz from prepare --pack")
    r.add_argument("--unpack-to", type=Path, help="where an archive is unpacked (default: a temporary folder)")
    r.add_argument("--releases", help="comma-separated versions (default: every tree found)")
    r.add_argument("--implementations", default="v1,mrv2", help="v1, mrv2 or both (default)")
    r.add_argument("--profile", default="ci")
    r.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--scenario", action="append", help="catalog scenario (repeatable; default: the whole catalog)")
    r.add_argument("--exclude", action="append", help="leave out this catalog scenario (repeatable)")
    r.add_argument("--timeout", type=float, default=900.0, help="a worker's limit per load or scenario (s)")
    r.add_argument(
        "--group",
        type=int,
        default=0,
        help="releases per harness run, run one after another (default 0: all in one run); on a GPU every "
        "backend's worker holds device memory, so a smaller GPU takes the releases in groups",
    )
    r.add_argument("--history", type=Path, help="append one run per release to this history")
    r.add_argument("--out", type=Path, default=ROOT / "reports" / "releases")
    r.add_argument("--json", type=Path, help="write the per-release table as JSON here")
    t = sub.add_parser("table", help="the per-release table of finished runs (their results.json or folders)")
    t.add_argument("results", type=Path, nargs="+")
    t.add_argument("--json", type=Path)
    t.add_argument("--history", type=Path, help="append these runs to this history too, one run per release")
    t.add_argument("--out", type=Path, help="where vllm-releases.md goes (default: beside results.json)")
    args = p.parse_args(argv)
    return {"prepare": prepare, "run": run, "table": table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
