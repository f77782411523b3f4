"""FLy (entropy-gated deferred verification) as vLLM 0.33.0 implements it, in V1 and Model
Runner V2 (``rejection_sample_method="fly"``): the rule on float64 rows and its exact laws.

Read from the vLLM 0.33.0 python tree (``vendor/vllm-0.33.0``):

* ``vllm/v1/spec_decode/fly.py::compute_fly_entropy``: ``H_k(p) = -sum p log p`` (natural
  log) over the ``min(k, V)`` largest probabilities of the *processed* target row, not
  renormalized, zero terms dropped (``top_probs > 0``). V1 takes it from
  ``softmax(target_logits, dtype=float32)`` (``vllm/v1/sample/rejection_sampler.py::
  rejection_sample``), MRV2 from the processed logits (``from_logits=True``,
  ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py::rejection_sample``): the same
  row. Greedy rows' logits are not divided by a temperature (V1: ``GREEDY_TEMPERATURE``
  replaced by 1 in ``apply_sampling_constraints``, none of it in an all-greedy batch; MRV2:
  ``_temperature_kernel`` returns early at T = 0), so a greedy row's entropy is that of
  ``softmax(logits)`` at T = 1.
* ``fly.py::apply_fly_random_acceptance_kernel`` (V1, sampled rows; the pre-pass before the
  unchanged ``rejection_random_sample_kernel``): position ``i`` of a request with ``n``
  draft slots (placeholders included) is *natively accepted* iff the draft is valid,
  ``q(x) > 0`` and ``p(x) / q(x) >= u_i`` (``q = 1`` without draft probabilities: the native
  kernel's own test). A native rejection is overridden (its uniform set to 0, which the native
  kernel then accepts) iff the draft is valid, ``q(x) > 0``, ``p(x) > 0``,
  ``i + W < n`` (a whole window fits), ``H_k(p_i) >= threshold`` (non-strict) and positions
  ``i + 1 .. i + W`` are all natively accepted with their own, unmodified uniforms.
* ``fly.py::apply_fly_greedy_acceptance_kernel`` (V1, greedy rows, before
  ``rejection_greedy_sample_kernel``): the same with "natively accepted" meaning
  ``x == argmax``, and ``p(x) > 0`` meaning the target logit of ``x`` is finite; no draft
  probability is read. An overridden position's argmax is replaced by the draft.
* ``rejection_sampler_utils.py::_rejection_kernel`` (MRV2, ``FLY_WINDOW_SIZE > 0``): the
  same rule, sequentially: a deferrable native rejection at ``i`` opens a pending window;
  only native acceptances confirm it (``i - pending == W`` commits ``accepted_length =
  i + 1``); a native rejection inside the window stops verification with ``accepted_length``
  at the pending position, whose target/draft log-sum-exps (and greedy argmax,
  ``rejected_argmax``) were frozen for the resample. Its native test is
  ``log p(x) > log u + log q(x)`` (strict; ``u`` never 0), deferrable iff valid and
  ``log p(x), log q(x) > -inf`` (greedy: the target logit finite). After a confirmed window
  verification goes on from ``i + W + 1`` with no window pending, so overrides chain. The two
  kernels accept the same positions given the same native decisions (V1's pre-pass decides
  each position alone, MRV2 in order; ``suites/test_fly.py`` checks every case up to five
  drafts), and their native tests differ only on a set of uniforms of probability 0.
* After the decisions nothing is FLy-specific: the first position neither natively
  accepted nor overridden emits the native recovered token (V1 ``sample_recovered_tokens``,
  MRV2 ``_resample_kernel``: ``max(p - q, 0)`` normalized, or ``p`` without the draft id when
  there are no draft probabilities; greedy: the argmax, V1's ``target_argmax`` untouched
  there, MRV2's ``rejected_argmax``), a placeholder's row acts as the bonus row (MRV2; V1's
  sampled rows draw a recovered token there, its known placeholder bug, ``suites/test_vllm.py``
  ``V1_PLACEHOLDER_RESIDUAL``, FLy or not), and when every draft passes the bonus follows.
* ``vllm/config/speculative.py``: ``fly_window_size`` ``>= 1`` (default ``min(6, K - 1)``
  for ``K = num_speculative_tokens``, and below ``K``), ``fly_entropy_threshold`` ``>= 0``
  (default 0.3), ``fly_entropy_top_k`` ``>= 1`` (default 3). ``RejectionSampler.__init__``
  (V1) refuses FLy on a CPU *device*; the function under it runs anywhere Triton does.

So the law of one request: with ``a_i`` the native acceptance probability of draft ``i``
(``min(1, p/q)``, ``p(x)`` without draft probabilities, ``[x == argmax]`` greedy), ``e_i``
whether a rejection there is deferrable (the conditions above but the window), and ``n``
the drafts before the first placeholder, position ``i`` passes with probability
``a_i + (1 - a_i) * e_i * [i + W < n] * prod_{j=1..W} a_{i+j}``, and the positions inside a
confirmed window pass natively. This is a Markov chain over the next position to verify
(``_chain_law``): from ``i``, to ``i + 1`` with ``a_i``, to ``i + W + 1`` with the override's
probability, else a stop at ``i`` emitting the residual. Drafts drawn per trial mix it over
each step's independent draft (``sampled_draft_law``). The output is *not* a product of
per-step conditional laws (whether a step is inside a confirmed window depends on earlier
steps), so it is checked as the law of (accepted count, emitted token) only.

Suite conventions kept (``reference``): a placeholder (-1) is never accepted and its row is
the bonus row; the reference's own native test is ``u < min(1, p/q)`` with ``q(x) = 0``
accepting (a rule of its own for an undefined ratio, unreachable in FLy's catalog scenarios).
"""

