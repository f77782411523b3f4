"""Run profiles: the error rates and the smallest discrepancy each must detect.

Trial counts are never chosen here: every check derives its own from these numbers
through ``harness.checking.stats`` before anything is sampled.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    alpha: float  # false-alarm rate of one check (Holm then controls the run)
    power: float  # probability of detecting a discrepancy of ``tv``
    tv: float  # smallest total-variation discrepancy every check must detect
    vocab: int  # vocabulary of the catalog's small scenarios
    large_vocab: int  # vocabulary of the catalog's large-vocabulary scenarios
    boundary_vocab: int = 0  # vocabulary of the catalog's tile-boundary scenario (0: none; see harness.scenarios.catalog)
    chunk_elements: int = 1 << 24  # logits per backend call (memory budget), host batches
    device_chunk_elements: int = 1 << 30  # the same for batches built on a GPU (4 GiB of fp32 rows)
    description: str = ""
    # One-multinomial checks as the combined design (harness.checking.sequential): a sequential
    # test monitored while sampling stops a wrong implementation early. Opt-in (--sequential):
    # it costs a passing implementation 2.4-6.6 % more trials (docs/sequential.md).
    sequential: bool = False


PROFILES = {
    p.name: p
    for p in (
        Profile("smoke", 1e-6, 0.99, 0.1, vocab=8, large_vocab=64, description="seconds; a sanity run"),
        Profile("ci", 1e-6, 0.99, 0.02, vocab=12, large_vocab=256, description="the CPU suite's default"),
        Profile("gpu", 1e-6, 0.99, 0.01, vocab=32, large_vocab=32000, boundary_vocab=3000, description="full power on one GPU"),
        Profile("nightly", 1e-6, 0.99, 0.005, vocab=64, large_vocab=152064, boundary_vocab=3000, description="nightly, GPU"),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile: unknown profile {name!r} (known: {', '.join(PROFILES)})") from None
