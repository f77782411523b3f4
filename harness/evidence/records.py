"""Evidence: one typed record per check, the one declaration of what a check's result holds.

The checks fill it (``harness.checking``), the run's family rule gives statistical checks
their verdict, the run document and the history store its fields as declared here (the
history's columns are derived from them: ``columns``), and reports read it only: they
never recompute statistics.
"""

import dataclasses
import enum
import math
import types
import typing
from dataclasses import dataclass


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"  # the backend could not be run on the scenario (load, sampling or protocol error)
    SKIPPED = "skipped"  # not evaluated: declined, unsupported, or no valid trial reached the check


class Kind(enum.StrEnum):
    EXACT = "exact"  # any deviation from the law fails it
    GOF = "gof"  # a chi-square goodness-of-fit test at the check's alpha
    BINOMIAL = "binomial"  # an exact binomial test at the check's alpha
    SKIPPED = "skipped"
    ERROR = "error"
    API_DRIFT = "api-drift"  # an adapter found no known contract in the implementation's signatures

    @property
    def statistical(self) -> bool:
        """Whether the run's family rule (Holm) decides the verdict from the p-value."""
        return self in (Kind.GOF, Kind.BINOMIAL)


@dataclass(frozen=True)
class AcceptanceStep:
    """Step ``step``'s conditional acceptance P(N >= j+1 | N >= j): observed among the
    trials that reached it, with a 95% Wilson interval, and the exact law's value."""

    step: int
    reached: int
    accepted: int
    observed: float
    lo: float
    hi: float
    expected: float


@dataclass(frozen=True)
class AcceptanceByStep:
    """The accepted-count histogram against its law, and acceptance per step (chart data of
    the acceptance-length check)."""

    length_observed: tuple[float, ...]
    length_expected: tuple[float, ...]
    steps: tuple[AcceptanceStep, ...]


@dataclass
class CheckRecord:
    backend: str
    scenario: str
    template: int  # the request template's index in the scenario; -1 for a whole-scenario error
    check: str
    verdict: Verdict | None  # None only until the run's family rule decides a statistical check
    kind: Kind
    message: str
    reproducer: str
    method: str = ""
    statistic: float | None = None
    df: int | None = None
    p_value: float | None = None
    alpha: float = 0.0  # this check's own level (0 for exact checks)
    holm_threshold: float | None = None  # what Holm compared the p-value with across the run
    trials: int = 0
    detectable_tv: float | None = None  # smallest TV detected with the profile's power
    tv_estimate: float | None = None
    tv_ci: tuple[float, float] | None = None
    cells: list | None = None  # [(label, observed, expected)] of the largest pooled cells
    acceptance: AcceptanceByStep | None = None  # acceptance-length checks only

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for key, value in d.items():
            if isinstance(value, float) and not math.isfinite(value):
                d[key] = None if math.isnan(value) else str(value)
            elif isinstance(value, enum.Enum):
                d[key] = value.value
        return d


def columns() -> list[tuple[str, str, bool]]:
    """(name, SQLite type, required) of every ``CheckRecord`` field, in order: numbers and
    text as such, anything structured (intervals, cells, chart data) as JSON text; a field
    without a default is required."""
    hints = typing.get_type_hints(CheckRecord)
    return [
        (f.name, _sql_type(hints[f.name]), f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(CheckRecord)
    ]


def _sql_type(hint) -> str:
    options = [t for t in typing.get_args(hint) if t is not type(None)] if isinstance(hint, types.UnionType) else [hint]
    if len(options) == 1 and options[0] is int:
        return "INTEGER"
    if len(options) == 1 and options[0] is float:
        return "REAL"
    if len(options) == 1 and isinstance(options[0], type) and issubclass(options[0], str):
        return "TEXT"
    return "JSON"  # stored as text; the history decodes it on reading
