"""Evidence: one typed record per check, and the run's results file.

Reports read these records only; they never recompute statistics.
"""

import json
import math
import os
import tempfile
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


def write_json_atomic(path: str, data) -> None:
    """Write JSON through a temporary file and a rename: never a half-written file."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_text_atomic(path: str, text: str) -> None:
    """Write through a temporary file in the same folder and a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
