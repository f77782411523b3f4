"""The fault-detection matrix: every planted fault x check family, detected or not.

``python -m harness faults --profile ci`` runs each fault over the profile's catalog with
the same runner as every backend; a fault is *detected* by a check family when at least
one check of that family fails (after Holm, like any run). The row names the strongest
catching check (scenario, template, p-value) and every catching scenario.
``backend="triton"`` runs the faults planted in the Triton kernels (``harness.backends.triton.faults``,
``--backend triton-fault:NAME``) instead of the reference's (``fault:NAME``).
"""

from dataclasses import asdict, dataclass, field

from harness.backends.faults import FAULTS
from harness.backends.triton.faults import NOT_PLANTED, TRITON_FAULTS
from harness.run.runner import run
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import Profile

FAMILIES = ("structure", "outcome-law", "position-law", "acceptance-length", "acceptance-rate", "draft-law")
PREFIX = {"reference": "fault:", "triton": "triton-fault:"}  # sampler -> backend name prefix of its faults


def planted(backend: str = "reference") -> dict:
    """Fault name -> one-line description, for the faults planted in ``backend``."""
    if backend == "reference":
        return {name: (cls.__doc__ or "").strip().splitlines()[0] for name, cls in FAULTS.items()}
    if backend == "triton":
        return {name: f.where for name, f in TRITON_FAULTS.items()}
    raise ValueError(f"faults are planted in 'reference' or 'triton', not {backend!r}")


def family_of(check: str) -> str:
    return check.split("[", 1)[0]


@dataclass
class FaultRow:
    fault: str
    doc: str
    detected: bool
    families: dict  # family -> bool
    catching: str | None  # "scenario[template] check" of the strongest catch
    p_value: float | None
    scenarios: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    catches: list = field(default_factory=list)  # (scenario, template, check, p-value) of every failing check


def detect(fault: str, profile: Profile, seed: int = 0, device: str = "cpu", backend: str = "reference", scenarios=None) -> FaultRow:
    """Run one planted fault over ``scenarios`` (default: the profile's catalog)."""
    doc = planted(backend)[fault]
    result = run([PREFIX[backend] + fault], scenarios or catalog(profile, seed), profile, seed, device)
    failed = [r for r in result.records if r.verdict == "fail"]
    families = {f: any(family_of(r.check) == f for r in failed) for f in FAMILIES}
    strongest = min(failed, key=lambda r: (r.p_value if r.p_value is not None else 1.0, r.kind != "exact"), default=None)
    return FaultRow(
        fault=fault,
        doc=doc,
        detected=bool(failed),
        families=families,
        catching=f"{strongest.scenario}[{strongest.template}] {strongest.check}" if strongest else None,
        p_value=strongest.p_value if strongest else None,
        scenarios=sorted({r.scenario for r in failed}),
        errors=[r.message for r in result.records if r.verdict == "error"],
        catches=[(r.scenario, r.template, r.check, r.p_value) for r in failed],
    )


def matrix(profile: Profile, seed: int = 0, device: str = "cpu", faults=None, progress=None, backend: str = "reference") -> list[FaultRow]:
    rows = []
    for name in faults or planted(backend):
        rows.append(detect(name, profile, seed, device, backend))
        if progress:
            progress(1)
    return rows


def to_markdown(rows: list[FaultRow], profile: Profile) -> str:
    head = f"Profile `{profile.name}`: each check α = {profile.alpha:g}, detects TV ≥ {profile.tv} with power {profile.power}.\n\n"
    cols = " | ".join(FAMILIES)
    lines = [head, f"| fault | detected | {cols} | strongest catch | p-value |", "|" + "---|" * (len(FAMILIES) + 4)]
    for r in rows:
        marks = " | ".join("✔" if r.families[f] else "" for f in FAMILIES)
        p = "–" if r.p_value is None else f"{r.p_value:.2g}"
        lines.append(f"| `{r.fault}` | {'yes' if r.detected else '**no**'} | {marks} | {r.catching or '–'} | {p} |")
    return "\n".join(lines) + "\n"


def planted_table() -> str:
    """Where each Triton fault is planted, how it differs from the same-named reference fault,
    and why the other reference faults are not planted."""
    lines = ["| fault | planted | differs from the reference fault |", "|---|---|---|"]
    lines += [f"| `{name}` | {f.where} | {f.note or '–'} |" for name, f in TRITON_FAULTS.items()]
    lines += ["", "| reference fault | not planted: why |", "|---|---|"]
    lines += [f"| `{name}` | {why} |" for name, why in NOT_PLANTED.items()]
    return "\n".join(lines) + "\n"


def to_json(rows: list[FaultRow]) -> list[dict]:
    return [asdict(r) for r in rows]
