"""Logit bias, top-k, top-p and min-p on the target rows, before the kernels: vLLM's Triton rules ("vllm").

``processed_target`` returns a copy of the target rows with each request's logit bias added and
every token the processing removes set to ``-inf``; the kernels divide by T, and a ``-inf``
stays ``-inf``, so they then verify against ``reference.processing.processed_probs(...,
"vllm")`` with no change of their own. The drafts keep temperature only (``VerifyBatch``), so
only the target rows go through here.

The logit bias comes first, on every row of a biased request, greedy ones included (their
argmax is the biased logits'): ``l + b`` with ``b`` float32 as vLLM stores it, rounded to float32
as vLLM's float32 ``logits += bias`` does (a biased batch's rows are float32 then, whatever the
logits' dtype). The rules below read the float64 sum ``l + b``, as the reference does.

The rules, per request with T > 0 (greedy requests ignore all three), on every one of its rows,
in float64 from the (biased) logits divided by T rounded to float32, as ``reference.processing``:

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
declined: ``declines``. ``fault``: a planted fault's code (``faults.TRITON_FAULTS``): four live
here, Python branches of ``removed`` and ``_apply`` (``logit-bias-skipped``).
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
LOGIT_BIAS_SKIPPED = TRITON_FAULTS["logit-bias-skipped"].code


def declines(batch) -> str | None:
    """Why the Triton sampler cannot run ``batch`` (``supports``), or None."""
    return SORT_REASON if getattr(batch, "processing", None) == "vllm-sort" else None


def _f32(x: torch.Tensor) -> torch.Tensor:
    """A parameter as vLLM stores it (float32), back in float64."""
    return x.to(torch.float32).to(torch.float64)


def request_params(temperature, top_k, top_p, min_p, vocab: int, logit_bias_ids=None, logit_bias=None) -> dict:
    """Per-request float64 T, top-k (``vocab`` when off), float32-rounded p and min_p, whether
    the request's rows are processed at all (T > 0 and a parameter active), and with a logit
    bias: its ids (``[B, L]``, -1 pads) and float32-rounded biases (0 at padded slots), and
    whether the request has one (``biased``: at any T)."""
    t = temperature.to(torch.float64)
    k = torch.full_like(t, vocab, dtype=torch.int64) if top_k is None else top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k >= vocab), vocab, k)  # 0 is off, and k >= V keeps every token
    p = torch.ones_like(t) if top_p is None else _f32(top_p)
    m = torch.zeros_like(t) if min_p is None else _f32(min_p)
    t = _f32(t)
    active = (t > 0) & ((k < vocab) | (p < 1.0) | (m > 0))  # T in float32: never a division by 0
    out = dict(temperature=t, top_k=k, top_p=p, min_p=m, active=active)
    if logit_bias_ids is not None:
        ids = logit_bias_ids.to(device=t.device, dtype=torch.int64)
        used = ids >= 0
        out["bias_ids"] = torch.where(used, ids, 0)
        out["bias"] = torch.where(used, _f32(logit_bias.to(t.device)), 0.0)
        out["biased"] = used.any(dim=1)
    return out


def biased(logits: torch.Tensor, bias_ids: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """float64 ``logits + bias`` of rows ``[n, V]`` with ``[n, L]`` ids and float64 biases
    (``request_params``: padded slots point at id 0 with bias 0). The sum of a float32 logit
    and a float32 bias is exact in float64: its float32 rounding is vLLM's float32 sum."""
    return logits.to(torch.float64).scatter_add(1, bias_ids, bias)


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


def processed_target(
    target: torch.Tensor, cu_num_drafts, temperature, top_k, top_p, min_p, fault: int = 0, logit_bias_ids=None, logit_bias=None
) -> torch.Tensor:
    """The target rows (``VerifyBatch`` layout) with the requests' logit bias added and every
    token their top-k / top-p / min-p remove set to ``-inf``: a new tensor on ``target``'s
    device, of its dtype (float32 when a request has a bias: the biased sums), or ``target``
    itself when nothing is processed (``target`` is never written). A stride-0 ``target``
    (``shared_rows``) stays a view when every request has the same T and parameters."""
    vocab = target.shape[1]
    req = request_params(temperature, top_k, top_p, min_p, vocab, logit_bias_ids, logit_bias)
    if shared_rows.is_shared(target):
        same = all(bool((v == v[:1]).all()) for v in req.values())
        if same and req["temperature"].numel():
            one = {name: v[:1] for name, v in req.items()}
            if not _touched(one).any():
                return target
            return _apply(target[:1], torch.zeros(1, dtype=torch.int64, device=target.device), one, fault).expand(target.shape)
    counts = cu_num_drafts[1:] - cu_num_drafts[:-1] + 1
    row_req = torch.repeat_interleave(torch.arange(counts.numel(), device=target.device), counts, output_size=target.shape[0])
    return _apply(target, row_req, req, fault)


def _touched(req: dict) -> torch.Tensor:
    """[B] bool: the requests whose rows change (processing active, or a logit bias)."""
    return req["active"] | req["biased"] if "biased" in req else req["active"]


def _apply(target: torch.Tensor, row_req: torch.Tensor, req: dict, fault: int = 0) -> torch.Tensor:
    rows = torch.nonzero(_touched(req)[row_req]).flatten()
    if rows.numel() == 0:
        return target
    bias = "biased" in req and fault != LOGIT_BIAS_SKIPPED and bool(req["biased"].any())
    # A shared (stride-0) target gets rows of its own; biased sums are float32 (vLLM's sum).
    out = target.to(torch.float32) if bias and target.dtype != torch.float32 else target.clone(memory_format=torch.contiguous_format)
    out = out.contiguous()
    step = max(1, CHUNK_ELEMENTS["cuda" if target.is_cuda else "cpu"] // target.shape[1])
    for at in range(0, rows.numel(), step):
        idx = rows[at : at + step]
        r = row_req[idx]
        x = biased(target[idx], req["bias_ids"][r], req["bias"][r]) if bias else target[idx]
        # Greedy rows take the bias only; T > 0 rows with a parameter are processed too.
        t = torch.where(req["temperature"][r] > 0, req["temperature"][r], 1.0)
        gone = removed(x, t, req["top_k"][r], req["top_p"][r], req["min_p"][r], fault) & req["active"][r][:, None]
        out[idx] = torch.where(gone, -torch.inf, x.to(out.dtype))
    return out
