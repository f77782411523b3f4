"""Evidence: one typed record per check, and the run's results file.

Reports read these records only; they never recompute statistics.
"""

import math
from dataclasses import asdict, dataclass, field

VERDICTS = ("pass", "fail", "error", "skipped")


@dataclass
class CheckRecord:
    backend: str
    scenario: str
    template: int
    check: str
    verdict: str  # one of VERDICTS
    kind: str  # exact | gof | binomial | error | skipped
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
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key, value in d.items():
            if isinstance(value, float) and not math.isfinite(value):
                d[key] = None if math.isnan(value) else str(value)
        return d
