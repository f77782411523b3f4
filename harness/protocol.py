"""The one protocol every implementation under test implements.

A backend is any object with

* ``name: str``
* ``sample(batch: VerifyBatch) -> tuple[tokens, num_emitted]``
* optionally ``supports(batch) -> str | None``: ``None`` when it can run the batch, else a
  non-empty one-line reason (a method it lacks, say); anything else is a protocol error.
  The runner asks for a scenario's whole batch first; when that is declined, it asks for
  each request template alone and verifies the templates accepted, reporting the others
  (and why) as skipped.
* optionally ``devices: tuple[str, ...]`` (default ``("cpu",)``).

``sample`` receives a ``VerifyBatch`` of NumPy arrays in the layout engines use and
returns ``tokens`` ``[num_requests, max_drafts + 1]`` and ``num_emitted``
``[num_requests]``, both integer arrays (a float, bool or string array is malformed output,
counted as a structure failure naming its dtype): request ``r`` emitted ``tokens[r, :num_emitted[r]]`` — its accepted
drafts, then one replacement or bonus token. Slots past ``num_emitted`` are never read
(vLLM MRV2 leaves them uninitialised). Torch or CuPy tensors are accepted as returns;
``batch.to_torch(device)`` converts inputs for torch-based kernels.

A backend with ``device_batches = True`` may instead receive a *device batch*: the same
fields as torch tensors already on its device, logits stored in ``logits_dtype``
(``harness.sampling.device.trials``); it returns tensors on that device, which are tallied there.

Layout (``B`` requests, ``d_r`` drafts for request ``r``, ``D = sum d_r``):

=================  =====================  ==================================================
field              shape / dtype          meaning
=================  =====================  ==================================================
target_logits      [D + B, V] float       rows of request r: ``cu_num_drafts[r] + r`` ..
                                          ``cu_num_drafts[r+1] + r`` (``d_r + 1`` rows; row
                                          ``j < d_r`` verifies draft ``j``, the last is the
                                          bonus row). Before temperature; -inf = masked.
draft_logits       [D, V_draft] or None   one row per draft, before temperature; None
                                          verifies with no draft probabilities (point mass).
draft_tokens       [D] int64              draft ids; -1 is a placeholder (never accepted).
cu_num_drafts      [B + 1] int64          0, d_0, d_0 + d_1, ...
temperature        [B] float64            per request; 0 = greedy.
seeds              [B] int64              per request; with ``positions`` keys all noise.
positions          [D + B] int64          absolute token position of every target row.
methods            [B] int8               ``reference.methods.Method`` codes.
synthetic_rates    [B, K] float64 or None conditional acceptance rates of synthetic requests.
max_drafts         int                    K, the widest request's draft count.
request_slots      [B] int64 or None      distinct state-table slots of the requests (engines
                                          index per-request state by slot: vLLM's idx_mapping);
                                          None = slot r for request r. Samplers may ignore it.
logits_dtype       str                    "float32", "bfloat16" or "float16": the logits hold
                                          values exact in that dtype; cast to it at no loss.
method_codes       tuple[int] or None     the distinct codes ``methods`` holds, when the
                                          batch's builder knows them on the host (a device
                                          batch): reading them costs no device sync.
top_k              [B] int64 or None      per-request top-k over the target (0 = off).
top_p              [B] float64 or None    per-request top-p over the target (1 = off).
min_p              [B] float64 or None    per-request min-p over the target (0 = off).
logit_bias_ids     [B, L] int64 or None   per-request logit-bias token ids, unique in a
                                          row, -1 pads the unused slots (L: the most
                                          entries of any request); None: no bias.
logit_bias         [B, L] float32 or None the biases of ``logit_bias_ids`` (not read at -1
                                          slots), added to the raw target logits before
                                          temperature; -inf masks the token.
posterior_threshold [B] float64 or None   typical acceptance's epsilon per request; given
posterior_alpha    [B] float64 or None    with its delta exactly when a request is typical.
fly_window_size    [B] int64 or None      FLy's window W, entropy threshold and entropy
fly_entropy_threshold [B] float64 or None top-k per request; given (all three) exactly
fly_entropy_top_k  [B] int64 or None      when a request is FLy.
processing         str or None            whose top-k/top-p rules the law follows at an
                                          exact tie on a boundary ("vllm", "vllm-sort"),
                                          when a request's law depends on them; else None.
draft_sampling     str or None            None: the drafts are ``draft_tokens``. Else the
                                          backend drafts (below): "probabilistic" or "greedy".
=================  =====================  ==================================================

**The backend's own drafter.** A backend with ``drafter = True`` may receive batches with
``draft_sampling`` set: it then draws every draft itself with its engine's draft-sampling
code and verifies those. Draft ``j`` of request ``r`` comes from the draft row
``draft_logits[cu_num_drafts[r] + j]``: with "probabilistic" from ``softmax(row / T)``
(T = 0: its argmax), with "greedy" its argmax at any T (ties to the lowest id), keyed by
``seeds[r]`` and ``positions`` of the target row that verifies it (vLLM: ``pos = t + j``).
``draft_tokens`` holds -1 and is not read. Greedy drafts are verified as point masses (the
engine passes no draft distribution then); probabilistic ones against ``softmax(row / T)``.
``sample`` returns ``(tokens, num_emitted, drafts)``, ``drafts`` ``[D]`` the ids it drew
(every step, also past a rejection): the suite checks that they follow the law above, and
that what was emitted follows the target's, lossless end to end.

**Sampling parameters.** With ``top_k``, ``top_p``, ``min_p`` or a logit bias a request
verifies against the *processed* target: ``reference.processing.processed_probs``, vLLM's
definition (the bias added to the raw logits, then temperature, min-p on the tempered
distribution, then top-k, then top-p over the renormalized survivors). The draft distribution
is ``softmax(draft_logits / T)`` only, as engines' drafters use it (no bias: a bias can make
the target differ from q). Greedy requests (T = 0) ignore top-k, top-p and min-p and take the
argmax of the *biased* logits. A backend applies them with its engine's own code, or declines
(``supports``) what its engine does not apply; one whose tie rules differ from
``processing`` (when that is set) declines too.
"""

