"""Builders shared by several test modules (tests import these, never each other)."""

import shutil

MARK = "standard-near-target"  # the scenario the misbehaving backends fail on (templates with 1, 3 and 4 drafts)


def python_only_tree(dest):
    """A python-only vLLM tree (``.py`` files + dist-info METADATA) from the installed wheel,
    as scripts/build_vllm_tree.py makes one from a wheel or a checkout."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    src = Path(spec.origin).parent
    for path in src.rglob("*.py"):
        target = dest / "vllm" / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    version = importlib.metadata.version("vllm")
    meta = dest / f"vllm-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return dest
