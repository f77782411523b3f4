"""Environment setup that must happen before vLLM is imported, and discovery of its API.

vLLM is not a dependency of the suite: its rejection samplers are pure Python + Triton, so
the suite installs the wheel with ``--no-deps`` plus the import closure of those modules
(``requirements-vllm.txt``), or puts a python-only source tree on ``sys.path``
(``scripts/build_vllm_tree.py``, ``--vllm-src PATH`` / ``SPECDEC_VLLM_SRC``).

Adapters bind to vLLM through its declared contract only: which API exists and what it takes
come from ``inspect.signature``; what a signature cannot say (whether a kernel divides its
inputs by the temperature, say) comes from the release (``version()``). Never from running
the code under test: an adapter that adapts to it hides the regressions it exists to catch
(``docs/adapter-contracts.md``).

``prepare()`` (idempotent, called by the backends before the first vLLM import):

* CPU-only machine: ``TRITON_INTERPRET=1`` (kernels run on CPU tensors) and
  ``CUDA_VISIBLE_DEVICES=""``. Without the latter vLLM counts 0 active Triton drivers and
  replaces ``triton`` with a do-nothing placeholder (``vllm/triton_utils/importing.py``
  tolerates 0 drivers only in an "empty visible devices" environment).
* CUDA machine: vLLM's platform module imports the compiled ``vllm._C_stable_libtorch``
  at import time although the rejection kernels never use it; a python-only tree has no
  compiled modules, so empty stand-ins are registered for them.
* Interpreter: ``triton.language.extra.libdevice`` functions are stubs that return None
  under ``TRITON_INTERPRET=1``; ``log1p`` / ``exp`` / ``log`` / ``expm1`` (MRV2's resample
  kernel calls ``log1p``) are replaced by NumPy versions. Kernels look the attribute up
  when they run, so patching the module attribute is enough.
* Interpreter speed: Triton's interpreter re-patches ``triton.language`` (``inspect.getmembers``
  over the whole module) on every call of a nested ``@triton.jit`` function, more than half
  of the time of vLLM's kernels. Inside one launch that repeat is a no-op once the modules
  in the function's globals were patched, so it is skipped (same results, ~3x faster).
"""

import importlib
import importlib.util
import inspect
import os
import re
import sys
import types
from pathlib import Path

import numpy as np

from harness.gpus import configure_triton, cuda_available
from harness.protocol import host

INSTALL_HINT = (
    "install vLLM's python code without its dependencies: "
    "`pip install --no-deps -r requirements-vllm.txt` (vllm==0.33.0 plus the import closure of its rejection samplers), "
    "or point --vllm-src / SPECDEC_VLLM_SRC at a tree built by scripts/build_vllm_tree.py"
)
SRC_ENV = "SPECDEC_VLLM_SRC"
_COMPILED = ("_C_stable_libtorch", "_moe_C_stable_libtorch", "_C")
_state = {"prepared": False, "notes": []}


def use_source_tree(path: str | os.PathLike) -> None:
    """Import vLLM from ``path`` (a folder holding ``vllm/``) instead of site-packages."""
    path = Path(path).resolve()
    if not (path / "vllm" / "__init__.py").is_file():
        raise ValueError(f"--vllm-src: {path} has no vllm/__init__.py (build one with scripts/build_vllm_tree.py)")
    if "vllm" in sys.modules and not str(Path(sys.modules["vllm"].__file__).resolve()).startswith(str(path)):
        raise RuntimeError(f"--vllm-src: vLLM was already imported from {sys.modules['vllm'].__file__}; set the tree before any import")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def prepare() -> list[str]:
    """Set up the process for importing vLLM; returns notes on what was done."""
    if _state["prepared"]:
        return _state["notes"]
    notes = _state["notes"]
    if os.environ.get(SRC_ENV):
        use_source_tree(os.environ[SRC_ENV])
        notes.append(f"vLLM source tree {os.environ[SRC_ENV]}")
    configure_triton()
    if not cuda_available():
        if "vllm.triton_utils" in sys.modules and os.environ.get("CUDA_VISIBLE_DEVICES") != "":
            raise RuntimeError("vLLM was imported before harness.backends.vllm.env.prepare(): its Triton check has already failed")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    else:
        notes += _stub_compiled_modules()
    if os.environ.get("TRITON_INTERPRET") == "1":
        _patch_libdevice()
        _skip_nested_lang_patching()
    _state["prepared"] = True
    return notes


def _stub_compiled_modules() -> list[str]:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0])
    notes = []
    for name in _COMPILED:
        full = f"vllm.{name}"
        if full in sys.modules or any(folder.glob(f"{name}.*so")):
            continue  # a real compiled module is there: let vLLM load it
        sys.modules[full] = types.ModuleType(full)
        notes.append(f"empty stand-in for {full} (python-only tree)")
    return notes


def _patch_libdevice() -> None:
    import numpy as np
    import triton.language as tl
    import triton.language.extra.libdevice as libdevice
    from triton.runtime.interpreter import TensorHandle

    def numpy_op(fn):
        def op(x, _semantic=None):
            data = fn(x.handle.data)
            return tl.core.tensor(TensorHandle(data.astype(x.handle.data.dtype, copy=False), x.handle.dtype), x.type)

        op.__name__ = fn.__name__
        return op

    for name, fn in (("log1p", np.log1p), ("exp", np.exp), ("log", np.log), ("expm1", np.expm1)):
        if not getattr(getattr(libdevice, name), "_specdec_numpy", False):
            patched = numpy_op(fn)
            patched._specdec_numpy = True
            setattr(libdevice, name, patched)