from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

import numpy as np

from reference.methods import Method


@runtime_checkable
class Backend(Protocol):
    """An implementation under test: a named sampler of ``VerifyBatch`` outputs.

    Only ``name`` and ``sample`` are part of this runtime-checkable protocol
    (``isinstance(obj, Backend)`` checks for both); the optional members the runner reads
    with ``getattr`` (``supports``, ``devices``, ``device_batches``) are described in the
    module docstring.

    Attributes
    ----------
    name : str
        The backend's name, as the runner and its reports show it.
    """

    name: str

    def sample(self, batch: "VerifyBatch"):
        """Verify every request of ``batch`` and return the tokens each one emitted.

        NumPy arrays, torch or CuPy tensors are accepted as returns; a float, bool or string
        array is malformed output (see ``check_integer_outputs``).

        Parameters
        ----------
        batch : VerifyBatch
            The requests to verify, NumPy arrays in the layout of the module docstring; for a
            backend with ``device_batches = True``, a device batch (the same fields as torch
            tensors on its device).

        Returns
        -------
        tokens : integer array or tensor, shape (num_requests, max_drafts + 1)
            Request ``r`` emitted ``tokens[r, :num_emitted[r]]``: its accepted drafts, then one
            replacement or bonus token. Slots past ``num_emitted[r]`` are never read.
        num_emitted : integer array or tensor, shape (num_requests,)
            Tokens emitted by each request; well-formed values lie in ``1 .. e_r + 1``, where
            ``e_r`` counts request ``r``'s drafts before its first placeholder (``-1``).
        """
        ...


