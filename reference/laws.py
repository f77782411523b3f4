"""Exact output laws of every method, in float64.

One request, one template: ``target`` is ``[d+1, V]`` (rows 0..d-1 verify drafts, row d
is the bonus row), ``draft`` ``[d, V]`` the draft rows (``None``: the verifier gets no
draft probabilities), ``rates`` ``[d]`` synthetic *conditional* acceptance rates. All
probabilities are after temperature (``reference.distributions.softmax_rows``).

The outcome of a request is ``(n, y)``: ``n`` drafts accepted, then token ``y`` emitted
(a rejection's replacement or the bonus). For fixed drafts the outcome law is exact;
for drafts drawn from a proposal it is the mixture over all drafts. The laws reuse
``reference.rules``, the same rules the sampler draws from; the sampler is checked
against these laws statistically, and the laws against losslessness exactly
(``completed_sequence_law`` equals the product of target rows). FLy's law
(``reference.fly``) needs its parameters and is refused here; typical acceptance's is
``reference.typical``'s.
"""

import itertools

import numpy as np

from reference import rules
from reference.distributions import check_probs
from reference.methods import Method

MAX_ENUMERATED_DRAFTS = 200_000  # draft sequences a block law may enumerate


def _normalize(w: np.ndarray) -> np.ndarray:
    return w / w.sum(axis=-1, keepdims=True)


def _check(method, target, draft, rates):
    method = Method(method)
    if method is Method.FLY:  # a rule over the whole chain: the standard per-step law would pass silently
        raise ValueError(
            "method: FLy's law depends on its window, entropy threshold and top-k, and is not a chain of per-step laws: "
            "use reference.fly.fixed_draft_law / sampled_draft_law"
        )
    target = check_probs(target, "target")
    if target.ndim != 2:
        raise ValueError(f"target: expected [num_drafts + 1, V], got shape {target.shape}")
    d = target.shape[0] - 1
    if draft is not None:
        draft = check_probs(draft, "draft")
        if draft.shape != (d, target.shape[1]):
            raise ValueError(f"draft: expected shape {(d, target.shape[1])}, got {draft.shape}")
    if method is Method.SYNTHETIC:
        if rates is None or np.shape(rates) != (d,):
            raise ValueError(f"rates: synthetic needs {d} conditional rates, got {rates!r}")
        rates = np.asarray(rates, dtype=np.float64)
        if not np.all((rates >= 0) & (rates <= 1)):
            raise ValueError(f"rates: conditional rates must lie in [0, 1], got {rates}")
    return method, target, draft, rates


def _check_drafts(drafts, d, vocab):
    drafts = np.asarray(drafts, dtype=np.int64)
    if drafts.shape != (d,):
        raise ValueError(f"drafts: expected {d} draft ids, got shape {drafts.shape}")
    if ((drafts < -1) | (drafts >= vocab)).any():
        raise ValueError(f"drafts: ids must be -1 (placeholder) or in [0, {vocab}), got {drafts}")
    holes = np.flatnonzero(drafts < 0)
    return drafts, (int(holes[0]) if holes.size else d)


def _step_acceptance(method, target_row, draft_row, x, rate):
    """Acceptance probability of draft ``x`` (scalar or array) at one chain step."""
    if method is Method.SYNTHETIC:
        return np.full(np.shape(x), rate, dtype=np.float64)
    if method is Method.STRICT:
        draft_row = None
    xs = np.atleast_1d(x)
    a = rules.acceptance_probability(target_row[None], None if draft_row is None else draft_row[None], xs[None])
    return a[0] if np.ndim(x) else a[0, 0]


def _step_rejection(method, target_row, draft_row, x):
    """Normalized law of the token emitted after rejecting draft ``x`` at one step."""
    if method is Method.STRICT:
        draft_row = None
    w = rules.residual_weights(target_row[None], None if draft_row is None else draft_row[None], [x])
    return _normalize(w[0])


