"""Top-k, top-p and min-p on the target rows, before the kernels: vLLM's Triton rules ("vllm").

``processed_target`` returns a copy of the target rows with every token the processing removes
set to ``-inf``; the kernels divide by T, and a ``-inf`` stays ``-inf``, so they then verify
against ``reference.processing.processed_probs(..., "vllm")`` with no change of their own. The
drafts keep temperature only (``VerifyBatch``), so only the target rows go through here.

The rules, per request with T > 0 (greedy requests ignore all three), on every one of its rows,
in float64 from the logits divided by T rounded to float32, as ``reference.processing``:

1. min-p: remove ``probs < float32(min_p) * max(probs)``, ``probs = softmax(x / T)``;
2. top-k: keep exactly k, in a stable descending order (ties at the k-th value to the lowest
   ids); a row with at most k finite logits keeps them all;
3. top-p over the renormalized top-k survivors, in the same order: remove a token when the mass
   strictly before it is ``>= float32(p)``; a row with no active top-k whose finite logits are
   all equal is kept whole.

Rows that are degenerate (a NaN, or no finite logit) are left as they are: the kernels make them
a point mass on token 0, as the reference does. Where this can differ from the reference: only
at an exact boundary in float arithmetic (a top set's mass within a few ulps of p, a probability
within an ulp of ``min_p * max``), where torch's exp and summation order may round otherwise
than NumPy's.

A batch whose ``processing`` is ``"vllm-sort"`` (its law keeps every tie at the k-th value) is
declined: ``declines``. ``fault``: a planted fault's code (``faults.TRITON_FAULTS``): three live
here, Python branches of ``removed``.
"""

import torch

from harness.backends import shared_rows
from harness.backends.triton.faults import TRITON_FAULTS

SORT_REASON = "the suite's Triton sampler keeps exactly k at a top-k tie (vLLM's Triton rules); this scenario's law follows the sort path's"
# float64 elements of one chunk of rows, CPU / CUDA (about ten [rows, V] temporaries live at once).
CHUNK_ELEMENTS = {"cpu": 1 << 22, "cuda": 1 << 24}
MIN_P_SKIPPED = TRITON_FAULTS["min-p-skipped"].code
TOP_P_DROPS_BOUNDARY = TRITON_FAULTS["top-p-drops-boundary"].code
TOP_P_BEFORE_TEMPERATURE = TRITON_FAULTS["top-p-before-temperature"].code


def declines(batch) -> str | None:
    """Why the Triton sampler cannot run ``batch`` (``supports``), or None."""
    return SORT_REASON if getattr(batch, "processing", None) == "vllm-sort" else None


def _f32(x: torch.Tensor) -> torch.Tensor:
    """A parameter as vLLM stores it (float32), back in float64."""
    return x.to(torch.float32).to(torch.float64)


def request_params(temperature, top_k, top_p, min_p, vocab: int) -> dict:
    """Per-request float64 T, top-k (``vocab`` when off), float32-rounded p and min_p, and
    whether the request's rows are processed at all (T > 0 and a parameter active)."""
    t = temperature.to(torch.float64)
    k = torch.full_like(t, vocab, dtype=torch.int64) if top_k is None else top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k >= vocab), vocab, k)  # 0 is off, and k >= V keeps every token
    p = torch.ones_like(t) if top_p is None else _f32(top_p)
    m = torch.zeros_like(t) if min_p is None else _f32(min_p)
    t = _f32(t)
    active = (t > 0) & ((k < vocab) | (p < 1.0) | (m > 0))  # T in float32: never a division by 0
    return dict(temperature=t, top_k=k, top_p=p, min_p=m, active=active)