@dataclass(frozen=True)
class VerifyBatch:
    """One call's worth of requests to verify, in the layout engines use.

    ``B`` requests, request ``r`` with ``d_r`` drafts, ``D = sum d_r`` drafts in all, target
    vocabulary ``V``. The fields are NumPy arrays for a host batch; a device batch (see the
    module docstring) holds the same fields as torch tensors on the backend's device.
    ``validate`` checks the layout below.

    Attributes
    ----------
    target_logits : ndarray of float, shape (D + B, V)
        Target logits before temperature, values exact in ``logits_dtype`` (the harness's
        host batches store them as float32, its device batches in ``logits_dtype``). Rows
        ``cu_num_drafts[r] + r`` to ``cu_num_drafts[r + 1] + r`` (inclusive, ``d_r + 1``
        rows) belong to request ``r``: its row ``j < d_r`` verifies draft ``j``, its last
        row is the bonus row. ``-inf`` masks a token; ``+inf`` is not allowed.
    draft_logits : ndarray of float, shape (D, V_draft), or None
        Draft logits before temperature, one row per draft, ``1 <= V_draft <= V`` (ids
        ``>= V_draft`` have draft probability 0). None verifies with no draft probabilities
        (point-mass proposal).
    draft_tokens : ndarray of int64, shape (D,)
        Draft ids in ``[0, V)``, request after request (request ``r``'s are
        ``cu_num_drafts[r]`` to ``cu_num_drafts[r + 1] - 1``); ``-1`` is a placeholder that is
        never accepted.
    cu_num_drafts : ndarray of int64, shape (B + 1,)
        Cumulative draft counts: ``0, d_0, d_0 + d_1, ...``, non-decreasing.
    temperature : ndarray of float64, shape (B,)
        Per-request temperature, finite and ``>= 0``; 0 is greedy verification.
    seeds : ndarray of int64, shape (B,)
        Per-request seed; with ``positions`` it keys all of the request's noise.
    positions : ndarray of int64, shape (D + B,)
        Absolute token position of every target row.
    methods : ndarray of int8, shape (B,)
        Per-request ``reference.methods.Method`` code.
    synthetic_rates : ndarray of float64, shape (B, max_drafts), or None
        Conditional acceptance rates in ``[0, 1]`` of synthetic requests (rows of other
        requests are not read). Required when any request is ``Method.SYNTHETIC``.
    max_drafts : int
        ``K``: at least the widest request's draft count; outputs have ``K + 1`` columns.
    request_slots : ndarray of int64, shape (B,), or None
        Distinct non-negative state-table slots of the requests (engines index per-request
        state by slot: vLLM's ``idx_mapping``). None means slot ``r`` for request ``r``.
        Samplers may ignore it.
    logits_dtype : str
        ``"float32"``, ``"bfloat16"`` or ``"float16"``: the logits hold values exact in that
        dtype, so casting them to it loses nothing.
    method_codes : tuple of int, or None
        The distinct codes ``methods`` holds, when the batch's builder knows them on the
        host (a device batch): reading them costs no device sync. None: read ``methods``.
    top_k : ndarray of int64, shape (B,), or None
        Per-request top-k over the target, ``0`` = disabled (as is any ``k >= V``); None:
        disabled for every request.
    top_p : ndarray of float64, shape (B,), or None
        Per-request top-p in ``(0, 1]``, ``1`` = disabled; None: disabled for every request.
    min_p : ndarray of float64, shape (B,), or None
        Per-request min-p in ``[0, 1]``, ``0`` = disabled; None: disabled for every request.
    draft_sampling : str or None
        None: verify ``draft_tokens``. ``"probabilistic"`` or ``"greedy"``: a backend with
        ``drafter = True`` draws the drafts itself (module docstring) and returns them too.
    logit_bias_ids : ndarray of int64, shape (B, L), or None
        Per-request logit bias, sparse as vLLM MRV2's ``LogitBiasState`` holds it: request
        ``r``'s biased token ids in ``[0, V)``, each at most once a row, ``-1`` padding the
        unused slots (``L``: the most entries of any request). None: no request has a bias.
    logit_bias : ndarray of float32, shape (B, L), or None
        The biases of ``logit_bias_ids`` (float32, as vLLM stores them; values at ``-1`` slots
        are not read): added to request ``r``'s raw target logits, every row of it, before
        temperature (``reference.processing``); ``-inf`` masks a token, NaN and ``+inf`` are
        not allowed. Given exactly when ``logit_bias_ids`` is.
    posterior_threshold, posterior_alpha : ndarray of float64, shape (B,), or None
        Typical acceptance's epsilon and delta per request (``reference.typical``: accept iff
        ``p(x) > min(epsilon, delta * exp(-H(p)))``), finite and ``>= 0``; read only for
        ``Method.TYPICAL`` requests. Given (both) exactly when some request is typical.
    fly_window_size, fly_entropy_threshold, fly_entropy_top_k : ndarray, shape (B,), or None
        FLy's parameters per request (``reference.fly``: a native rejection at ``i`` is
        overridden iff the top-``k`` entropy of the target row is ``>= threshold``, ``p(x) > 0``
        (and ``q(x) > 0``), a whole window fits before the first placeholder and the next
        ``W`` positions are natively accepted): int64 ``W >= 1``, float64 threshold finite and
        ``>= 0``, int64 ``k >= 1``; read only for ``Method.FLY`` requests. Given (all three)
        exactly when some request is FLy.
    processing : str or None
        ``"vllm"`` (vLLM's Triton top-k/top-p: exactly k, ties to the lowest ids) or
        ``"vllm-sort"`` (its sort path: every tie at the k-th value stays), the rules the
        law follows, set when some request's law depends on them (an exact tie on a top-k
        or top-p boundary); None when the two agree on every request.
    """

    target_logits: np.ndarray
    draft_logits: np.ndarray | None
    draft_tokens: np.ndarray
    cu_num_drafts: np.ndarray
    temperature: np.ndarray
    seeds: np.ndarray
    positions: np.ndarray
    methods: np.ndarray
    synthetic_rates: np.ndarray | None
    max_drafts: int
    request_slots: np.ndarray | None = None
    logits_dtype: str = "float32"
    method_codes: tuple[int, ...] | None = None
    top_k: np.ndarray | None = None
    top_p: np.ndarray | None = None
    min_p: np.ndarray | None = None
    processing: str | None = None
    draft_sampling: str | None = None
    logit_bias_ids: np.ndarray | None = None
    logit_bias: np.ndarray | None = None
    posterior_threshold: np.ndarray | None = None
    posterior_alpha: np.ndarray | None = None
    fly_window_size: np.ndarray | None = None
    fly_entropy_threshold: np.ndarray | None = None
    fly_entropy_top_k: np.ndarray | None = None

    @property
    def has_sampling_params(self) -> bool:
        """Whether any request may have top-k, top-p, min-p or a logit bias (a field is not None).

        Returns
        -------
        bool
            True when ``top_k``, ``top_p``, ``min_p`` or ``logit_bias_ids`` is given.
        """
        return any(x is not None for x in (self.top_k, self.top_p, self.min_p, self.logit_bias_ids))

    @property
    def num_requests(self) -> int:
        """The number of requests.

        Returns
        -------
        int
            ``B = len(cu_num_drafts) - 1``.
        """
        return len(self.cu_num_drafts) - 1

    @property
    def vocab_size(self) -> int:
        """The target vocabulary size.

        Returns
        -------
        int
            ``V = target_logits.shape[1]``.
        """
        return self.target_logits.shape[1]

    @property
    def num_drafts(self) -> np.ndarray:
        """Each request's draft count.

        Returns
        -------
        ndarray of int, shape (num_requests,)
            ``d_r = cu_num_drafts[r + 1] - cu_num_drafts[r]``.
        """
        return np.diff(self.cu_num_drafts)

    def validate(self) -> "VerifyBatch":
        """Check the layout of a host batch, naming the first malformed field.

        Checks every field's shape against ``cu_num_drafts``, integer dtypes of
        ``draft_tokens`` and ``positions``, no ``+inf`` target logit and no NaN or ``+inf``
        draft logit, draft ids in ``[0, V)`` or ``-1``, temperatures finite and ``>= 0``,
        known method codes (and ``method_codes`` their distinct set), ``max_drafts`` at
        least the widest request, distinct non-negative ``request_slots``, a known
        ``logits_dtype``, sampling parameters in range (logit-bias ids in ``[0, V)`` or the
        padding -1, unique per request, biases finite or -inf), a known ``processing``,
        rates in ``[0, 1]`` for synthetic requests, and typical acceptance's and FLy's
        parameters with their requests.

        Returns
        -------
        VerifyBatch
            ``self``, so that a batch can be built and checked in one expression.

        Raises
        ------
        ValueError
            If a field is malformed; the message starts with the field's name.
        """
        cu = self.cu_num_drafts
        if cu.ndim != 1 or cu.size < 1 or cu[0] != 0 or np.any(np.diff(cu) < 0):
            raise ValueError("cu_num_drafts: expected a non-decreasing 1-D array starting at 0")
        b, d = cu.size - 1, int(cu[-1])
        if self.target_logits.ndim != 2 or self.target_logits.shape[0] != d + b:
            raise ValueError(f"target_logits: expected shape [{d + b}, V], got {self.target_logits.shape}")
        if self.target_logits.shape[1] < 1:
            raise ValueError("target_logits: the vocabulary is empty")
        if np.isposinf(self.target_logits).any():
            raise ValueError("target_logits: +inf logits are not allowed (mask with -inf)")
        if self.draft_logits is not None:
            dl = self.draft_logits
            if dl.ndim != 2 or dl.shape[0] != d or not 1 <= dl.shape[1] <= self.vocab_size:
                raise ValueError(f"draft_logits: expected shape [{d}, V_draft <= {self.vocab_size}], got {dl.shape}")
            if np.isnan(dl).any() or np.isposinf(dl).any():
                raise ValueError("draft_logits: NaN or +inf draft logits are not allowed")
        for name, size in (("draft_tokens", d), ("positions", d + b)):
            arr = getattr(self, name)
            if arr.shape != (size,) or not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(f"{name}: expected {size} integers, got shape {arr.shape} dtype {arr.dtype}")
        tokens = self.draft_tokens
        if ((tokens < -1) | (tokens >= self.vocab_size)).any():
            bad = tokens[(tokens < -1) | (tokens >= self.vocab_size)][0]
            raise ValueError(f"draft_tokens: id {bad} is outside [0, {self.vocab_size}) and not the placeholder -1")
        for name in ("temperature", "seeds", "methods"):
            if getattr(self, name).shape != (b,):
                raise ValueError(f"{name}: expected shape [{b}], got {getattr(self, name).shape}")
        t = self.temperature
        if not np.all(np.isfinite(t)) or np.any(t < 0):
            raise ValueError("temperature: must be finite and >= 0 (0 means greedy)")
        if not np.isin(self.methods, [m.value for m in Method]).all():
            raise ValueError(f"methods: codes must be among {[m.value for m in Method]}")
        if self.method_codes is not None and set(self.method_codes) != set(np.unique(self.methods).tolist()):
            raise ValueError(f"method_codes: {self.method_codes} are not the distinct codes of methods")
        if self.max_drafts < int(np.max(np.diff(cu), initial=0)):
            raise ValueError("max_drafts: smaller than the widest request's draft count")
        slots = self.request_slots
        if slots is not None and (slots.shape != (b,) or np.unique(slots).size != b or (slots < 0).any()):
            raise ValueError("request_slots: expected distinct non-negative slots, one per request")
        if self.logits_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"logits_dtype: expected float32, bfloat16 or float16, got {self.logits_dtype!r}")
        for name, ok, what in (
            ("top_k", lambda x: x >= 0, "integers >= 0 (0 = off)"),
            ("top_p", lambda x: (x > 0) & (x <= 1), "numbers in (0, 1]"),
            ("min_p", lambda x: (x >= 0) & (x <= 1), "numbers in [0, 1]"),
        ):
            x = getattr(self, name)
            if x is None:
                continue
            integral = np.issubdtype(x.dtype, np.integer)
            if x.shape != (b,) or (name == "top_k") != integral or not np.all(ok(x)):
                raise ValueError(f"{name}: expected {b} {what}, got shape {x.shape} dtype {x.dtype}")
        self._validate_logit_bias(b)
        self._validate_typical(b)
        self._validate_fly(b)
        if self.draft_sampling not in (None, "probabilistic", "greedy"):
            raise ValueError(f"draft_sampling: expected None, 'probabilistic' or 'greedy', got {self.draft_sampling!r}")
        if self.draft_sampling is not None and self.draft_logits is None:
            raise ValueError("draft_sampling: the backend's drafter needs draft_logits")
        if self.processing not in (None, "vllm", "vllm-sort"):
            raise ValueError(f"processing: expected None, 'vllm' or 'vllm-sort', got {self.processing!r}")
        synthetic = self.methods == Method.SYNTHETIC
        if synthetic.any():
            rates = self.synthetic_rates
            if rates is None or rates.shape != (b, self.max_drafts):
                raise ValueError(f"synthetic_rates: synthetic requests need rates of shape [{b}, {self.max_drafts}]")
            r = rates[synthetic]
            if not np.all((r >= 0) & (r <= 1)):
                raise ValueError("synthetic_rates: conditional rates must lie in [0, 1]")
        return self

    def _validate_typical(self, b: int) -> None:
        eps, delta = self.posterior_threshold, self.posterior_alpha
        typical = bool((self.methods == Method.TYPICAL).any())
        if (eps is None) != (delta is None) or (eps is None) == typical:
            raise ValueError("posterior_threshold, posterior_alpha: given (both [B]) exactly when some request is typical acceptance")
        for name, value in (("posterior_threshold", eps), ("posterior_alpha", delta)):
            if value is None:
                continue
            value = np.asarray(value)
            if value.shape != (b,) or not np.issubdtype(value.dtype, np.floating):
                raise ValueError(f"{name}: expected [{b}] floats, got shape {value.shape} dtype {value.dtype}")
            if not np.all(np.isfinite(value) & (value >= 0)):
                raise ValueError(f"{name}: every value must be finite and >= 0")

    def _validate_fly(self, b: int) -> None:
        names = ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
        values = [getattr(self, name) for name in names]
        fly = bool((self.methods == Method.FLY).any())
        if any((v is None) == fly for v in values):
            raise ValueError(f"{', '.join(names)}: given (all three [B]) exactly when some request is FLy")
        if not fly:
            return
        for name, value, integral, ok, what in (
            (names[0], values[0], True, lambda x: x >= 1, "integers >= 1"),
            (names[1], values[1], False, lambda x: np.isfinite(x) & (x >= 0), "finite floats >= 0"),
            (names[2], values[2], True, lambda x: x >= 1, "integers >= 1"),
        ):
            value = np.asarray(value)
            kind = np.integer if integral else np.floating
            if value.shape != (b,) or not np.issubdtype(value.dtype, kind) or not np.all(ok(value)):
                raise ValueError(f"{name}: expected [{b}] {what}, got shape {value.shape} dtype {value.dtype}")

    def _validate_logit_bias(self, b: int) -> None:
        ids, bias = self.logit_bias_ids, self.logit_bias
        if ids is None and bias is None:
            return
        if ids is None or bias is None:
            raise ValueError("logit_bias: logit_bias_ids and logit_bias come together (both None, or both [B, L])")
        if ids.ndim != 2 or ids.shape[0] != b or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"logit_bias_ids: expected [{b}, L] integers, got shape {ids.shape} dtype {ids.dtype}")
        if bias.shape != ids.shape or not np.issubdtype(bias.dtype, np.floating):
            raise ValueError(f"logit_bias: expected floats of logit_bias_ids' shape {ids.shape}, got shape {bias.shape} dtype {bias.dtype}")
        outside = (ids < -1) | (ids >= self.vocab_size)
        if outside.any():
            raise ValueError(f"logit_bias_ids: id {ids[outside][0]} is outside [0, {self.vocab_size}) and not the padding -1")
        ordered = np.sort(ids, axis=1)
        twice = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
        if twice.any():
            r, c = np.argwhere(twice)[0]
            raise ValueError(f"logit_bias_ids: request {r} gives token {ordered[r, c]} more than one bias")
        used = bias[ids >= 0].astype(np.float64)
        if np.isnan(used).any() or np.isposinf(used).any() or (np.abs(used[np.isfinite(used)]) > np.finfo(np.float32).max).any():
            raise ValueError("logit_bias: biases must be finite in float32 or -inf (which masks a token); NaN and +inf are not allowed")

    def to_torch(self, device: str = "cpu") -> dict:
        """The fields as torch tensors on ``device`` (None stays None).

        Parameters
        ----------
        device : str, default "cpu"
            Torch device the tensors are moved to, e.g. ``"cuda"``.

        Returns
        -------
        dict
            Field name to value: every array field as a torch tensor of the same dtype on
            ``device`` (NumPy arrays are made contiguous and converted; tensors of a device
            batch are moved), every other field (``max_drafts``, ``logits_dtype``,
            ``method_codes``, ``processing``, a None array field) unchanged.
        """
        import torch

        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                value = torch.from_numpy(np.ascontiguousarray(value))
            out[f.name] = value.to(device) if isinstance(value, torch.Tensor) else value
        return out


