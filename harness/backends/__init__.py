"""Backend registry: built-in names, planted faults, and third-party dotted paths.

``reference``          the float64 NumPy sampler (``reference.sampler``).
``fault:NAME``         the reference with one planted bug (``harness.faults``).
``pkg.mod:Attr``       a third-party implementation: a class (instantiated with no
                       arguments), an object with ``sample(batch)``, or a plain function
                       ``sample(batch) -> (tokens, num_emitted)``. See ``harness.protocol``.
"""

import importlib

from harness.faults import FAULTS
from reference.sampler import ReferenceSampler


class SamplerBackend:
    """A NumPy sampler object behind the protocol."""

    devices = ("cpu",)

    def __init__(self, name: str, sampler):
        self.name = name
        self._sampler = sampler

    def sample(self, batch):
        return self._sampler.sample(batch)


class FunctionBackend:
    devices = ("cpu", "cuda")

    def __init__(self, name: str, fn):
        self.name = name
        self._fn = fn

    def sample(self, batch):
        return self._fn(batch)


def builtin_names() -> list[str]:
    return ["reference"] + [f"fault:{name}" for name in FAULTS]


def load_backend(name: str):
    """Resolve a backend name; raise ``ValueError`` naming what is wrong."""
    if not isinstance(name, str) or not name:
        raise ValueError("backend: expected a backend name")
    if name == "reference":
        return SamplerBackend(name, ReferenceSampler())
    if name.startswith("fault:"):
        fault = name.split(":", 1)[1]
        if fault not in FAULTS:
            raise ValueError(f"backend: unknown fault {fault!r} (known: {', '.join(FAULTS)})")
        return SamplerBackend(name, FAULTS[fault]())
    if ":" in name:
        return _load_dotted(name)
    raise ValueError(f"backend: unknown backend {name!r} (built in: {', '.join(builtin_names())}; or a dotted path 'package.module:Class')")


def _load_dotted(name: str):
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"backend: cannot import module {module_name!r} for {name!r}: {e}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"backend: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type):
        obj = obj()
    if hasattr(obj, "sample") and callable(obj.sample):
        if not getattr(obj, "name", None):
            obj.name = name
        return obj
    if callable(obj):
        return FunctionBackend(name, obj)
    raise ValueError(f"backend: {name!r} is neither a sampler class, an object with sample(batch), nor a function")


def describe_backends() -> list[tuple[str, bool, str]]:
    """(name, available, note) for every built-in backend."""
    rows = [("reference", True, "float64 NumPy reference sampler")]
    rows += [(f"fault:{n}", True, (cls.__doc__ or "").strip().splitlines()[0]) for n, cls in FAULTS.items()]
    return rows