import numpy as np

from reference import rules
from reference.distributions import check_probs

DEFAULT_ENTROPY_THRESHOLD = 0.3  # vllm/config/speculative.py: fly_entropy_threshold
DEFAULT_ENTROPY_TOP_K = 3  # vllm/config/speculative.py: fly_entropy_top_k
DEFAULT_MAX_WINDOW = 6  # vllm/config/speculative.py: fly_window_size = min(6, K - 1)
MAX_WINDOW = 32  # the suite's widest request (harness.scenarios.scenario.MAX_DRAFTS): wider never fits


def default_window(num_speculative_tokens: int) -> int:
    """vLLM's default window ``min(6, K - 1)``, at least 1 (vLLM refuses FLy below K = 2)."""
    return max(1, min(DEFAULT_MAX_WINDOW, int(num_speculative_tokens) - 1))


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_params(window, entropy_threshold, entropy_top_k) -> tuple[int, float, int]:
    """``(window, entropy_threshold, entropy_top_k)`` as Python numbers, or ``ValueError``
    naming the bad one: an integer window in ``[1, MAX_WINDOW]``, a finite threshold ``>= 0``
    and an integer top-k ``>= 1`` (vLLM's ``ge=1`` / ``ge=0`` / ``ge=1``)."""
    if not _is_int(window) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"fly_window_size: expected an integer in [1, {MAX_WINDOW}], got {window!r}")
    if isinstance(entropy_threshold, bool) or not isinstance(entropy_threshold, (int, float, np.floating, np.integer)):
        raise ValueError(f"fly_entropy_threshold: expected a finite number >= 0, got {entropy_threshold!r}")
    if not np.isfinite(entropy_threshold) or entropy_threshold < 0:
        raise ValueError(f"fly_entropy_threshold: expected a finite number >= 0, got {entropy_threshold!r}")
    if not _is_int(entropy_top_k) or entropy_top_k < 1:
        raise ValueError(f"fly_entropy_top_k: expected an integer >= 1, got {entropy_top_k!r}")
    return int(window), float(entropy_threshold), int(entropy_top_k)


