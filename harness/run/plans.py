"""Planning: each scenario's templates, checks, trial count and stop rule (its monitored
checks, ``Profile.sequential``), computed in a background thread in sampling order (the
costliest first) while the backends already sample."""

import threading
import time

from harness.checking import checks as checks_mod
from harness.checking.sequential import stop_rule
from harness.scenarios.materialize import materialize
from harness.scenarios.profiles import Profile
from harness.scenarios.scenario import Scenario


def planned_trials(scenario: Scenario, profile: Profile) -> tuple[list, list[checks_mod.Check], int]:
    templates = materialize(scenario)
    planned = checks_mod.plan(scenario, templates, profile)
    return templates, planned, max(c.design_trials for c in planned)


def sampling_order(scenarios: list[Scenario]) -> list[int]:
    """The scenarios' indices, the costliest per trial first (vocabulary x rows per trial;
    catalog order among equals). A stream then queues the cheap scenarios, whose host work
    outweighs their device work, while the device samples the large ones; on several GPUs
    the round robin over this order spreads the large ones."""

    def cost(i: int) -> int:
        s = scenarios[i]
        return s.vocab_size * sum(r.num_drafts + 1 for r in s.requests)

    return sorted(range(len(scenarios)), key=lambda i: -cost(i))


class Plans:
    """Every scenario's (checks, trials), planned by a background thread in ``order`` (the
    sampling order; default catalog order), once per run for every backend: sampling starts
    with the first plan, not after the last."""

    def __init__(self, scenarios: list[Scenario], profile: Profile, order: list[int] | None = None):
        self.seconds = 0.0  # spent planning (while other threads run, so a little more than alone)
        self._scenarios = scenarios
        self._plans: list = [None] * len(scenarios)
        self._done = [threading.Event() for _ in scenarios]
        self._error: BaseException | None = None
        self._cancelled = threading.Event()
        order = range(len(scenarios)) if order is None else order
        self._thread = threading.Thread(target=self._plan_all, args=(scenarios, profile, order), name="planning", daemon=True)
        self._thread.start()

    def _plan_all(self, scenarios, profile, order) -> None:
        try:
            for i in order:
                if self._cancelled.is_set():
                    break
                t0 = time.perf_counter()
                self._plans[i] = planned_trials(scenarios[i], profile)[1:]  # the templates are not kept
                self.seconds += time.perf_counter() - t0
                self._done[i].set()
        except BaseException as e:  # raised to whoever asks for this plan or a later one
            self._error = e
        finally:
            for done in self._done:  # nobody waits forever on a plan that will not come
                done.set()

    def get(self, i: int) -> tuple[list[checks_mod.Check], int]:
        self._done[i].wait()
        if self._plans[i] is None:
            raise self._error or RuntimeError("planning was cancelled")
        return self._plans[i]

    def work(self, i: int) -> tuple | None:
        """(scenario, trials, stop rule or None) to sample, or None when planning failed or was cancelled."""
        self._done[i].wait()
        if self._plans[i] is None:
            return None
        planned, count = self._plans[i]
        return self._scenarios[i], count, stop_rule(planned)

    def wait(self) -> None:
        self._thread.join()

    def cancel(self) -> None:
        self._cancelled.set()