def host(x) -> np.ndarray:
    """A small field (methods, seeds, rates) as a NumPy array, whether the batch holds arrays
    or device tensors (a device batch, see ``harness.sampling.device.trials``).

    Parameters
    ----------
    x : ndarray, torch.Tensor or array_like
        The field's value; anything with a ``cpu()`` method is copied to the host.

    Returns
    -------
    ndarray
        The values, with their dtype kept; for a device tensor this is a device sync.
    """
    return x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)


def method_codes(batch: VerifyBatch) -> np.ndarray:
    """The distinct method codes of a batch, sorted: ``batch.method_codes`` when its builder
    gave them, else read from ``methods`` (for a device batch, a device sync).

    Parameters
    ----------
    batch : VerifyBatch
        A host or device batch.

    Returns
    -------
    ndarray, shape (num_codes,)
        The distinct ``reference.methods.Method`` codes, ascending (int8 when taken from
        ``method_codes``, else ``methods``' dtype).
    """
    if batch.method_codes is not None:
        return np.unique(np.asarray(batch.method_codes, dtype=np.int8))
    return np.unique(host(batch.methods))


def checked_outputs(result, num_requests: int, max_drafts: int):
    """``(tokens, num_emitted)`` of a backend's return value (arrays or tensors, left where
    they are), raising ``ValueError`` naming what is malformed.

    Only the structure is checked: a 2-tuple and the two shapes. Dtypes and values are not
    (see ``check_integer_outputs``).

    Parameters
    ----------
    result : object
        What ``Backend.sample`` returned.
    num_requests : int
        ``B``, the batch's number of requests.
    max_drafts : int
        ``K``, the batch's ``max_drafts``.

    Returns
    -------
    tokens : array_like, shape (num_requests, max_drafts + 1)
        The first element of ``result``, unchanged (a NumPy array, torch or CuPy tensor).
    num_emitted : array_like, shape (num_requests,)
        The second element of ``result``, unchanged.

    Raises
    ------
    ValueError
        If ``result`` is not a 2-tuple or either element has the wrong shape.
    """
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ValueError("backend output: expected a (tokens, num_emitted) tuple")
    tokens, emitted = result
    shape = tuple(tokens.shape) if hasattr(tokens, "shape") else np.shape(tokens)
    if shape != (num_requests, max_drafts + 1):
        raise ValueError(f"backend output: tokens shape {shape}, expected {(num_requests, max_drafts + 1)}")
    shape = tuple(emitted.shape) if hasattr(emitted, "shape") else np.shape(emitted)
    if shape != (num_requests,):
        raise ValueError(f"backend output: num_emitted shape {shape}, expected {(num_requests,)}")
    return tokens, emitted