def topk_entropy(probs, top_k) -> np.ndarray:
    """``-sum p log p`` over the ``min(top_k, V)`` largest probabilities of each row (natural
    log, not renormalized, ``0 log 0 = 0``): ``compute_fly_entropy``. ``top_k`` a scalar or
    one per row."""
    p = np.asarray(probs, dtype=np.float64)
    vocab = p.shape[-1]
    k = np.minimum(np.broadcast_to(np.asarray(top_k, dtype=np.int64), p.shape[:-1]), vocab)
    ranked = -np.sort(-p, axis=-1)  # descending; ties give the same values whichever is kept
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(ranked > 0, ranked * np.log(ranked), 0.0)
    keep = np.arange(vocab) < k[..., None]
    return -np.sum(np.where(keep, terms, 0.0), axis=-1)


def deferrable(gate, draft, tokens, entropy_threshold, entropy_top_k, greedy=False, entropy=None) -> np.ndarray:
    """Whether a native rejection of each row's draft may be overridden, the window aside:
    a valid draft, ``gate(x) > 0``, ``q(x) > 0`` (sampled rows with draft probabilities; greedy
    rows read none) and ``H_k(gate) >= threshold``.

    ``gate``: ``[m, V]`` rows whose entropy and support gate the override (the processed target
    for sampled rows; ``softmax(logits)`` at T = 1 for greedy ones); ``draft`` ``[m, V]`` or
    None; ``tokens`` ``[m]``; the threshold and top-k scalars or per row. ``entropy``: the rows'
    entropies when already computed (``topk_entropy`` otherwise)."""
    gate = np.asarray(gate, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.int64)
    valid = (tokens >= 0) & (tokens < gate.shape[-1])
    x = np.where(valid, tokens, 0)[:, None]
    ok = valid & (np.take_along_axis(gate, x, axis=-1)[:, 0] > 0)
    if draft is not None and not greedy:
        ok &= np.take_along_axis(np.asarray(draft, dtype=np.float64), x, axis=-1)[:, 0] > 0
    h = topk_entropy(gate, entropy_top_k) if entropy is None else np.asarray(entropy)
    return ok & (h >= entropy_threshold)


def passes(native, deferred, num_drafts, window) -> np.ndarray:
    """Which positions pass under FLy, ``[m, d]``: natively accepted, or a deferrable native
    rejection whose window fits before the request's first placeholder (``i + W <
    num_drafts``) and whose next ``W`` positions are all natively accepted (V1's pre-pass:
    every position decided alone, from the native decisions). The request accepts the
    positions before its first ``False``.

    ``native``, ``deferred``: ``[m, d]`` bool (``False`` at and past a placeholder);
    ``num_drafts``: ``[m]`` drafts before the first placeholder; ``window``: scalar or ``[m]``."""
    native = np.asarray(native, dtype=bool)
    m, d = native.shape
    w = np.broadcast_to(np.asarray(window, dtype=np.int64), (m,))
    n = np.asarray(num_drafts, dtype=np.int64)
    # run[r, i]: natively accepted positions from i on, before the first native rejection
    run = np.zeros((m, d + 1), dtype=np.int64)
    for i in range(d - 1, -1, -1):
        run[:, i] = np.where(native[:, i], run[:, i + 1] + 1, 0)
    i = np.arange(d)[None, :]
    fits = i + w[:, None] < n[:, None]
    window_ok = run[:, 1:] >= w[:, None]  # positions i+1 .. i+W natively accepted
    return native | (np.asarray(deferred, dtype=bool) & fits & window_ok)


def _check(target, window, entropy_threshold, entropy_top_k, greedy_rows):
    target = check_probs(target, "target")
    if target.ndim != 2:
        raise ValueError(f"target: expected [num_drafts + 1, V], got shape {target.shape}")
    params = check_params(window, entropy_threshold, entropy_top_k)
    if greedy_rows is not None:
        greedy_rows = check_probs(greedy_rows, "greedy_rows")
        if greedy_rows.shape != target.shape:
            raise ValueError(f"greedy_rows: expected shape {target.shape} (the target rows at T = 1), got {greedy_rows.shape}")
    return target, params, greedy_rows


def _rows(name, rows, d, vocab):
    if rows is None:
        return None
    rows = check_probs(rows, name)
    if rows.shape != (d, vocab):
        raise ValueError(f"{name}: expected shape {(d, vocab)}, got {rows.shape}")
    return rows


