"""Tree samplers under test, and the protocol they implement.

A tree sampler is an object (or a class built with no arguments) with ``rule`` ("sglang"
or "specinfer") and the calls of ``reference.tree``'s samplers:

* SGLang: ``sample(tree, trials, seed, threshold_single, threshold_acc) -> (node, token)``;
* SpecInfer, fixed children: ``sample(tree, trials, seed) -> (node, token)``;
* SpecInfer, drafted children (optional): ``sample_drawn(parents, target, draft, trials,
  seed) -> codes`` (``reference.tree.PrefixModel`` target and draft; the emitted sequences'
  codes, ``reference.tree.decode``).

``tree`` is a ``reference.tree.DraftTree``; ``node`` and ``token`` are ``[trials]`` integer
arrays: the deepest accepted node and the token emitted after it. A sampler may also have
``supports(scenario) -> None | reason`` to decline a scenario (``TreeScenario``).

Names: ``reference`` (both rules), ``tree-fault:NAME`` (``harness.trees.faults``) and
``package.module:attr`` (a user's sampler).
"""

import importlib
import os
import sys
from dataclasses import dataclass

import numpy as np

from harness.trees.faults import FAULTS
from harness.trees.scenario import RULES, TreeCase
from reference import tree as tr

FAULT_PREFIX = "tree-fault:"


@dataclass
class TreeBackend:
    name: str
    samplers: dict  # rule -> sampler

    def declines(self, case: TreeCase) -> str | None:
        """Why this backend cannot verify the scenario, or None."""
        s = case.scenario
        sampler = self.samplers.get(s.rule)
        if sampler is None:
            return f"{self.name} implements {', '.join(self.samplers)}; {s.name} is for the {s.rule} rule"
        if case.tree is None and not callable(getattr(sampler, "sample_drawn", None)):
            return f"{self.name} has no sample_drawn: {s.name} drafts the children per trial"
        supports = getattr(sampler, "supports", None)
        return supports(s) if callable(supports) else None

    def counts(self, case: TreeCase, trials: int, seed: int) -> np.ndarray:
        """Counts of the case's cells over ``trials`` trials; ``ValueError`` when the
        sampler's output breaks the protocol."""
        s, sampler = case.scenario, self.samplers[case.scenario.rule]
        if case.tree is None:
            codes = _ids(sampler.sample_drawn(s.parents, case.target, case.draft, trials, seed), trials, case.law.size, "codes")
            return np.bincount(codes, minlength=case.law.size).astype(np.float64)
        args = (case.tree, trials, seed) + (s.thresholds if s.rule == "sglang" else ())
        out = sampler.sample(*args)
        if not isinstance(out, tuple | list) or len(out) != 2:
            raise ValueError(f"sample returned {type(out).__name__}, expected (node, token)")
        node = _ids(out[0], trials, case.tree.num_nodes, "node")
        token = _ids(out[1], trials, case.tree.vocab, "token")
        return tr.outcome_counts(case.tree, node, token).ravel()


def _ids(values, trials: int, bound: int, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape != (trials,) or arr.dtype.kind not in "iu":
        raise ValueError(f"{what}: expected {trials} integers, got shape {arr.shape} of {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr >= bound))
    if bad.size:
        raise ValueError(f"{what}: trial {bad[0]} gave {arr[bad[0]]}, outside [0, {bound})")
    return arr.astype(np.int64)


def check_name(name: str) -> None:
    """``ValueError`` (one line) unless ``name`` is a tree backend name; imports nothing."""
    from harness.scenarios.scenario import did_you_mean

    if name == "reference":
        return
    if name.startswith(FAULT_PREFIX):
        fault = name[len(FAULT_PREFIX) :]
        if fault not in FAULTS:
            raise ValueError(
                f"--backend {name}: unknown tree fault {fault!r}{did_you_mean(fault, FAULTS, FAULT_PREFIX)} (known: {', '.join(FAULTS)})"
            )
        return
    module, _, attr = name.partition(":")
    if module in ("fault", "triton-fault"):
        raise ValueError(f"--backend {name}: a planted chain fault (python -m harness run); tree faults are tree-fault:NAME")
    if not (module and attr):
        names = ["reference"] + [FAULT_PREFIX + f for f in FAULTS]
        raise ValueError(
            f"--backend: unknown tree backend {name!r}{did_you_mean(name, names)} "
            "(expected reference, tree-fault:NAME or a dotted path 'package.module:attr')"
        )


def load(name: str) -> TreeBackend:
    """The backend ``name``; ``ValueError`` saying what is wrong (a dotted path that does not
    import, or an object that is no tree sampler)."""
    check_name(name)
    if name == "reference":
        return TreeBackend(name, {"sglang": tr.SGLangTreeSampler(), "specinfer": tr.SpecInferTreeSampler()})
    if name.startswith(FAULT_PREFIX):
        fault = FAULTS[name[len(FAULT_PREFIX) :]]
        return TreeBackend(name, {fault.rule: fault()})
    obj = _import(name)
    rule = getattr(obj, "rule", None)
    if rule not in RULES:
        raise ValueError(f"backend {name}: expected an attribute rule in {RULES}, got {rule!r}")
    return TreeBackend(name, {rule: obj})


def _import(name: str):
    """The object a dotted path names, a class built with no arguments."""
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m`: the folder run from
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"backend {name}: cannot import module {module_name!r}: {e}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"backend {name}: module {module_name!r} has no attribute {attr!r}") from None
    return obj() if isinstance(obj, type) else obj
