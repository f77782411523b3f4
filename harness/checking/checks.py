"""Which checks apply to a scenario, how many trials each needs, and their evaluation.

Every check is planned before any sampling: its cells, pooling and trial count come from
the exact law and the profile's (alpha, power, tv). ``evaluate`` turns a template's tally
into an ``Outcome`` (statistic, p-value, detectable TV, effect size). Exact checks decide
their verdict there; statistical checks get theirs once, from the run's family rule (Holm).

Checks
------
structure          exact. Every trial emits 1..d+1 in-vocabulary ids whose prefix equals
                   its drafts (placeholders and everything after them never accepted).
                   The only check for templates with degenerate (NaN or all-masked) rows.
outcome-law        Chi-square test of (n accepted, emitted token) against the exact law: fixed
                   drafts, or the mixture over drafts for block verification and FLy (whose
                   steps are not conditionally independent: no position-law). Exact when
                   the law is a point mass (greedy; typical acceptance short of the bonus).
position-law       drafts drawn per trial, chain methods: product-multinomial chi-square, one
                   multinomial per step over the trials that reach it, cells (accepted
                   draft y | rejected, emitted y). Together these are the whole output law.
acceptance-length  Chi-square test of the number of accepted drafts (synthetic: the closed form
                   P(N >= i+1) = r_i; lossless: the exact law's marginal).
acceptance-rate[j] synthetic only: exact binomial test of step j's conditional acceptance.
draft-law          drafts the backend's own drafter drew (``draft_mode`` "engine"): product-
                   multinomial chi-square, one multinomial per step, against q (exact for a
                   greedy drafter's argmax).

With ``Profile.sequential`` (``--sequential``) the one-multinomial, non-exact checks (outcome-law,
acceptance-length) are the combined design (``harness.checking.sequential.combined_check``):
their sequential part is monitored while sampling, and a scenario stops early when it rejects.
The other checks of a stopped scenario then report only what holds at the shorter count
(``_when_stopped``).
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from harness.checking import pooling, power, stats
from harness.evidence.records import AcceptanceByStep, AcceptanceStep, Kind
from harness.sampling.tally import TemplateTally
from harness.scenarios.materialize import Template
from harness.scenarios.profiles import Profile
from harness.scenarios.scenario import Scenario
from reference import fly, laws, typical
from reference import synthetic as synth
from reference.methods import Method

MAX_POOLING_ROUNDS = 20
BACKGROUND_POOLING_CELLS = 1 << 14  # above this, cells are pooled while the backend samples
_POOLER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pooling")  # NumPy's sort runs without the GIL


@dataclass
class Outcome:
    """What evaluating one check on one tally measured. An exact check's verdict is
    ``deviated`` (any deviation from the law fails it); a statistical check has none here:
    the run's family rule (``harness.checking.family``) decides it from ``p_value``."""

    kind: Kind  # EXACT, GOF, BINOMIAL or SKIPPED
    deviated: bool | None  # exact checks: whether any trial left the law; None otherwise
    statistic: float | None
    df: int | None
    p_value: float | None
    alpha: float
    trials: int
    detectable_tv: float
    tv_estimate: float | None
    tv_ci: tuple[float, float] | None
    message: str
    cells: list | None = None  # [(label, observed, expected)] for the largest pooled cells
    acceptance: AcceptanceByStep | None = None  # acceptance-length checks: per-step chart data


@dataclass
class Check:
    name: str
    template: int
    design_trials: int
    evaluate: object  # (TemplateTally, numpy Generator) -> Outcome
    detectable: object = None  # trials -> smallest TV detected at that many trials (before sampling)
    cells: object = None  # tally -> (observed, expected) counts over the check's cells (law checks)
    kind: str = "statistical"  # "exact" (any deviation fails), "statistical" (a level alpha test) or "skipped"
    monitor: object = None  # sequential.Monitor: the combined design's part monitored while sampling (Profile.sequential)

    def design_detectable(self, trials: int) -> float:
        return self.detectable(trials) if self.detectable else float("nan")


@dataclass(frozen=True)
class PooledCells:
    """The bins of a design and what evaluating against them reuses: ``index = bins + 1``
    (0 for impossible cells: one ``bincount`` pools a tally and counts the impossible
    observations) and the designed probabilities summed per bin."""

    bins: np.ndarray
    index: np.ndarray
    probs: np.ndarray

    @classmethod
    def of(cls, bins: np.ndarray, probs: np.ndarray) -> "PooledCells":
        index = bins + 1
        return cls(bins, index, np.bincount(index, weights=probs, minlength=int(index.max(initial=0)) + 1)[1:])

    def pool(self, observed: np.ndarray) -> tuple[np.ndarray, int]:
        """(observed counts per bin, observations in impossible cells)."""
        counts = np.bincount(self.index, weights=observed, minlength=self.probs.size + 1)
        return counts[1:], int(counts[0])