def fixed_draft_law(method, target, draft, drafts, rates=None) -> np.ndarray:
    """``P(n accepted, token y)`` as a ``[d+1, V]`` array, for fixed draft ids.

    A placeholder (-1) ends the drafts at its step: the row it sat on acts as the bonus row,
    and later rows of the law are 0.

    Parameters
    ----------
    method : Method or int
        The verification method (a ``reference.methods.Method`` or its integer code).
    target : array_like of float, shape (d + 1, V)
        Target probabilities after temperature: rows ``0 .. d - 1`` verify the drafts, row
        ``d`` is the bonus row. Each row finite, non-negative and summing to 1.
    draft : array_like of float, shape (d, V), or None
        Draft probabilities after temperature, one row per draft, as the verifier sees
        them; None verifies with no draft probabilities (point mass). ``Method.STRICT``
        never reads them.
    drafts : array_like of int, shape (d,)
        The draft ids, each in ``[0, V)`` or the placeholder -1.
    rates : array_like of float, shape (d,), or None, default None
        Synthetic *conditional* acceptance rates in ``[0, 1]``, one per step; required for
        ``Method.SYNTHETIC``, not read by the other methods.

    Returns
    -------
    ndarray of float64, shape (d + 1, V)
        ``law[n, y]``: the probability that ``n`` drafts are accepted and token ``y`` is
        emitted after them (a rejection's replacement, or the bonus when ``n`` equals the
        drafts before the first placeholder). Sums to 1.

    Raises
    ------
    ValueError
        If ``method`` is no ``Method`` code; ``target`` is not 2-D probability rows;
        ``draft`` is not probability rows of shape ``(d, V)``; or, for ``Method.SYNTHETIC``,
        ``rates`` is missing, not of shape ``(d,)`` or outside ``[0, 1]``.
    ValueError
        If ``drafts`` is not of shape ``(d,)`` or holds an id outside ``[0, V)`` other than -1.
    """
    method, target, draft, rates = _check(method, target, draft, rates)
    d, vocab = target.shape[0] - 1, target.shape[1]
    drafts, d_eff = _check_drafts(drafts, d, vocab)
    if method is Method.BLOCK:
        law = np.zeros_like(target)
        law[: d_eff + 1] = _block_laws(target[: d_eff + 1], None if draft is None else draft[:d_eff], drafts[None, :d_eff])[0]
        return law
    law = np.zeros_like(target)
    reach = 1.0
    for i in range(d_eff):
        q = None if draft is None else draft[i]
        a = float(_step_acceptance(method, target[i], q, drafts[i], None if rates is None else rates[i]))
        law[i] = reach * (1.0 - a) * _step_rejection(method, target[i], q, drafts[i])
        reach *= a
    law[d_eff] = reach * target[d_eff]
    return law