def removed(logits: torch.Tensor, temperature, top_k, top_p, min_p, fault: int = 0) -> torch.Tensor:
    """[n, V] bool: the finite tokens each row's processing removes (nothing of a degenerate
    row). ``logits`` raw (any float dtype); per-row float64 ``temperature`` (> 0, float32-rounded),
    int64 ``top_k`` (V when off), float64 ``top_p`` and ``min_p`` (float32-rounded; 1 and 0 off)."""
    vocab = logits.shape[1]
    x = logits.to(torch.float64) / temperature[:, None]
    top = x.amax(dim=1, keepdim=True)
    good = torch.isfinite(top[:, 0])  # a NaN propagates through amax
    x = torch.where(good[:, None], x, 0.0)  # processed as a uniform row, then left alone
    top = torch.where(good[:, None], top, 0.0)
    finite = torch.isfinite(x)
    # min-p on the tempered distribution (min_p = 0: nothing is below 0).
    e = torch.exp(x - top)
    probs = e / e.sum(dim=1, keepdim=True)
    if fault != MIN_P_SKIPPED:
        x = torch.where(probs < min_p[:, None] * probs.amax(dim=1, keepdim=True), -torch.inf, x)
    # One stable order serves top-k and top-p: top-k's survivors keep their relative order.
    # 0 - x: -0.0 and 0.0 become one key (a radix sort would tell them apart).
    _, order = torch.sort(0.0 - x, dim=1, stable=True)
    xs = x.gather(1, order)
    rank = torch.arange(vocab, device=x.device)[None, :]
    keep_k = rank < top_k[:, None]
    standalone = (top_k >= vocab) | (torch.isfinite(x).sum(dim=1) <= top_k)
    xs = torch.where(keep_k, xs, -torch.inf)
    es = torch.exp(xs - xs.amax(dim=1, keepdim=True))
    if fault == TOP_P_BEFORE_TEMPERATURE:  # top-p's masses of the logits before temperature (x * T)
        es = torch.exp((xs - xs.amax(dim=1, keepdim=True)) * temperature[:, None])
    ps = es / es.sum(dim=1, keepdim=True)
    before = torch.cat([torch.zeros_like(ps[:, :1]), torch.cumsum(ps, dim=1)[:, :-1]], dim=1)
    fin = torch.isfinite(xs)
    uniform = torch.where(fin, xs, -torch.inf).amax(dim=1) == torch.where(fin, xs, torch.inf).amin(dim=1)
    whole = (top_p >= 1.0) | (standalone & uniform)  # equal probabilities: no pivot separates them
    drop = (before >= top_p[:, None]) & ~whole[:, None]
    if fault == TOP_P_DROPS_BOUNDARY:  # the inclusive mass compared: the token that reaches p goes too
        drop = (torch.cumsum(ps, dim=1) > top_p[:, None]) & (rank > 0) & ~whole[:, None]
    gone_sorted = ~torch.isfinite(xs) | drop
    gone = torch.zeros_like(gone_sorted).scatter_(1, order, gone_sorted)
    return gone & finite & good[:, None]


def processed_target(target: torch.Tensor, cu_num_drafts, temperature, top_k, top_p, min_p, fault: int = 0) -> torch.Tensor:
    """The target rows (``VerifyBatch`` layout) with every token the requests' top-k / top-p /
    min-p remove set to ``-inf``: a new tensor of ``target``'s dtype and device, or ``target``
    itself when nothing is processed (``target`` is never written). A stride-0 ``target``
    (``shared_rows``) stays a view when every request has the same T and parameters."""
    vocab = target.shape[1]
    req = request_params(temperature, top_k, top_p, min_p, vocab)
    if shared_rows.is_shared(target):
        same = all(bool((v == v[:1]).all()) for v in req.values())
        if same and req["temperature"].numel():
            one = {name: v[:1] for name, v in req.items()}
            if not bool(one["active"][0]):
                return target
            return _apply(target[:1], torch.zeros(1, dtype=torch.int64, device=target.device), one, fault).expand(target.shape)
    counts = cu_num_drafts[1:] - cu_num_drafts[:-1] + 1
    row_req = torch.repeat_interleave(torch.arange(counts.numel(), device=target.device), counts, output_size=target.shape[0])
    return _apply(target, row_req, req, fault)


def _apply(target: torch.Tensor, row_req: torch.Tensor, req: dict, fault: int = 0) -> torch.Tensor:
    rows = torch.nonzero(req["active"][row_req]).flatten()
    if rows.numel() == 0:
        return target
    out = target.clone(memory_format=torch.contiguous_format)  # a shared (stride-0) target gets rows of its own
    step = max(1, CHUNK_ELEMENTS["cuda" if target.is_cuda else "cpu"] // target.shape[1])
    for at in range(0, rows.numel(), step):
        idx = rows[at : at + step]
        r = row_req[idx]
        gone = removed(target[idx], req["temperature"][r], req["top_k"][r], req["top_p"][r], req["min_p"][r], fault)
        out[idx] = torch.where(gone, -torch.inf, target[idx])
    return out