def design_pooling(expected_probs: np.ndarray, profile: Profile, steps: float = 1.0, segments: int = 1):
    """(trials, pooled, df) for a chi-square test: pool at the trial count that the pooled df
    needs. ``pooled`` is a function returning the ``PooledCells``.

    Above ``BACKGROUND_POOLING_CELLS`` possible cells (large vocabularies: 10^5-10^6) the
    design takes the largest df the capped bins can have, ``MAX_BINS - segments``: the
    trial count is known without sorting the cells, so sampling starts at once while a
    background thread sorts and pools them at that count. The test's df is then the pooled
    one, at most this: the stated power is a lower bound (pooled bins reach the cap there)."""
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    possible = int((probs > 0).sum())
    if possible > BACKGROUND_POOLING_CELLS:
        df = max(pooling.MAX_BINS - segments, 1)
        n = power.trials_for_tv(profile.alpha, profile.power, profile.tv, df, steps)
        return n, _POOLER.submit(lambda: PooledCells.of(pooling.Pooling(probs).capped(pooling.MAX_BINS, n), probs)).result, df
    n = power.trials_for_tv(profile.alpha, profile.power, profile.tv, max(possible - segments, 1), steps)
    cells = pooling.Pooling(probs)  # sorted once for every round
    for _ in range(MAX_POOLING_ROUNDS):
        threshold = cells.cap(pooling.MAX_BINS, n)
        df = max(cells.count(threshold) - segments, 1)
        needed = power.trials_for_tv(profile.alpha, profile.power, profile.tv, df, steps)
        if needed >= n:
            break
        n = needed
    pooled = PooledCells.of(cells.bins(threshold), probs)
    return needed, lambda: pooled, df


def _cells_summary(label, observed, expected, bins, limit=12, pooled=None, impossible=None):
    """The ``limit`` most expected pooled cells, named by ``label(cell)`` (a function: large
    vocabularies have 10^6 cells, of which a dozen are named). ``pooled``: (observed,
    expected) per pooled cell, and ``impossible`` observations, when the test already summed them."""
    o, e = pooled or (pooling.pooled(observed, bins), pooling.pooled(expected, bins))
    order = np.argsort(-e, kind="stable")
    shown = order[:limit]
    flag = np.zeros(e.size + 1, dtype=bool)  # by bin; the extra last entry is bin -1 (impossible cells)
    flag[shown] = True
    in_shown = np.flatnonzero(flag[bins])  # one pass over the cells, not one per shown bin
    rows = []
    for b in shown:
        members = in_shown[bins[in_shown] == b]
        name = " + ".join(label(int(c)) for c in members[:3]) + (" + …" if members.size > 3 else "")
        rows.append((name, float(o[b]), float(e[b])))
    if order.size > limit:
        rest = order[limit:]
        rows.append((f"all {rest.size} other cells", float(o[rest].sum()), float(e[rest].sum())))
    if impossible is None:
        impossible = float(np.asarray(observed).ravel()[bins < 0].sum())
    if impossible:
        rows.append(("impossible cells", impossible, 0.0))
    return rows


