"""Backend registry: built-in names, planted faults, and third-party dotted paths.

``reference``          the float64 NumPy sampler (``reference.sampler``).
``triton``             the suite's own Triton sampler (``harness.backends.triton``).
``vllm-mrv2``          vLLM's Model Runner V2 ``rejection_sample`` (``harness.backends.vllm.mrv2``), with
                       its drafter's ``gumbel_sample`` for drafts it draws (``harness.backends.vllm.drafting``).
``vllm-v1``            vLLM's V1 ``rejection_sample`` (``harness.backends.vllm.v1``), with its proposers'
                       ``compute_probs_and_sample_next_token`` for drafts it draws (``harness.backends.vllm.v1_drafting``).
``vllm-v0-typical``    vLLM V0's ``TypicalAcceptanceSampler``, bound to a V0 release's files with ``@PATH``
                       (``harness.backends.vllm.v0_typical``).
``vllm-v0-rejection``  vLLM V0's ``RejectionSampler`` (PyTorch), bound to a V0 release's files with ``@PATH``
                       (``harness.backends.vllm.v0_rejection``).
``fault:NAME``         the reference with one planted bug (``harness.backends.faults``).
``triton-fault:NAME``  the Triton sampler with one planted kernel bug (``harness.backends.triton.faults``).
``pkg.mod:Attr``       a third-party implementation: a class (instantiated with no
                       arguments), an object with ``sample(batch)``, or a plain function
                       ``sample(batch) -> (tokens, num_emitted)``. See ``harness.protocol``.
``NAME@PATH``          any of these bound to a vLLM source tree (``harness.backends.loading.split_source``).

``check_backend_name`` refuses a name none of these can be, before anything is sampled.
"""

import importlib
import os
import sys

from harness.backends.faults import FAULTS
from harness.backends.triton.faults import TRITON_FAULTS
from harness.scenarios.scenario import did_you_mean
from reference.sampler import ReferenceSampler


class SamplerBackend:
    """A NumPy sampler object behind the protocol."""

    devices = ("cpu",)

    def __init__(self, name: str, sampler):
        self.name = name
        self._sampler = sampler
        self.drafter = getattr(sampler, "drafter", False)  # draws its own drafts (VerifyBatch.draft_sampling)

    def sample(self, batch):
        return self._sampler.sample(batch)


class FunctionBackend:
    devices = ("cpu", "cuda")

    def __init__(self, name: str, fn):
        self.name = name
        self._fn = fn

    def sample(self, batch):
        return self._fn(batch)


# Built-in names for backends whose modules import heavy packages only when loaded.
NAMED = {
    "triton": "harness.backends.triton.backend:TritonBackend",
    "vllm-mrv2": "harness.backends.vllm.drafting:VllmMrv2DrafterBackend",  # MRV2's verifier, and its drafter when asked
    "vllm-v1": "harness.backends.vllm.v1_drafting:VllmV1DrafterBackend",  # V1's verifier, and its proposers' drafting when asked
    "vllm-v0-typical": "harness.backends.vllm.v0_typical:VllmV0TypicalBackend",  # V0's TypicalAcceptanceSampler (@PATH: its files)
    "vllm-v0-rejection": "harness.backends.vllm.v0_rejection:VllmV0RejectionBackend",  # V0's RejectionSampler (@PATH: its files)
}


def builtin_names() -> list[str]:
    return ["reference", *NAMED] + [f"fault:{name}" for name in FAULTS] + [f"triton-fault:{name}" for name in TRITON_FAULTS]


def check_backend_name(name: str) -> None:
    """Raise ``ValueError`` (one line, with the closest built-in name) when ``name`` is no
    backend name: neither built in, ``fault:NAME``, ``triton-fault:NAME`` of a planted fault,
    a dotted path ``pkg.mod:Attr`` nor one of these ``@PATH``. Dotted paths are not imported
    (slow, and maybe device-bound): ``load_backend`` reports what is wrong with them."""
    if not isinstance(name, str) or not name:
        raise ValueError("backend: expected a backend name")
    base, sep, src = name.partition("@")
    if sep and not (base and src):
        raise ValueError(f"backend: {name!r}: expected NAME@PATH, a backend name and a vLLM source tree")
    if base in ("reference", *NAMED):
        return
    if base.startswith("fault:"):
        _check_fault(base, FAULTS, "fault", "fault:")
    elif base.startswith("triton-fault:"):
        _check_fault(base, TRITON_FAULTS, "Triton fault", "triton-fault:")
    elif ":" in base:
        module_name, _, attr = base.partition(":")
        if not module_name or not attr:
            raise ValueError(f"backend: {base!r}: expected a dotted path 'package.module:Attr'")
    else:
        raise ValueError(
            f"backend: unknown backend {base!r}{did_you_mean(base, builtin_names())} (built in: reference, {', '.join(NAMED)}, "
            "fault:NAME, triton-fault:NAME; or a dotted path 'package.module:Class')"
        )


def _check_fault(name: str, faults, kind: str, prefix: str) -> None:
    fault = name.split(":", 1)[1]
    if fault not in faults:
        hint = did_you_mean(fault, list(faults), prefix)
        raise ValueError(f"backend: unknown {kind} {fault!r}{hint} (known: {', '.join(faults)})")


def load_backend(name: str):
    """Resolve a backend name; raise ``ValueError`` naming what is wrong."""
    if not isinstance(name, str) or not name:
        raise ValueError("backend: expected a backend name")
    if name == "reference":
        return SamplerBackend(name, ReferenceSampler())
    if name in NAMED:
        backend = _load_dotted(NAMED[name])
        backend.name = name
        return backend
    if name.startswith("fault:"):
        _check_fault(name, FAULTS, "fault", "fault:")
        return SamplerBackend(name, FAULTS[name.split(":", 1)[1]]())
    if name.startswith("triton-fault:"):
        _check_fault(name, TRITON_FAULTS, "Triton fault", "triton-fault:")
        fault = name.split(":", 1)[1]
        try:
            from harness.backends.triton.variants import TritonFaultBackend
        except ImportError as e:
            raise ValueError(f"backend: {name!r} needs the Triton backend: {e}") from None
        return TritonFaultBackend(fault)
    if ":" in name:
        return _load_dotted(name)
    check_backend_name(name)  # raises: an unknown name, with the closest built-in one
    raise ValueError(f"backend: unknown backend {name!r}")


def _load_dotted(name: str):
    module_name, _, attr = name.partition(":")
    # As with `python -m`: a user's adapter in the folder they run from is importable from
    # the console script and the pytest plugin too.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
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
    """(name, available, note) for every built-in backend; the note says why not, and how to fix it."""
    rows = [("reference", True, "float64 NumPy reference sampler")]
    notes = {}
    for name, path in NAMED.items():
        module_name = path.split(":")[0]
        try:
            module = importlib.import_module(module_name)
            probe = getattr(module, "availability", None)
            available, note = probe() if probe else (True, (module.__doc__ or "").strip().splitlines()[0])
        except Exception as e:  # an optional dependency missing is a note, not a crash
            available, note = False, f"{type(e).__name__}: {e}"
        rows.append((name, available, note))
        notes[name] = available, note
    rows += [(f"fault:{n}", True, (cls.__doc__ or "").strip().splitlines()[0]) for n, cls in FAULTS.items()]
    triton_ok, triton_note = notes["triton"]
    rows += [(f"triton-fault:{n}", triton_ok, f.where if triton_ok else triton_note) for n, f in TRITON_FAULTS.items()]
    return rows