def as_numpy_drafted_outputs(result, num_requests: int, max_drafts: int, num_drafts: int):
    """``as_numpy_outputs`` for a batch the backend drafted itself (``draft_sampling``): a
    ``(tokens, num_emitted, drafts)`` tuple, ``drafts`` ``[num_drafts]`` integer ids.

    Parameters
    ----------
    result : object
        What ``Backend.sample`` returned.
    num_requests, max_drafts, num_drafts : int
        ``B``, ``K`` and ``D`` of the batch.

    Returns
    -------
    tokens, num_emitted, drafts : ndarray of int64
        As ``as_numpy_outputs``, and the drafts the backend drew.

    Raises
    ------
    ValueError
        If ``result`` is not a 3-tuple or an element has the wrong shape.
    MalformedOutputs
        If an element is not an integer array.
    """
    if not (isinstance(result, tuple) and len(result) == 3):
        raise ValueError("backend output: a batch the backend drafts needs a (tokens, num_emitted, drafts) tuple")
    tokens, emitted = as_numpy_outputs(result[:2], num_requests, max_drafts)
    drafts = result[2].cpu() if hasattr(result[2], "cpu") else result[2]
    shape = tuple(drafts.shape) if hasattr(drafts, "shape") else np.shape(drafts)
    if shape != (num_drafts,):
        raise ValueError(f"backend output: drafts shape {shape}, expected {(num_drafts,)}")
    try:
        check_integer_outputs(drafts, emitted)
    except MalformedOutputs as e:
        raise MalformedOutputs(str(e).replace("tokens:", "drafts:", 1)) from None
    return tokens, emitted, np.asarray(drafts).astype(np.int64)