def gof_check(name, template, probs, label, profile, source, segments=None, reach=None) -> Check:
    """A chi-square check over ``probs`` cells (conditional per segment when ``segments``)."""
    probs = np.asarray(probs, dtype=np.float64).ravel()
    seg = np.zeros(probs.size, dtype=np.int64) if segments is None else segments.ravel()
    steps = 1.0 if reach is None else float(reach.sum())
    possible = probs > 0
    n_seg = int(np.unique(seg[possible]).size) if segments is not None else int(possible.any())
    exact = int(possible.sum()) <= n_seg  # every segment is a point mass
    if profile.sequential and segments is None and reach is None and not exact:
        from harness.checking.sequential import combined_check  # imported here: sequential imports this module

        return combined_check(name, template, probs, label, profile, source)
    design, get_pooled, df = design_pooling(probs if reach is None else probs * reach[seg], profile, steps, n_seg)
    if exact:
        design = power.exact_trials_for_rate(profile.power, profile.tv)

    def cells(tally: TemplateTally):
        observed = np.asarray(source(tally), dtype=np.float64).ravel()
        sizes = np.bincount(seg, weights=observed, minlength=int(seg.max(initial=0)) + 1)
        return observed, probs * sizes[seg]

    def evaluate(tally: TemplateTally, rng) -> Outcome:
        if segments is None and reach is None and not exact:
            return evaluate_one_multinomial(tally, rng)
        observed, expected = cells(tally)
        bins = get_pooled().bins
        trials = int(observed.sum() if reach is None else observed[seg == 0].sum())  # trials reaching step 0
        if exact:
            bad = int(observed[probs == 0].sum())
            return Outcome(
                Kind.EXACT, bad > 0, float(bad), None, 1.0 if bad == 0 else 0.0, 0.0, trials,
                power.exact_detectable_rate(profile.power, trials),
                bad / max(trials, 1), None,
                f"{bad} of {trials} trials left the deterministic outcome" if bad else "every trial gave the deterministic outcome",
                _cells_summary(label, observed, expected, bins),
            )  # fmt: skip
        r = stats.chi_square_test(observed, expected, bins, seg, rng)
        return gof_verdict(r, trials, _cells_summary(label, observed, expected, bins, pooled=r.pooled))

    def evaluate_one_multinomial(tally: TemplateTally, rng) -> Outcome:
        """``evaluate`` without a per-cell expected array: the tally pooled by one ``bincount``
        and tested against the design's pooled probabilities (10^6 cells at large V)."""
        observed = np.asarray(source(tally)).ravel()
        pooled = get_pooled()
        o, impossible = pooled.pool(observed)
        trials = int(observed.sum())
        r = stats.chi_square_pooled(o, pooled.probs * trials, impossible, rng)
        return gof_verdict(r, trials, _cells_summary(label, None, None, pooled.bins, pooled=r.pooled, impossible=impossible))

    def gof_verdict(r: stats.GofResult, trials: int, cells_summary) -> Outcome:
        detect = power.detectable_tv(profile.alpha, profile.power, df, trials, steps)
        msg = f"X2={r.statistic:.2f} df={r.df} p={r.p_value:.3g}"
        if r.impossible:
            msg = f"{r.impossible} observation(s) in zero-probability cells; " + msg
        return Outcome(
            Kind.GOF, None, r.statistic, r.df, r.p_value, profile.alpha, trials,
            detect, r.tv_estimate, r.tv_ci, msg, cells_summary,
        )  # fmt: skip

    def detectable(n):
        return power.exact_detectable_rate(profile.power, n) if exact else power.detectable_tv(profile.alpha, profile.power, df, n, steps)

    return Check(name, template, design, evaluate, detectable, cells, "exact" if exact else "statistical")


def _draft_check(i, drafter_law, profile) -> Check:
    """draft-law: the drafts the backend's own drafter drew, step by step, against the law it
    must draw from (product multinomial, one per step; exact for an argmax drafter)."""
    d, vocab = drafter_law.shape
    seg = np.repeat(np.arange(d), vocab).reshape(d, vocab)
    return gof_check(
        "draft-law", i, drafter_law, lambda cell: f"step {cell // vocab} draft={cell % vocab}", profile, _drafted, seg, np.ones(d)
    )


def _drafted(tally: TemplateTally) -> np.ndarray:
    return tally.drafted if tally.drafted is not None else np.zeros((tally.effective_drafts, tally.vocab), dtype=np.int64)


def _step_label(d, vocab):
    def label(cell):
        j, a, y = cell // (2 * vocab), cell // vocab % 2, cell % vocab
        return f"step {j} {'acc' if a == 0 else ('bonus' if j == d else 'rej')} y={y}"

    return label


def _outcome_label(vocab):
    return lambda cell: f"n={cell // vocab},y={cell % vocab}"