def _block_laws(target, draft, drafts) -> np.ndarray:
    """Block verification's ``[m, d+1, V]`` outcome laws for ``m`` fixed draft sequences."""
    m, d = drafts.shape
    vocab = target.shape[1]
    rows = np.arange(d)
    t_x = target[rows, drafts] if d else np.zeros((m, 0))
    q_x = np.ones((m, d)) if draft is None else draft[rows, drafts]
    rho = rules.block_running_ratios(t_x, q_x)
    residual = np.empty((m, d, vocab))
    for i in range(d):
        q_row = draft[i][None] if draft is not None else np.eye(vocab)[drafts[:, i]]
        residual[:, i] = rules.block_residual(rho[:, i], target[i][None], q_row)
    h = rules.block_thresholds(rho, residual.sum(axis=-1))
    # P(tau = i) = h_i * prod_{j > i} (1 - h_j), with h_0 = 1.
    tail = np.ones((m, d + 1))
    for i in range(d - 1, -1, -1):
        tail[:, i] = tail[:, i + 1] * (1.0 - h[:, i])
    p_stop = tail.copy()
    p_stop[:, 1:] *= h
    emit = np.empty((m, d + 1, vocab))
    emit[:, d] = target[d]
    for i in range(d):
        mass = residual[:, i].sum(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            emit[:, i] = np.where(mass > 0, residual[:, i] / mass, target[i])
    return p_stop[..., None] * emit


def _proposal_sequences(proposal: np.ndarray):
    """All draft sequences in the proposal's support, with their probabilities."""
    supports = [np.flatnonzero(row > 0) for row in proposal]
    size = int(np.prod([s.size for s in supports], dtype=np.float64))
    if size > MAX_ENUMERATED_DRAFTS:
        raise ValueError(
            f"proposal: {size} draft sequences exceed the enumeration limit "
            f"({MAX_ENUMERATED_DRAFTS}); use fixed drafts or a smaller vocabulary"
        )
    seqs = np.array(list(itertools.product(*supports)), dtype=np.int64).reshape(size, len(supports))
    weights = np.prod(proposal[np.arange(len(supports)), seqs], axis=-1) if len(supports) else np.ones(1)
    return seqs, weights


def position_laws(method, target, proposal, draft_visible=True, rates=None) -> np.ndarray:
    """Per-step laws for drafts drawn from ``proposal`` (chain methods, not block).

    Returns ``[d+1, 2, V]``: for step ``j``, conditional on all earlier drafts accepted,
    ``[j, 0, y]`` = P(draft y drawn and accepted), ``[j, 1, y]`` = P(rejected, token y
    emitted). Step ``d`` is the bonus: ``[d, 1] = target[d]``. ``draft_visible=False``
    verifies with no draft probabilities although drafts come from ``proposal``.

    Parameters
    ----------
    method : Method or int
        The verification method (a ``reference.methods.Method`` or its integer code), not
        ``Method.BLOCK``.
    target : array_like of float, shape (d + 1, V)
        Target probabilities after temperature: rows ``0 .. d - 1`` verify the drafts, row
        ``d`` is the bonus row. Each row finite, non-negative and summing to 1.
    proposal : array_like of float, shape (d, V)
        The law each step's draft is drawn from, independently per step, after temperature.
    draft_visible : bool, default True
        Whether the verifier sees ``proposal`` as its draft probabilities (``Method.STRICT``
        never reads them); False verifies with no draft probabilities (point mass).
    rates : array_like of float, shape (d,), or None, default None
        Synthetic *conditional* acceptance rates in ``[0, 1]``, one per step; required for
        ``Method.SYNTHETIC``, not read by the other methods.

    Returns
    -------
    ndarray of float64, shape (d + 1, 2, V)
        The per-step laws above; ``[d, 0]`` is 0. Each step ``j < d`` sums to 1 over its
        ``[j, :, :]``.

    Raises
    ------
    ValueError
        If ``method`` is ``Method.BLOCK`` (its acceptance is not per step).
    ValueError
        If ``method`` is no ``Method`` code; ``target`` is not 2-D probability rows;
        ``proposal`` is not probability rows of shape ``(d, V)``; or, for ``Method.SYNTHETIC``,
        ``rates`` is missing, not of shape ``(d,)`` or outside ``[0, 1]``.
    """
    method, target, proposal, rates = _check(method, target, proposal, rates)
    if method is Method.BLOCK:
        raise ValueError("method: block verification has no per-step law; use sampled_draft_law")
    d, vocab = target.shape[0] - 1, target.shape[1]
    out = np.zeros((d + 1, 2, vocab))
    xs = np.arange(vocab)
    for j in range(d):
        p, q = target[j], proposal[j]
        seen = q if (draft_visible and method is not Method.STRICT) else None
        a = _step_acceptance(method, p, seen, xs, None if rates is None else rates[j])
        out[j, 0] = q * a
        w = q * (1.0 - a)  # P(draft x drawn and rejected)
        if seen is not None:
            out[j, 1] = w.sum() * _step_rejection(method, p, seen, 0)
        else:
            # Emission after rejecting x is target without x, renormalized (or x itself
            # when target(x) = 1, the empty-residual fallback).
            sure = p >= 1.0
            share = np.where(sure, 0.0, w / np.where(sure, 1.0, 1.0 - p))
            out[j, 1] = p * (share.sum() - share) + np.where(sure, w, 0.0)
    out[d, 1] = target[d]
    return out


def sampled_draft_law(method, target, proposal, draft_visible=True, rates=None) -> np.ndarray:
    """``P(n accepted, token y)`` ``[d+1, V]`` when drafts are drawn from ``proposal``.

    Chain methods chain ``position_laws``; block verification mixes the fixed-draft block
    law of every draft sequence in the proposal's support, weighted by its probability (at
    most ``MAX_ENUMERATED_DRAFTS`` sequences).

    Parameters
    ----------
    method : Method or int
        The verification method (a ``reference.methods.Method`` or its integer code).
    target : array_like of float, shape (d + 1, V)
        Target probabilities after temperature: rows ``0 .. d - 1`` verify the drafts, row
        ``d`` is the bonus row. Each row finite, non-negative and summing to 1.
    proposal : array_like of float, shape (d, V)
        The law each step's draft is drawn from, independently per step, after temperature.
    draft_visible : bool, default True
        Whether the verifier sees ``proposal`` as its draft probabilities (``Method.STRICT``
        never reads them); False verifies with no draft probabilities (point mass).
    rates : array_like of float, shape (d,), or None, default None
        Synthetic *conditional* acceptance rates in ``[0, 1]``, one per step; required for
        ``Method.SYNTHETIC``, not read by the other methods.

    Returns
    -------
    ndarray of float64, shape (d + 1, V)
        ``law[n, y]``: the probability that ``n`` drafts are accepted and token ``y`` is
        emitted after them (row ``d``: all accepted, then the bonus). Sums to 1.

    Raises
    ------
    ValueError
        If ``method`` is no ``Method`` code; ``target`` is not 2-D probability rows;
        ``proposal`` is not probability rows of shape ``(d, V)``; or, for ``Method.SYNTHETIC``,
        ``rates`` is missing, not of shape ``(d,)`` or outside ``[0, 1]``.
    ValueError
        For ``Method.BLOCK``, if the proposal's support holds more than
        ``MAX_ENUMERATED_DRAFTS`` draft sequences.
    """
    method, target, proposal, rates = _check(method, target, proposal, rates)
    d = target.shape[0] - 1
    if method is Method.BLOCK:
        seqs, weights = _proposal_sequences(proposal)
        laws = _block_laws(target, proposal if draft_visible else None, seqs)
        return np.tensordot(weights, laws, axes=1)
    steps = position_laws(method, target, proposal, draft_visible, rates)
    law = np.zeros_like(target)
    reach = 1.0
    for j in range(d):
        law[j] = reach * steps[j, 1]
        reach *= steps[j, 0].sum()
    law[d] = reach * target[d]
    return law


def acceptance_length_law(outcome_law: np.ndarray) -> np.ndarray:
    """``P(n accepted)`` for ``n = 0..d`` from an outcome law.

    Parameters
    ----------
    outcome_law : array_like of float, shape (d + 1, V)
        ``P(n accepted, token y)``, as ``fixed_draft_law`` or ``sampled_draft_law`` give it
        (leading axes, if any, are kept).

    Returns
    -------
    ndarray, shape (d + 1,)
        The law summed over the emitted token ``y`` (the last axis).
    """
    return np.asarray(outcome_law).sum(axis=-1)


def completed_sequence_law(method, target, proposal, draft_visible=True, rates=None) -> np.ndarray:
    """Joint law of the emitted tokens, positions past the output filled from the target rows.

    ``[V] * (d+1)`` array, by enumeration of the drafts (small cases). For a lossless
    method this equals the product of the target rows: every emitted token is
    target-distributed given its prefix.

    Parameters
    ----------
    method : Method or int
        The verification method (a ``reference.methods.Method`` or its integer code).
    target : array_like of float, shape (d + 1, V)
        Target probabilities after temperature: rows ``0 .. d - 1`` verify the drafts, row
        ``d`` is the bonus row. Each row finite, non-negative and summing to 1.
    proposal : array_like of float, shape (d, V)
        The law each step's draft is drawn from, independently per step, after temperature.
    draft_visible : bool, default True
        Whether the verifier sees ``proposal`` as its draft probabilities (``Method.STRICT``
        never reads them); False verifies with no draft probabilities (point mass).
    rates : array_like of float, shape (d,), or None, default None
        Synthetic *conditional* acceptance rates in ``[0, 1]``, one per step; required for
        ``Method.SYNTHETIC``, not read by the other methods.

    Returns
    -------
    ndarray of float64, shape (V,) * (d + 1)
        ``joint[y_0, ..., y_d]``: the probability that a request emits ``y_0 .. y_n`` (``n``
        accepted drafts, then its replacement or bonus token) and that independent draws
        from target rows ``n + 1 .. d`` give ``y_{n+1} .. y_d``, summed over ``n``. Sums to 1.

    Raises
    ------
    ValueError
        If ``method`` is no ``Method`` code; ``target`` is not 2-D probability rows;
        ``proposal`` is not probability rows of shape ``(d, V)``; or, for ``Method.SYNTHETIC``,
        ``rates`` is missing, not of shape ``(d,)`` or outside ``[0, 1]``.
    ValueError
        If the proposal's support holds more than ``MAX_ENUMERATED_DRAFTS`` draft sequences.
    """
    method, target, proposal, rates = _check(method, target, proposal, rates)
    d, vocab = target.shape[0] - 1, target.shape[1]
    seqs, weights = _proposal_sequences(proposal)
    joint = np.zeros((vocab,) * (d + 1))
    for x, w in zip(seqs, weights):
        law = fixed_draft_law(method, target, proposal if draft_visible else None, x, rates)
        for n in range(d + 1):
            block = law[n]
            for k in range(n + 1, d + 1):
                block = np.multiply.outer(block, target[k])
            joint[tuple(x[:n])] += w * block
    return joint
