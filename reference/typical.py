"""Typical acceptance (Medusa, Cai et al. 2024, section 3.3.1) as vLLM V0's
``TypicalAcceptanceSampler`` implements it: the rule on float64 rows and its exact laws.

Read from the vLLM 0.6.3 release (PyPI wheel ``vllm-0.6.3-cp38-abi3-manylinux1_x86_64.whl``):

* ``vllm/model_executor/layers/typical_acceptance_sampler.py:134-149``
  (``_evaluate_accepted_tokens``): draft ``x`` at a row ``p`` is accepted iff
  ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))`` (strict ``>``), with
  ``H(p) = -sum_v p(v) * log(p(v) + 1e-5)`` (natural log, the constant ``1e-5`` inside the
  log, line 140), over the whole row.
* ``typical_acceptance_sampler.py:151-170`` (``_get_recovered_token_ids``): the token
  emitted at the first rejected position is ``argmax`` of that position's target row
  (``torch.argmax``: the first maximal index), at every position; no position is special.
* ``vllm/model_executor/layers/spec_decode_base_sampler.py:79-116`` (``_create_output``):
  drafts before the first rejection are emitted, then the recovered token at the first
  rejection, nothing after it; when every draft is accepted the bonus token follows.
* ``vllm/spec_decode/spec_decode_worker.py:716`` (``_verify_tokens``): the bonus token is
  ``proposal_scores.token_ids[:, -1]``, the target model's own *sampled* token at the bonus
  row (its sampler: the request's temperature and sampling parameters), and the rows
  verified are ``proposal_scores.probs``, the target's probabilities after that processing.
  Draft probabilities are not read (``typical_acceptance_sampler.py:63``).
* ``vllm/config.py:1302-1305``: defaults ``posterior_threshold = 0.09`` (epsilon) and
  ``posterior_alpha = 0.3`` (delta); ``config.py:1495-1504`` refuses either below 0.

Earlier releases differ: vLLM 0.5.4's ``_replacement_token_ids``
(``typical_acceptance_sampler.py:155-184`` there) recovers only at position 0 (argmax of row
0) and leaves -1 elsewhere, so a first rejection at position ``j > 0`` emits the ``j``
accepted drafts and no replacement token. This module follows 0.6.3.

Suite conventions kept (``reference``): a placeholder (-1) is never accepted and its row
acts as the bonus row; at temperature 0 the target row is the one-hot of its argmax, so the
rule accepts exactly the argmax (V0 instead scores greedy requests with ``softmax(logits)``
at T = 1, as its sampler does: not modelled). The accepted count is deterministic given the
target rows and the drafts; the only randomness is the bonus token, drawn from the bonus row.
"""

import numpy as np

from reference.distributions import check_probs

ENTROPY_EPSILON = 1e-5  # inside the log of V0's entropy (typical_acceptance_sampler.py:140)
DEFAULT_POSTERIOR_THRESHOLD = 0.09  # epsilon (vllm/config.py:1303)
DEFAULT_POSTERIOR_ALPHA = 0.3  # delta (vllm/config.py:1305)