def plan(scenario: Scenario, templates: list[Template], profile: Profile) -> list[Check]:
    """All checks for a scenario, with their design trial counts. Laws are computed here."""
    checks = []
    for i, t in enumerate(templates):
        d_eff = t.effective_drafts
        vocab = t.target_logits.shape[1]
        checks.append(_structure_check(i, profile))
        if t.spec.degenerate:
            continue  # NaN / all-masked rows: engines owe only well-formed, in-vocabulary output
        target = t.target_probs()[: d_eff + 1]
        visible = t.visible_draft_probs()[:d_eff] if scenario.draft_probs else None
        rates = t.rates[:d_eff] if t.method is Method.SYNTHETIC else None
        if t.method is Method.SYNTHETIC:
            r = synth.conditional_to_unconditional(rates)
            length = synth.acceptance_length_law(r)
            checks.append(_length_check(i, length, profile))
            reach = np.concatenate([[1.0], r])
            for j in range(d_eff):
                if reach[j] > 0:
                    checks.append(_rate_check(i, j, float(rates[j]), float(reach[j]), profile))
            continue
        if t.method is Method.FLY:  # not a chain of per-step laws: checked as (accepted count, token)
            law = _fly_law(scenario, t, target, visible)
            checks.append(gof_check("outcome-law", i, law, _outcome_label(vocab), profile, _outcomes))
        elif t.drafts is not None and t.method is Method.TYPICAL:  # a point mass but for the bonus token
            law = typical.fixed_draft_law(target, t.drafts[:d_eff], *scenario.typical_params)
            checks.append(gof_check("outcome-law", i, law, _outcome_label(vocab), profile, _outcomes))
        elif t.drafts is not None:
            law = laws.fixed_draft_law(t.method, target, visible, t.drafts[:d_eff], rates)
            checks.append(gof_check("outcome-law", i, law, _outcome_label(vocab), profile, _outcomes))
        elif t.method is Method.BLOCK:
            try:
                law = laws.sampled_draft_law(t.method, target, t.sampling_probs()[:d_eff], scenario.draft_probs)
            except ValueError as e:
                checks.append(_skipped("outcome-law", i, str(e)))
                continue
            checks.append(gof_check("outcome-law", i, law, _outcome_label(vocab), profile, _outcomes))
        else:
            if t.method is Method.TYPICAL:
                steps = typical.position_laws(target, t.sampling_probs()[:d_eff], *scenario.typical_params)
            else:
                steps = laws.position_laws(t.method, target, t.sampling_probs()[:d_eff], scenario.draft_probs, rates)
            law = np.zeros((d_eff + 1, vocab))
            reach = np.cumprod(np.concatenate([[1.0], steps[:d_eff, 0].sum(axis=-1)]))
            for j in range(d_eff):
                law[j] = reach[j] * steps[j, 1]
            law[d_eff] = reach[d_eff] * target[d_eff]
            seg = np.repeat(np.arange(d_eff + 1), 2 * vocab).reshape(d_eff + 1, 2, vocab)
            checks.append(gof_check("position-law", i, steps, _step_label(d_eff, vocab), profile, _steps, seg, reach))
        if d_eff > 0:
            checks.append(_length_check(i, law.sum(axis=-1), profile))
        if t.draft_sampling is not None and d_eff > 0:
            checks.append(_draft_check(i, t.sampling_probs()[:d_eff], profile))
    return [_when_stopped(c if c.name == "structure" else _needs_trials(c)) for c in checks]


def _fly_law(scenario: Scenario, t: Template, target, visible) -> np.ndarray:
    """FLy's exact ``[d+1, V]`` outcome law, for fixed or per-trial drafts (``reference.fly``)."""
    d = t.effective_drafts
    gate = t.fly_gate_probs()  # a greedy request's entropy gate: its rows at T = 1
    gate = None if gate is None else gate[: d + 1]
    if t.drafts is not None:
        return fly.fixed_draft_law(target, visible, t.drafts[:d], *scenario.fly_params, greedy_rows=gate)
    return fly.sampled_draft_law(target, t.sampling_probs()[:d], *scenario.fly_params, scenario.draft_probs, gate)


def _needs_trials(check: Check) -> Check:
    """``check`` not evaluated (never passed) when no valid trial reached it: a test of zero
    observations has p = 1 and would pass whatever the backend emitted."""
    inner = check.evaluate

    def evaluate(tally: TemplateTally, rng) -> Outcome:
        outcome = inner(tally, rng)
        if outcome.kind is Kind.SKIPPED or outcome.trials > 0:
            return outcome
        why = "not evaluated: no valid trial reached this check"
        if tally.violations:
            why += f" ({tally.violations} of {tally.trials} trials malformed, see structure)"
        return Outcome(Kind.SKIPPED, None, None, None, None, 0.0, 0, float("nan"), None, None, why)

    check.evaluate = evaluate
    return check


def _when_stopped(check: Check) -> Check:
    """``check`` in a scenario whose sampling a sequential test stopped early (``tally.stopped``),
    at a trial count the data chose. A combined check (``monitor``) evaluates that itself. An
    exact check's deviation is certain at any count, and its pass holds from its design count
    on (no deviation in the first n >= design trials means none in the first design ones);
    short of that no pass is claimed. A fixed-sample test (chi-square, binomial) is valid only
    at a count fixed before sampling: not evaluated. Either way, never a pass without power."""
    if check.monitor is not None or check.kind == "skipped":
        return check
    inner = check.evaluate

    def evaluate(tally: TemplateTally, rng) -> Outcome:
        if not tally.stopped:
            return inner(tally, rng)
        where = f"sampling stopped early at {tally.trials:,} trials, when a sequential test rejected"
        if check.kind == "exact":
            outcome = inner(tally, rng)
            if outcome.deviated or (outcome.deviated is not None and outcome.trials >= check.design_trials):
                outcome.message += f" ({where})"
                return outcome
            why = f"not evaluated: {where}, short of this exact check's design count {check.design_trials:,} (no deviation in {outcome.trials:,} trials)"
        else:
            why = f"not evaluated: {where}; this fixed-sample test is valid only at a trial count fixed before sampling"
        return Outcome(Kind.SKIPPED, None, None, None, None, 0.0, tally.trials, float("nan"), None, None, why)

    check.evaluate = evaluate
    return check