def _chain_law(target, d, advance, jump, stop):
    """The Markov chain over the next position to verify: ``advance[i]`` (native acceptance),
    ``jump[i]`` (an override whose window confirms: to ``i + W + 1``, its target given by the
    caller as ``(probability, landing)``), ``stop[i]`` ``[V]`` (rejected at ``i``, the token's
    unnormalized law). ``[d+1, V]``: row ``d`` the bonus row's law times the mass reaching it."""
    vocab = target.shape[1]
    law = np.zeros((d + 1, vocab))
    reach = np.zeros(d + 1)
    reach[0] = 1.0
    for i in range(d):
        law[i] = reach[i] * stop[i]
        reach[i + 1] += reach[i] * advance[i]
        p_jump, landing = jump[i]
        if p_jump > 0:
            reach[landing] += reach[i] * p_jump
    law[d] = reach[d] * target[d]
    return law


def fixed_draft_law(
    target,
    draft,
    drafts,
    window,
    entropy_threshold=DEFAULT_ENTROPY_THRESHOLD,
    entropy_top_k=DEFAULT_ENTROPY_TOP_K,
    greedy_rows=None,
) -> np.ndarray:
    """``P(n accepted, token y)`` as a ``[d+1, V]`` array for fixed draft ids under FLy.

    Parameters
    ----------
    target : array_like of float, shape (d + 1, V)
        Target probabilities after temperature and sampling parameters (the one-hot argmax
        rows of a greedy request); row ``d`` is the bonus row.
    draft : array_like of float, shape (d, V), or None
        The draft probabilities the verifier sees; None verifies with none (point masses).
    drafts : array_like of int, shape (d,)
        Draft ids in ``[0, V)`` or the placeholder -1 (it ends the drafts: its row is the
        bonus row, and a window never reaches past it).
    window, entropy_threshold, entropy_top_k : int, float, int
        ``W >= 1``, the entropy threshold ``>= 0`` and the entropy's top-k ``>= 1``.
    greedy_rows : array_like of float, shape (d + 1, V), or None
        For a greedy request: the target at temperature 1, whose top-k entropy and support
        gate the override (the draft probabilities are then not read by the gate). None for
        a sampled request: the gate is ``target`` and ``draft(x) > 0``.

    Returns
    -------
    ndarray of float64, shape (d + 1, V)
        Sums to 1.

    Raises
    ------
    ValueError
        If a row is not probabilities, a shape is wrong, a draft id is outside ``[-1, V)``,
        or a FLy parameter is out of range (the message names it).
    """
    target, (w, thr, top_k), greedy_rows = _check(target, window, entropy_threshold, entropy_top_k, greedy_rows)
    d, vocab = target.shape[0] - 1, target.shape[1]
    draft = _rows("draft", draft, d, vocab)
    drafts = np.asarray(drafts, dtype=np.int64)
    if drafts.shape != (d,) or ((drafts < -1) | (drafts >= vocab)).any():
        raise ValueError(f"drafts: expected {d} ids in [-1, {vocab}), got {drafts}")
    holes = np.flatnonzero(drafts < 0)
    n = int(holes[0]) if holes.size else d
    x = drafts[:n]
    rows = target[:n]
    q = None if draft is None else draft[:n]
    a = rules.acceptance_probability(rows, q, x) if n else np.zeros(0)
    gate = rows if greedy_rows is None else greedy_rows[:n]
    e = deferrable(gate, q, x, thr, top_k, greedy=greedy_rows is not None) if n else np.zeros(0, bool)
    advance, jump, stop = np.zeros(d), [(0.0, 0)] * d, np.zeros((d, vocab))
    for i in range(n):
        p_window = float(np.prod(a[i + 1 : i + 1 + w])) if i + w < n else 0.0
        p_jump = (1.0 - a[i]) * p_window if e[i] else 0.0
        advance[i] = a[i]
        jump[i] = (p_jump, i + w + 1)
        resid = rules.residual_weights(rows[i][None], None if q is None else q[i][None], [x[i]])[0]
        stop[i] = (1.0 - a[i] - p_jump) * resid / resid.sum()
    law = np.zeros_like(target)
    law[: n + 1] = _chain_law(target[: n + 1], n, advance[:n], jump[:n], stop[:n])
    return law