class MalformedOutputs(ValueError):
    """A backend returned outputs of the right shapes that are not token ids (``reason``).

    Raised by ``check_integer_outputs`` (and so ``as_numpy_outputs``) with the reason as its
    message; a ``ValueError``, so callers that catch shape errors catch it too. The runner
    then counts every trial it was sampling for those templates as a structure failure.
    """


# Integer dtypes whose every value converts to int64 unchanged (uint64 only where its values fit).
_TORCH_INTEGERS = ("torch.int8", "torch.int16", "torch.int32", "torch.int64", "torch.uint8", "torch.uint16", "torch.uint32")


def check_integer_outputs(tokens, emitted) -> None:
    """Raise ``MalformedOutputs`` naming the array unless both are integer arrays whose
    values fit int64: a float id truncated to an integer would otherwise pass.

    Parameters
    ----------
    tokens : ndarray or torch.Tensor
        The backend's tokens (any shape: shapes are ``checked_outputs``' concern). A NumPy
        array must have a signed or unsigned integer dtype, uint64 only where its values fit
        int64; a torch tensor one of int8, int16, int32, int64, uint8, uint16 or uint32.
        Other array types (CuPy) are held to the NumPy rule through their ``dtype``.
    emitted : ndarray or torch.Tensor
        The backend's ``num_emitted``, held to the same rule.

    Returns
    -------
    None
        Returns normally when both are well-formed.

    Raises
    ------
    MalformedOutputs
        If either has no ``dtype`` and ``shape`` (a list, a scalar), a dtype that is not an
        integer one, or a uint64 value above the int64 maximum.
    """
    for name, x in (("tokens", tokens), ("num_emitted", emitted)):
        dtype = getattr(x, "dtype", None)
        if dtype is None or not hasattr(x, "shape"):
            raise MalformedOutputs(f"{name}: {type(x).__name__}, expected an integer array")
        if type(x).__module__.startswith("torch"):
            if str(dtype) not in _TORCH_INTEGERS:
                raise MalformedOutputs(f"{name}: dtype {dtype}, expected an integer array")
            continue
        dtype = np.dtype(dtype)
        if dtype.kind not in "iu":
            raise MalformedOutputs(f"{name}: dtype {dtype}, expected an integer array")
        if dtype == np.uint64 and x.size and int(x.max()) > np.iinfo(np.int64).max:
            raise MalformedOutputs(f"{name}: value {int(x.max())} (uint64) is no token id or count")