def _structure_check(i, profile) -> Check:
    design = power.exact_trials_for_rate(profile.power, profile.tv)

    def evaluate(tally: TemplateTally, rng) -> Outcome:
        bad, n = tally.violations, tally.trials
        msg = "every trial well-formed" if not bad else f"{bad} of {n} trials malformed; first: {tally.example}"
        return Outcome(
            Kind.EXACT,
            bad > 0,
            float(bad),
            None,
            1.0 if not bad else 0.0,
            0.0,
            n,
            power.exact_detectable_rate(profile.power, n),
            bad / max(n, 1),
            None,
            msg,
        )

    return Check("structure", i, design, evaluate, lambda n: power.exact_detectable_rate(profile.power, n), kind="exact")


def _length_check(i, length_law, profile) -> Check:
    check = gof_check("acceptance-length", i, length_law, lambda cell: f"accepted={cell}", profile, _lengths)
    inner = check.evaluate

    def evaluate(tally: TemplateTally, rng) -> Outcome:
        outcome = inner(tally, rng)
        outcome.acceptance = acceptance_by_step(_lengths(tally), length_law)
        return outcome

    check.evaluate = evaluate
    return check


def acceptance_by_step(length_counts, length_law) -> AcceptanceByStep:
    """Per-step conditional acceptance, observed (with a 95% Wilson interval) and exact:
    ``P(N >= j+1 | N >= j)`` from the accepted-count law."""
    counts = np.asarray(length_counts, dtype=np.float64)
    law = np.asarray(length_law, dtype=np.float64)
    reached = counts[::-1].cumsum()[::-1]  # trials with N >= j
    tail = law[::-1].cumsum()[::-1]
    steps = []
    for j in range(law.size - 1):
        n, k = int(reached[j]), int(reached[j + 1])
        if tail[j] <= 0 or n == 0:
            continue
        lo, hi = stats.wilson_interval(k, n)
        steps.append(AcceptanceStep(j, n, k, k / n, lo, hi, float(tail[j + 1] / tail[j])))
    return AcceptanceByStep(tuple(counts.tolist()), tuple(law.tolist()), tuple(steps))


def _rate_check(i, j, rate, reach, profile) -> Check:
    needed = power.binomial_trials(profile.alpha, profile.power, rate, profile.tv)
    design = power.trials_to_reach(needed, reach, profile.alpha)

    def evaluate(tally: TemplateTally, rng) -> Outcome:
        n, k = int(tally.reached()[j]), int(tally.accepted()[j])
        p = stats.binomial_test(k, n, rate)
        detect = power.binomial_detectable(profile.alpha, profile.power, rate, n)
        observed = k / n if n else float("nan")
        msg = f"accepted {k}/{n} = {observed:.5f} vs closed form {rate:.5f}; p={p:.3g}"
        return Outcome(Kind.BINOMIAL, None, float(k), None, p, profile.alpha, n, detect, abs(observed - rate) if n else None, None, msg)

    def detectable(n):  # at the expected number of trials reaching step j, less its 1 - alpha shortfall
        z = float(norm.isf(profile.alpha))
        reached = n * reach - z * (n * reach * (1 - reach)) ** 0.5
        return power.binomial_detectable(profile.alpha, profile.power, rate, int(max(reached, 0)))

    return Check(f"acceptance-rate[{j}]", i, design, evaluate, detectable)


def _skipped(name, i, reason) -> Check:
    def evaluate(tally, rng) -> Outcome:
        return Outcome(Kind.SKIPPED, None, None, None, None, 0.0, tally.trials, float("nan"), None, None, reason)

    return Check(name, i, 0, evaluate, kind="skipped")


def _outcomes(tally: TemplateTally) -> np.ndarray:
    return tally.outcome


def _steps(tally: TemplateTally) -> np.ndarray:
    return tally.steps


def _lengths(tally: TemplateTally) -> np.ndarray:
    return tally.outcome.sum(axis=-1)