def sampled_draft_law(
    target,
    proposal,
    window,
    entropy_threshold=DEFAULT_ENTROPY_THRESHOLD,
    entropy_top_k=DEFAULT_ENTROPY_TOP_K,
    draft_visible=True,
    greedy_rows=None,
) -> np.ndarray:
    """``P(n accepted, token y)`` ``[d+1, V]`` under FLy when each step's draft is drawn
    independently from ``proposal`` (no placeholders). Step ``i``'s draft law enters through
    the native acceptance rate ``alpha_i = sum_x proposal(x) a_i(x)``, the deferrable
    rejection mass ``sum_x proposal(x) (1 - a_i(x)) e_i(x)`` and, per draft, the residual of
    a rejection that stays one; an override at ``i`` then needs ``alpha_{i+1} .. alpha_{i+W}``.

    ``draft_visible``: whether the verifier sees ``proposal`` as its draft probabilities
    (False: point masses). The other parameters are ``fixed_draft_law``'s.
    """
    target, (w, thr, top_k), greedy_rows = _check(target, window, entropy_threshold, entropy_top_k, greedy_rows)
    d, vocab = target.shape[0] - 1, target.shape[1]
    proposal = _rows("proposal", proposal, d, vocab)
    xs = np.arange(vocab)
    accept_rate = np.zeros(d)
    per_step = []
    for i in range(d):
        p, q = target[i], proposal[i]
        seen = q if draft_visible else None
        a = rules.acceptance_probability(np.repeat(p[None], vocab, 0), None if seen is None else np.repeat(seen[None], vocab, 0), xs)
        gate = np.repeat((p if greedy_rows is None else greedy_rows[i])[None], vocab, 0)
        e = deferrable(gate, None if seen is None else np.repeat(seen[None], vocab, 0), xs, thr, top_k, greedy=greedy_rows is not None)
        accept_rate[i] = float(q @ a)
        per_step.append((q * (1.0 - a), e))
    advance, jump, stop = accept_rate, [(0.0, 0)] * d, np.zeros((d, vocab))
    for i in range(d):
        rejected, e = per_step[i]
        p_window = float(np.prod(accept_rate[i + 1 : i + 1 + w])) if i + w < d else 0.0
        jump[i] = (float(rejected[e].sum()) * p_window, i + w + 1)
        emits = rejected * (1.0 - e * p_window)  # P(draft x drawn, rejected, not overridden)
        stop[i] = _residual_mixture(target[i], proposal[i] if draft_visible else None, emits)
    return _chain_law(target, d, advance, jump, stop)


def _residual_mixture(p, seen, weights) -> np.ndarray:
    """``sum_x weights[x] * residual_x`` ``[V]``: the token law after rejecting draft ``x``
    (``rules.residual_weights``) mixed over the drafts, without a ``[V, V]`` array."""
    total = float(weights.sum())
    if total <= 0:
        return np.zeros_like(p)
    if seen is not None:  # max(p - q, 0), the same for every draft
        resid = rules.residual_weights(p[None], seen[None], [0])[0]
        return total * resid / resid.sum()
    # p without x, renormalized; x itself (the empty residual's fallback to p) when p(x) = 1
    sure = p >= 1.0
    share = np.where(sure, 0.0, weights / np.where(sure, 1.0, 1.0 - p))
    return p * (share.sum() - share) + np.where(sure, weights, 0.0)


def native_tv(target, draft, drafts, window, entropy_threshold, entropy_top_k, greedy_rows=None) -> float:
    """Total-variation distance between FLy's outcome law and the native one (the same chain
    with no override) for fixed drafts: the probability mass FLy itself moves, the largest TV
    by which a sampler that ignored FLy could differ from the law."""
    fly = fixed_draft_law(target, draft, drafts, window, entropy_threshold, entropy_top_k, greedy_rows)
    native = fixed_draft_law(target, draft, drafts, window, np.finfo(np.float64).max, entropy_top_k, greedy_rows)
    return float(0.5 * np.abs(fly - native).sum())