def check_params(posterior_threshold, posterior_alpha) -> tuple[float, float]:
    """``(epsilon, delta)`` as floats, or ``ValueError`` naming the bad one: each a finite
    number ``>= 0`` (vLLM V0 refuses negative values)."""
    out = []
    for name, value in (("posterior_threshold", posterior_threshold), ("posterior_alpha", posterior_alpha)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        value = float(value)
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        out.append(value)
    return out[0], out[1]


def entropy(target: np.ndarray) -> np.ndarray:
    """V0's posterior entropy per row: ``-sum p * log(p + 1e-5)`` (natural log)."""
    p = np.asarray(target, dtype=np.float64)
    return -np.sum(p * np.log(p + ENTROPY_EPSILON), axis=-1)


def thresholds(target: np.ndarray, posterior_threshold, posterior_alpha) -> np.ndarray:
    """``min(epsilon, delta * exp(-H(p)))`` per row (``epsilon``/``delta`` scalars or per row)."""
    return np.minimum(posterior_threshold, np.asarray(posterior_alpha) * np.exp(-entropy(target)))


def accepts(target: np.ndarray, tokens, posterior_threshold, posterior_alpha) -> np.ndarray:
    """Whether each row accepts its draft: ``p(x) > threshold`` (strict); a placeholder (-1) never."""
    target = np.asarray(target, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.int64)
    p_x = np.take_along_axis(target, np.maximum(tokens, 0)[..., None], axis=-1)[..., 0]
    return (tokens >= 0) & (p_x > thresholds(target, posterior_threshold, posterior_alpha))


def recovered_tokens(target: np.ndarray) -> np.ndarray:
    """The token emitted at the first rejection: the row's argmax, ties to the lowest id."""
    return np.argmax(np.asarray(target), axis=-1).astype(np.int64)


def _check(target, posterior_threshold, posterior_alpha):
    target = check_probs(target, "target")
    if target.ndim != 2:
        raise ValueError(f"target: expected [num_drafts + 1, V], got shape {target.shape}")
    return target, *check_params(posterior_threshold, posterior_alpha)


def fixed_draft_law(target, drafts, posterior_threshold=DEFAULT_POSTERIOR_THRESHOLD, posterior_alpha=DEFAULT_POSTERIOR_ALPHA) -> np.ndarray:
    """``P(n accepted, token y)`` as a ``[d+1, V]`` array for fixed draft ids.

    The accepted count ``n`` is deterministic: the first position whose draft fails the rule
    (or is a placeholder, which acts as the bonus row). ``n < d`` with a rejection: a point
    mass on the row's argmax. ``n`` at the bonus row: that row, the bonus being sampled.

    Parameters
    ----------
    target : array_like of float, shape (d + 1, V)
        Target probabilities after temperature (and sampling parameters); row ``d`` is the bonus row.
    drafts : array_like of int, shape (d,)
        Draft ids in ``[0, V)`` or the placeholder -1.
    posterior_threshold, posterior_alpha : float
        ``epsilon`` and ``delta``, finite and ``>= 0``.

    Returns
    -------
    ndarray of float64, shape (d + 1, V)
        One non-zero row; sums to 1.

    Raises
    ------
    ValueError
        If ``target`` is not 2-D probability rows, ``drafts`` is not ``(d,)`` ids in
        ``[-1, V)``, or a parameter is not a finite number ``>= 0`` (the message names it).
    """
    target, eps, delta = _check(target, posterior_threshold, posterior_alpha)
    d, vocab = target.shape[0] - 1, target.shape[1]
    drafts = np.asarray(drafts, dtype=np.int64)
    if drafts.shape != (d,) or ((drafts < -1) | (drafts >= vocab)).any():
        raise ValueError(f"drafts: expected {d} ids in [-1, {vocab}), got {drafts}")
    law = np.zeros_like(target)
    ok = accepts(target[:d], drafts, eps, delta)
    for n in range(d):
        if not ok[n]:
            if drafts[n] < 0:  # a placeholder: its row is the bonus row
                law[n] = target[n]
            else:
                law[n, recovered_tokens(target[n])] = 1.0
            return law
    law[d] = target[d]
    return law


def position_laws(target, proposal, posterior_threshold=DEFAULT_POSTERIOR_THRESHOLD, posterior_alpha=DEFAULT_POSTERIOR_ALPHA) -> np.ndarray:
    """Per-step laws for drafts drawn independently from ``proposal``, in the layout of
    ``reference.laws.position_laws``: ``[j, 0, y]`` = P(draft y drawn and accepted),
    ``[j, 1, y]`` = P(rejected, token y emitted) (all on the argmax), ``[d, 1]`` the bonus row."""
    target, eps, delta = _check(target, posterior_threshold, posterior_alpha)
    d, vocab = target.shape[0] - 1, target.shape[1]
    proposal = check_probs(proposal, "proposal")
    if proposal.shape != (d, vocab):
        raise ValueError(f"proposal: expected shape {(d, vocab)}, got {proposal.shape}")
    out = np.zeros((d + 1, 2, vocab))
    thr = thresholds(target[:d], eps, delta)
    for j in range(d):
        ok = target[j] > thr[j]
        out[j, 0] = np.where(ok, proposal[j], 0.0)
        out[j, 1, recovered_tokens(target[j])] = proposal[j][~ok].sum()
    out[d, 1] = target[d]
    return out


def sampled_draft_law(
    target, proposal, posterior_threshold=DEFAULT_POSTERIOR_THRESHOLD, posterior_alpha=DEFAULT_POSTERIOR_ALPHA
) -> np.ndarray:
    """``P(n accepted, token y)`` ``[d+1, V]`` when drafts are drawn from ``proposal``."""
    steps = position_laws(target, proposal, posterior_threshold, posterior_alpha)
    d = steps.shape[0] - 1
    law = np.zeros((d + 1, steps.shape[-1]))
    reach = 1.0
    for j in range(d):
        law[j] = reach * steps[j, 1]
        reach *= steps[j, 0].sum()
    law[d] = reach * steps[d, 1]
    return law