def _skip_nested_lang_patching() -> None:
    import triton.language as tl
    import triton.runtime.interpreter as interp

    if getattr(interp._patch_lang, "_specdec", False) or not hasattr(interp, "GridExecutor"):
        return
    patch_lang, launch = interp._patch_lang, interp.GridExecutor.__call__
    state = {"depth": 0, "patched": frozenset()}

    def nested_aware_patch_lang(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        if state["depth"] and langs <= state["patched"]:
            return interp._LangPatchScope()  # this launch already patched these modules
        scope = patch_lang(fn)
        if state["depth"]:
            state["patched"] |= langs
        return scope

    def counted_launch(self, *args, **kwargs):
        state["depth"] += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["depth"] -= 1
            if not state["depth"]:
                state["patched"] = frozenset()  # the launch restored what it patched

    nested_aware_patch_lang._specdec = True
    interp._patch_lang = nested_aware_patch_lang
    interp.GridExecutor.__call__ = counted_launch


# --- API discovery ----------------------------------------------------------------------------
def import_vllm(module: str):
    """Import a vLLM module after ``prepare()``; ImportError says how to install vLLM."""
    prepare()
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if getattr(e, "name", None) and not str(e.name).startswith("vllm"):
            raise ImportError(f"vLLM needs {e.name!r} to import {module} ({e}); {INSTALL_HINT}") from e
        raise ImportError(f"cannot import {module}: {e}; {INSTALL_HINT}") from e


def optional_module(name: str):
    """The module, or None when this vLLM has no such module (other import errors raise)."""
    try:
        return import_vllm(name)
    except ImportError as e:
        cause = e.__cause__
        if isinstance(cause, ModuleNotFoundError) and cause.name and name.startswith(cause.name):
            return None
        raise


def api_changed(what: str) -> RuntimeError:
    return RuntimeError(f"vLLM API changed: {what}")


def version():
    """The imported vLLM's release (``packaging.version.Version``), or None when it declares
    none: ``vllm.__version__`` (``_version.py``, written by the wheel build), else the
    ``vllm-X.dist-info/METADATA`` beside the imported package (a tree from
    ``scripts/build_vllm_tree.py --git`` has no ``_version.py``)."""
    vllm = import_vllm("vllm")
    candidates = [getattr(vllm, "__version__", None)]
    for meta in sorted(Path(vllm.__file__).resolve().parent.parent.glob("vllm-*.dist-info/METADATA")):
        found = re.search(r"^Version: *(\S+)", meta.read_text(errors="replace"), re.M)
        candidates.append(found and found.group(1))
    for text in candidates:
        parsed = parse_version(text) if isinstance(text, str) else None
        if parsed is not None:
            return parsed
    return None


def parse_version(text: str):
    """A PEP 440 version, or None ("dev": a checkout without ``_version.py``). ``git describe``
    output (``0.33.0-57-gabc``) reads as a post-release of its tag: that many commits after it."""
    from packaging.version import InvalidVersion, Version

    text = re.sub(r"^v?(\d+(?:\.\d+)*)-(\d+)-g[0-9a-f]+$", r"\1.post\2", text.strip())
    try:
        return Version(text)
    except InvalidVersion:
        return None


def parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def require_parameters(fn, names: list[str], where: str) -> list[str]:
    """The function's parameter names; RuntimeError naming the ones that are missing."""
    have = parameters(fn)
    missing = [n for n in names if n not in have]
    if missing:
        raise api_changed(f"{where} has no parameter(s) {missing} (has {have})")
    return have


FLY_ARGS = ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")  # rejection_sample's FLy parameters (0.33.0+)


def fly_kwargs(batch, params, where: str) -> tuple[dict | None, str | None]:
    """``(kwargs, None)``: the batch's one FLy window, threshold and top-k as ``params`` (a
    function's parameter names) names them, or ``(None, why not)``: the function has no FLy,
    or the requests' parameters differ (vLLM takes one set per batch, from its config)."""
    missing = [name for name in FLY_ARGS if name not in params]
    if missing:
        return None, f"this vLLM's {where} has no FLy ({', '.join(missing)}: vLLM 0.33.0+)"
    values = [host(getattr(batch, name)) for name in FLY_ARGS]
    if any(not np.all(v == v[0]) for v in values):
        return None, "per-request FLy parameters (vLLM takes one window, entropy threshold and top-k per batch)"
    w, thr, k = (v[0] for v in values)
    return {"fly_window_size": int(w), "fly_entropy_threshold": float(thr), "fly_entropy_top_k": int(k)}, None


def triton_ready() -> None:
    """vLLM silently swaps Triton for a placeholder when its driver check fails; say so."""
    tu = import_vllm("vllm.triton_utils")
    if not tu.HAS_TRITON:
        raise RuntimeError(
            "vLLM disabled Triton (HAS_TRITON is False): on a CPU machine set CUDA_VISIBLE_DEVICES='' before importing vLLM; "
            "a python-only tree needs vllm-X.dist-info/METADATA (scripts/build_vllm_tree.py writes it)"
        )


def vllm_location() -> str:
    spec = importlib.util.find_spec("vllm")
    return str(Path(spec.origin).parent) if spec and spec.origin else "not installed"


def availability(probe) -> tuple[bool, str]:
    """(True, where vLLM is) when ``probe()`` runs, else (False, why)."""
    try:
        prepare()  # puts --vllm-src / SPECDEC_VLLM_SRC on sys.path first
        if importlib.util.find_spec("vllm") is None:
            return False, f"vLLM is not installed; {INSTALL_HINT}"
        probe()
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    return True, f"vLLM at {vllm_location()}"