def as_numpy_outputs(result, num_requests: int, max_drafts: int) -> tuple[np.ndarray, np.ndarray]:
    """A backend's return value as host int64 arrays, naming what is malformed
    (``ValueError`` for shapes, ``MalformedOutputs`` for values that are not integers).

    Anything with a ``cpu()`` method (a torch tensor) is copied to the host first; a non-array element (a list) is converted with
    ``np.asarray`` after its shape is checked, and then fails the dtype check unless it is
    integer.

    Parameters
    ----------
    result : object
        What ``Backend.sample`` returned: a ``(tokens, num_emitted)`` tuple.
    num_requests : int
        ``B``, the batch's number of requests.
    max_drafts : int
        ``K``, the batch's ``max_drafts``.

    Returns
    -------
    tokens : ndarray of int64, shape (num_requests, max_drafts + 1)
        The emitted tokens (slots past ``num_emitted`` as the backend left them).
    num_emitted : ndarray of int64, shape (num_requests,)
        Tokens emitted per request.

    Raises
    ------
    ValueError
        If ``result`` is not a 2-tuple or an element has the wrong shape (``checked_outputs``).
    MalformedOutputs
        If an element is not an integer array whose values fit int64
        (``check_integer_outputs``).
    """
    tokens, emitted = (x.cpu() if hasattr(x, "cpu") else x for x in checked_outputs(result, num_requests, max_drafts))
    tokens, emitted = (x if hasattr(x, "dtype") else np.asarray(x) for x in (tokens, emitted))
    check_integer_outputs(tokens, emitted)
    return np.asarray(tokens).astype(np.int64), np.asarray(emitted).astype(np.int64)
