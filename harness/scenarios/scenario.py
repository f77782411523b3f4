"""Scenarios: serializable descriptions of what to verify, materialized from a seed.

A scenario is pure data (JSON): a method, a vocabulary, request templates (draft count,
temperature, target and draft distribution families, an optional placeholder) and a seed.
``materialize`` turns it into float32 logits per template, deterministically; ``trials``
repeats the templates into a ``VerifyBatch`` of independent trials, each request with its
own seed and positions. The laws are computed from the same rounded logits the backend
sees, so rounding cannot masquerade as a bias.

Every field is checked on construction (``ValueError`` naming the field) against the
limits below, before anything is allocated: a bad file is a usage error, never a
``MemoryError`` or a run that does not end.
"""

import json
import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from reference import fly, typical
from reference import synthetic as synth
from reference.methods import Method
from reference.processing import MAX_TEMPERATURE as MAX_PROCESSED_TEMPERATURE
from reference.processing import MIN_TEMPERATURE as MIN_PROCESSED_TEMPERATURE
from reference.processing import SamplingParams

TARGET_FAMILIES = ("peaked", "flat", "heavy-tail", "topk", "tied")
DRAFT_FAMILIES = TARGET_FAMILIES + ("near-target", "disjoint", "same", "offset")
METHOD_NAMES = ("greedy", "strict", "standard", "block", "synthetic", "typical", "fly")
# reference.processing engines whose top-k/top-p rules differ at exact ties: vLLM's Triton
# kernel (exactly k, ties to the lowest ids) and its sort path (every tie at the k-th value).
PROCESSING = ("vllm", "vllm-sort")
# Who draws the drafts: the suite, once per template ("fixed") or per trial ("sampled"), or
# the backend's own drafter ("engine"), from q or, with draft_sampling "greedy", its argmax.
DRAFT_MODES = ("fixed", "sampled", "engine")
DRAFT_SAMPLING = ("probabilistic", "greedy")
POSITION_RANGE = 1 << 20  # request start positions are spread over this range

# Limits of a scenario (see ``Scenario``).
# A name is the output file ``scenarios/NAME.json``: no separators, never "." or "..".
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_VOCAB = 1 << 21  # 8x the largest vocabularies engines ship (262,144); ids far inside int32
MAX_DRAFTS = 32  # drafts per request: more than engines verify per step (a handful to ~10)
MAX_REQUESTS = 256  # request templates: each adds its own laws and checks, and a request to every trial
# Target logits of one trial of every template, sum of (d + 1) * V: one float64 copy of
# the laws' rows (the reference holds a few) then takes 512 MiB, the float32 logits 256 MiB.
MAX_TRIAL_ELEMENTS = 1 << 26
MIN_TEMPERATURE = 1e-5  # smallest positive temperature: engines sample greedily below it (vLLM's _SAMPLING_EPS)
MAX_TEMPERATURE = 1e4  # every family's row is then uniform to 0.4% (logit spans < 40): hotter tests nothing more
MAX_SEED = (1 << 63) - 1  # seeds are int64 on the device and in the history (SQLite); NumPy's hash fails past 2**64
MAX_TAGS, MAX_TAG_CHARS = 64, 128
MAX_SCENARIO_BYTES = 1 << 23  # a scenario file: a valid one is under 1 MiB even indented; parsing more costs ~12x in memory
# A request's logit biases: finite (JSON has no -inf), at most the magnitude vLLM's OpenAI
# server lets through (``SamplingParams.from_optional`` clamps to [-100, 100]). -100 leaves a
# token at most e**-50 of its mass at T <= 2; the float32 sum l + b (engines add in float32)
# stays within 2**-17 of the float64 one the laws use.
MAX_LOGIT_BIAS = 100.0
_INT_KEY = re.compile(r"-?[0-9]{1,20}")


@dataclass(frozen=True)
class RequestSpec:
    num_drafts: int
    temperature: float = 1.0
    target: str = "peaked"
    draft: str = "near-target"
    placeholder_at: int | None = None  # draft index replaced by the placeholder -1
    method: str | None = None  # overrides the scenario's method (mixed batches)
    draft_ids: tuple[int, ...] | None = None  # explicit fixed drafts (may have target or draft probability 0)
    nan_rows: tuple[int, ...] = ()  # target rows (0..d) poisoned with a NaN: degenerate
    masked_rows: tuple[int, ...] = ()  # target rows with every logit -inf: degenerate
    stationary: bool = False  # one target row and one draft row at every step (a fixed context)
    top_k: int | None = None  # the request's sampling parameters, applied to the target's raw logits
    top_p: float | None = None  # (reference.processing; None = disabled)
    min_p: float | None = None
    # token id -> additive bias on the raw target logits, before temperature (vLLM's
    # SamplingParams.logit_bias); a mapping is stored as (id, bias) pairs sorted by id
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        bias = self.logit_bias  # a malformed one is kept, for the scenario's validation to name what is wrong
        if isinstance(bias, Mapping):
            bias = tuple(bias.items())
        elif isinstance(bias, list):
            bias = tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in bias)
        if isinstance(bias, tuple) and all(isinstance(p, tuple) and len(p) == 2 and _is_int(p[0]) for p in bias):
            bias = tuple(sorted(bias, key=lambda p: p[0]))
        object.__setattr__(self, "logit_bias", bias)

    @property
    def degenerate(self) -> bool:
        return bool(self.nan_rows or self.masked_rows)

    @property
    def sampling_params(self) -> SamplingParams | None:
        """The request's top-k / top-p / min-p / logit bias with its temperature, or None when
        none is set."""
        if self.top_k is None and self.top_p is None and self.min_p is None and not self.logit_bias:
            return None
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.logit_bias)


@dataclass(frozen=True)
class Scenario:
    """One scenario; invalid fields raise ``ValueError`` naming the field.

    ``name``: 1 to 128 characters from ``[A-Za-z0-9._-]``, the first a letter or digit
    (``NAME_PATTERN``): it names the output file ``scenarios/NAME.json``, so it holds no path
    separator and is never ``.`` or ``..``. Sizes: ``vocab_size`` in [2, ``MAX_VOCAB``], at
    most ``MAX_REQUESTS`` request templates of at most ``MAX_DRAFTS`` drafts each, one trial's
    target logits (sum of (d + 1) * V) at most ``MAX_TRIAL_ELEMENTS``; temperatures 0 or in
    [``MIN_TEMPERATURE``, ``MAX_TEMPERATURE``]; ``seed`` in [0, ``MAX_SEED``]; at most
    ``MAX_TAGS`` tags of at most ``MAX_TAG_CHARS`` characters.
    """

    name: str
    method: str
    vocab_size: int
    requests: tuple[RequestSpec, ...]
    draft_vocab_size: int | None = None
    draft_probs: bool = True  # the verifier receives draft logits
    draft_mode: str = "fixed"  # "fixed": drawn once from the draft rows; "sampled": per trial; "engine": by the backend
    draft_sampling: str = "probabilistic"  # "engine" drafts: from q ("probabilistic") or its argmax ("greedy")
    synthetic: dict | None = None  # {"mean_rate": r} | {"rates": [...]} | {"acceptance_length": L}
    seed: int = 0
    tags: tuple[str, ...] = field(default=())
    dtype: str = "float32"  # logits are rounded to this dtype (laws use the rounded values)
    slots: str = "identity"  # "permuted": requests sit at scattered slots of a larger state table
    positions: str = "random"  # "aligned": every trial at positions 0..d, as engines' own tests do
    processing: str = "vllm"  # whose top-k/top-p rules the law follows at exact ties (PROCESSING)
    # typical acceptance's epsilon and delta (reference.typical; None: vLLM V0's 0.09 and 0.3),
    # set only when a request's method is "typical"; left out of the JSON when None
    posterior_threshold: float | None = None
    posterior_alpha: float | None = None
    # FLy's window, entropy threshold and entropy top-k (reference.fly; None: vLLM's defaults
    # min(6, K - 1), 0.3 and 3), set only when a request's method is "fly"; left out of the JSON when None
    fly_window_size: int | None = None
    fly_entropy_threshold: float | None = None
    fly_entropy_top_k: int | None = None

    def __post_init__(self):
        _validate(self)

    @property
    def max_drafts(self) -> int:
        return max(r.num_drafts for r in self.requests)

    @property
    def verify_method(self) -> Method:
        return _method(self.method)

    def request_method(self, spec: RequestSpec) -> Method:
        return _method(spec.method or self.method)

    @property
    def lossless(self) -> bool:
        return self.verify_method.lossless

    @property
    def typical_params(self) -> tuple[float, float]:
        """``(posterior_threshold, posterior_alpha)`` of typical requests, V0's defaults for None."""
        return (
            typical.DEFAULT_POSTERIOR_THRESHOLD if self.posterior_threshold is None else float(self.posterior_threshold),
            typical.DEFAULT_POSTERIOR_ALPHA if self.posterior_alpha is None else float(self.posterior_alpha),
        )

    @property
    def fly_params(self) -> tuple[int, float, int]:
        """``(window, entropy_threshold, entropy_top_k)`` of FLy requests, vLLM's defaults for None
        (the window ``min(6, K - 1)`` of ``K = max_drafts``, at least 1)."""
        return (
            fly.default_window(self.max_drafts) if self.fly_window_size is None else int(self.fly_window_size),
            fly.DEFAULT_ENTROPY_THRESHOLD if self.fly_entropy_threshold is None else float(self.fly_entropy_threshold),
            fly.DEFAULT_ENTROPY_TOP_K if self.fly_entropy_top_k is None else int(self.fly_entropy_top_k),
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in _OPTIONAL_FIELDS:  # scenarios without them keep their JSON
            if d[name] is None:
                del d[name]
        d["requests"] = [_request_dict(r) for r in self.requests]
        d["tags"] = list(self.tags)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data) -> "Scenario":
        if not isinstance(data, dict):
            raise ValueError(f"scenario: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"scenario: unknown field(s) {_brief(sorted(unknown, key=str))}")
        missing = {"name", "method", "vocab_size", "requests"} - set(data)
        if missing:
            raise ValueError(f"scenario: missing field(s) {sorted(missing)}")
        reqs = data["requests"]
        if not isinstance(reqs, list) or not 1 <= len(reqs) <= MAX_REQUESTS:  # the count first: nothing built yet
            got = f"{len(reqs)} of them" if isinstance(reqs, list) else _brief(reqs)
            raise ValueError(f"scenario.requests: expected a list of 1 to {MAX_REQUESTS} request objects, got {got}")
        tags = data.get("tags", [])
        if not isinstance(tags, list):  # a string would become its characters
            raise ValueError(f"scenario.tags: expected a list of strings, got {_brief(tags)}")
        specs = []
        req_fields = {f.name for f in fields(RequestSpec)}
        for i, r in enumerate(reqs):
            if not isinstance(r, dict) or set(r) - req_fields or "num_drafts" not in r:
                raise ValueError(f"scenario.requests[{i}]: expected an object with num_drafts and only {sorted(req_fields)}")
            for k in ("draft_ids", "nan_rows", "masked_rows"):
                if k in r and not isinstance(r[k], list) and not (k == "draft_ids" and r[k] is None):
                    raise ValueError(f"scenario.requests[{i}].{k}: expected a list of integers, got {_brief(r[k])}")
            tuples = {k: tuple(v) for k, v in r.items() if k in ("draft_ids", "nan_rows", "masked_rows") and isinstance(v, list)}
            if "logit_bias" in r:
                tuples["logit_bias"] = _bias_from_json(f"scenario.requests[{i}].logit_bias", r["logit_bias"])
            specs.append(RequestSpec(**{**r, **tuples}))
        return cls(**{**data, "requests": tuple(specs), "tags": tuple(tags)})

    @classmethod
    def from_json(cls, text: str) -> "Scenario":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"scenario JSON: {e}") from None
        except RecursionError:
            raise ValueError("scenario JSON: nested too deeply") from None
        return cls.from_dict(data)


# Method parameters left out of a scenario's JSON when None (scenarios without them keep theirs).
_OPTIONAL_FIELDS = ("posterior_threshold", "posterior_alpha", "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")


def _request_dict(r: RequestSpec) -> dict:
    """A request as JSON data: tuples as lists, the logit bias as an object ``{"id": bias}``
    (JSON's keys are strings, as in OpenAI's ``logit_bias``), left out when empty."""
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(r).items() if k != "logit_bias"}
    if r.logit_bias:
        d["logit_bias"] = {str(token): bias for token, bias in r.logit_bias}
    return d


def _bias_from_json(where: str, value) -> dict:
    """A JSON logit bias (an object of decimal-integer keys) as ``{int: value}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object of token id -> bias, got {_brief(value)}")
    out = {}
    for key, bias in value.items():
        if isinstance(key, str) and _INT_KEY.fullmatch(key):
            out[int(key)] = bias
        elif _is_int(key):
            out[key] = bias
        else:
            raise ValueError(f"{where}: token ids are integers (decimal strings in JSON), got key {_brief(key)}")
    return out


def read_scenario_file(path: str) -> Scenario:
    """The scenario in a JSON file, refused unparsed past ``MAX_SCENARIO_BYTES`` (a pipe or
    device included: at most that much is read). ``OSError`` when it cannot be read."""
    with open(path, "rb") as f:
        data = f.read(MAX_SCENARIO_BYTES + 1)
    if len(data) > MAX_SCENARIO_BYTES:
        raise ValueError(f"scenario file: more than {MAX_SCENARIO_BYTES} bytes, larger than any valid scenario")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"scenario JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    return Scenario.from_json(text)


def check_seed(value, field: str = "seed") -> int:
    """``value`` when it is an integer in [0, ``MAX_SEED``], else ``ValueError`` naming ``field``."""
    if not _is_int(value) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"{field}: expected an integer in [0, 2**63 - 1], got {_brief(value)}")
    return value


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40


def _brief(x, limit: int = 60) -> str:
    """A short ``repr(x)`` (``reprlib``: a few items of a long list, never all): one short line."""
    text = _REPR.repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _method(name: str) -> Method:
    return Method.STANDARD if name == "greedy" else Method.parse(name)


DTYPES = ("float32", "bfloat16", "float16")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int_list(x) -> bool:
    return isinstance(x, (tuple, list)) and all(_is_int(v) for v in x)


def _validate(s: Scenario) -> None:
    if not isinstance(s.name, str) or not NAME_PATTERN.fullmatch(s.name):
        raise ValueError(
            f"scenario.name: expected 1 to 128 of [A-Za-z0-9._-], the first a letter or digit (it names a file), got {_brief(s.name)}"
        )
    if s.method not in METHOD_NAMES:
        raise ValueError(f"scenario.method: {_brief(s.method)} is not one of {METHOD_NAMES}")
    if not _is_int(s.vocab_size) or not 2 <= s.vocab_size <= MAX_VOCAB:
        raise ValueError(f"scenario.vocab_size: expected an integer in [2, {MAX_VOCAB}], got {_brief(s.vocab_size)}")
    if s.draft_vocab_size is not None and not (_is_int(s.draft_vocab_size) and 2 <= s.draft_vocab_size <= s.vocab_size):
        raise ValueError(f"scenario.draft_vocab_size: expected an integer in [2, vocab_size], got {_brief(s.draft_vocab_size)}")
    if s.draft_mode not in DRAFT_MODES:
        raise ValueError(f"scenario.draft_mode: expected one of {DRAFT_MODES}, got {_brief(s.draft_mode)}")
    if s.draft_sampling not in DRAFT_SAMPLING:
        raise ValueError(f"scenario.draft_sampling: expected one of {DRAFT_SAMPLING}, got {_brief(s.draft_sampling)}")
    if s.draft_sampling != "probabilistic" and s.draft_mode != "engine":
        raise ValueError("scenario.draft_sampling: greedy drafting is the backend's drafter's: it needs draft_mode 'engine'")
    if s.draft_mode == "engine" and s.draft_probs is not True:
        raise ValueError("scenario.draft_probs: the backend's drafter draws from the draft logits: draft_mode 'engine' needs true")
    check_seed(s.seed, "scenario.seed")
    if not isinstance(s.draft_probs, bool):
        raise ValueError("scenario.draft_probs: expected true or false")
    if s.dtype not in DTYPES:
        raise ValueError(f"scenario.dtype: expected one of {DTYPES}, got {_brief(s.dtype)}")
    if s.slots not in ("identity", "permuted"):
        raise ValueError(f"scenario.slots: expected 'identity' or 'permuted', got {_brief(s.slots)}")
    if s.processing not in PROCESSING:
        raise ValueError(f"scenario.processing: expected one of {PROCESSING}, got {_brief(s.processing)}")
    if s.positions not in ("random", "aligned"):
        raise ValueError(f"scenario.positions: expected 'random' or 'aligned', got {_brief(s.positions)}")
    tags = s.tags
    if not isinstance(tags, (tuple, list)) or len(tags) > MAX_TAGS or not all(isinstance(t, str) and len(t) <= MAX_TAG_CHARS for t in tags):
        raise ValueError(f"scenario.tags: expected at most {MAX_TAGS} strings of at most {MAX_TAG_CHARS} characters, got {_brief(tags)}")
    if not isinstance(s.requests, (tuple, list)) or not 1 <= len(s.requests) <= MAX_REQUESTS:
        got = f"{len(s.requests)} of them" if isinstance(s.requests, (tuple, list)) else _brief(s.requests)
        raise ValueError(f"scenario.requests: expected 1 to {MAX_REQUESTS} request templates, got {got}")
    for i, r in enumerate(s.requests):
        where = f"scenario.requests[{i}]"
        if not isinstance(r, RequestSpec):
            raise ValueError(f"{where}: expected a RequestSpec, got {type(r).__name__}")
        if not _is_int(r.num_drafts) or not 0 <= r.num_drafts <= MAX_DRAFTS:  # first: the checks below use it
            raise ValueError(f"{where}.num_drafts: expected an integer in [0, {MAX_DRAFTS}], got {_brief(r.num_drafts)}")
        if r.method is not None and r.method not in METHOD_NAMES:  # "" or 0 would fall back to the scenario's
            raise ValueError(f"{where}.method: {_brief(r.method)} is not one of {METHOD_NAMES}")
        method = r.method or s.method
        if method == "synthetic" and s.synthetic is None:
            raise ValueError(f"{where}.method: synthetic requests need scenario.synthetic parameters")
        if r.draft_ids is not None:
            ids = r.draft_ids
            if s.draft_mode != "fixed" or not _is_int_list(ids) or len(ids) != r.num_drafts or not all(-1 <= x < s.vocab_size for x in ids):
                raise ValueError(
                    f"{where}.draft_ids: expected {r.num_drafts} ids in [-1, {s.vocab_size}) with fixed drafts, got {_brief(ids)}"
                )
        for name in ("nan_rows", "masked_rows"):
            rows = getattr(r, name)
            if not _is_int_list(rows) or not all(0 <= x <= r.num_drafts for x in rows) or len(set(rows)) != len(rows):
                raise ValueError(f"{where}.{name}: expected distinct target row indices in [0, {r.num_drafts}], got {_brief(rows)}")
        t = r.temperature
        if not _is_number(t) or not (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            raise ValueError(f"{where}.temperature: expected 0 or a number in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {_brief(t)}")
        if method == "greedy" and t != 0:
            raise ValueError(f"{where}.temperature: greedy scenarios need temperature 0, got {t!r}")
        if r.target not in TARGET_FAMILIES:
            raise ValueError(f"{where}.target: {_brief(r.target)} is not one of {TARGET_FAMILIES}")
        if r.draft not in DRAFT_FAMILIES:
            raise ValueError(f"{where}.draft: {_brief(r.draft)} is not one of {DRAFT_FAMILIES}")
        if not isinstance(r.stationary, bool):
            raise ValueError(f"{where}.stationary: expected true or false, got {_brief(r.stationary)}")
        _validate_sampling_params(where, r, s.vocab_size)
        if r.placeholder_at is not None:
            if not _is_int(r.placeholder_at) or not 0 <= r.placeholder_at < r.num_drafts:
                raise ValueError(f"{where}.placeholder_at: expected a draft index in [0, {r.num_drafts}), got {_brief(r.placeholder_at)}")
            if s.draft_mode != "fixed":
                raise ValueError(f"{where}.placeholder_at: placeholders need fixed drafts")
    uses_typical = any((r.method or s.method) == "typical" for r in s.requests)
    for name in ("posterior_threshold", "posterior_alpha"):
        value = getattr(s, name)
        if value is None:
            continue
        if not uses_typical:
            raise ValueError(f"scenario.{name}: set only when a request's method is 'typical', got {_brief(value)}")
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise ValueError(f"scenario.{name}: expected a finite number >= 0 (vLLM V0 refuses negative values), got {_brief(value)}")
    _validate_fly(s)
    elements = sum(r.num_drafts + 1 for r in s.requests) * s.vocab_size
    if elements > MAX_TRIAL_ELEMENTS:
        raise ValueError(
            f"scenario.requests: one trial's target logits, sum of (num_drafts + 1) * vocab_size = {elements}, exceed {MAX_TRIAL_ELEMENTS}"
        )
    uses_synthetic = any((r.method or s.method) == "synthetic" for r in s.requests)
    if uses_synthetic != (s.synthetic is not None):
        raise ValueError("scenario.synthetic: required exactly when a request's method is 'synthetic'")
    if s.synthetic is not None:
        keys = set(s.synthetic) if isinstance(s.synthetic, dict) else set()
        if len(keys) != 1 or not keys <= {"mean_rate", "rates", "acceptance_length"}:
            raise ValueError("scenario.synthetic: expected one of {'mean_rate': r}, {'rates': [...]}, {'acceptance_length': L}")
        (key,) = keys
        value = s.synthetic[key]
        if not (_is_number(value) if key != "rates" else isinstance(value, (tuple, list)) and all(_is_number(x) for x in value)):
            raise ValueError(
                f"scenario.synthetic.{key}: expected {'a list of numbers' if key == 'rates' else 'a number'}, got {_brief(value)}"
            )
        if key == "mean_rate" and not 0 <= value <= 1:  # checked here too: no closed form runs without drafts
            raise ValueError(f"scenario.synthetic.mean_rate: expected a rate in [0, 1], got {value!r}")
        try:
            conditional_rates(s)  # raises with the reason when the parameters are invalid
        except ValueError as e:  # the closed forms name their parameter ("rates: ..."): name it in full
            raise ValueError(str(e) if str(e).startswith("scenario.") else f"scenario.synthetic.{e}") from None


def _validate_fly(s: Scenario) -> None:
    """FLy's parameters: set only with a FLy request, each in vLLM's range; FLy requests draw
    their drafts in the suite, and a greedy one sets no sampling parameter (its entropy gate
    reads the logits at T = 1, which V1 processes only in a batch with sampled requests)."""
    fly_requests = [(i, r) for i, r in enumerate(s.requests) if (r.method or s.method) == "fly"]
    checks = (
        ("fly_window_size", lambda v: _is_int(v) and 1 <= v <= fly.MAX_WINDOW, f"an integer in [1, {fly.MAX_WINDOW}]"),
        ("fly_entropy_threshold", lambda v: _is_number(v) and math.isfinite(v) and v >= 0, "a finite number >= 0"),
        ("fly_entropy_top_k", lambda v: _is_int(v) and 1 <= v <= MAX_VOCAB, f"an integer in [1, {MAX_VOCAB}]"),
    )
    for name, ok, what in checks:
        value = getattr(s, name)
        if value is None:
            continue
        if not fly_requests:
            raise ValueError(f"scenario.{name}: set only when a request's method is 'fly', got {_brief(value)}")
        if not ok(value):
            raise ValueError(f"scenario.{name}: expected {what} (vLLM's range), got {_brief(value)}")
    if fly_requests and s.draft_mode == "engine":
        raise ValueError("scenario.draft_mode: FLy requests verify drafts the suite draws ('fixed' or 'sampled'), not 'engine'")
    for i, r in fly_requests:
        if r.temperature == 0 and r.sampling_params is not None:
            raise ValueError(
                f"scenario.requests[{i}].temperature: a greedy FLy request sets no top_k, top_p, min_p or logit_bias "
                "(its entropy gate reads the logits at T = 1, which vLLM V1 processes only in a batch with sampled requests)"
            )


def _validate_sampling_params(where: str, r: RequestSpec, vocab: int) -> None:
    k, p, m = r.top_k, r.top_p, r.min_p
    if k is not None and (not _is_int(k) or k < 1):
        raise ValueError(f"{where}.top_k: expected null (disabled) or an integer >= 1, got {_brief(k)}")
    if p is not None and (not _is_number(p) or not 0 < p <= 1):
        raise ValueError(f"{where}.top_p: expected null (disabled) or a number in (0, 1], got {_brief(p)}")
    if m is not None and (not _is_number(m) or not 0 <= m <= 1):
        raise ValueError(f"{where}.min_p: expected null (disabled) or a number in [0, 1], got {_brief(m)}")
    _validate_logit_bias(f"{where}.logit_bias", r.logit_bias, vocab)
    t = r.temperature
    if r.sampling_params is not None and _is_number(t) and t != 0 and not MIN_PROCESSED_TEMPERATURE <= t <= MAX_PROCESSED_TEMPERATURE:
        raise ValueError(
            f"{where}.temperature: with top_k, top_p, min_p or logit_bias, expected 0 or a number in "
            f"[{MIN_PROCESSED_TEMPERATURE:g}, {MAX_PROCESSED_TEMPERATURE:g}] (the temperatures vLLM applies them at), got {t!r}"
        )


def _validate_logit_bias(where: str, pairs, vocab: int) -> None:
    """(token id, bias) pairs, as ``RequestSpec`` stores a mapping: ids in [0, vocab), each
    once, biases finite numbers in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]."""
    if not isinstance(pairs, tuple) or not all(isinstance(pair, tuple) and len(pair) == 2 for pair in pairs):
        raise ValueError(f"{where}: expected a mapping of token id -> bias, got {_brief(pairs)}")
    seen = set()
    for token, bias in pairs:
        if not _is_int(token):
            raise ValueError(f"{where}: token ids are integers, got {_brief(token)}")
        if not 0 <= token < vocab:
            raise ValueError(f"{where}: token id {token} is outside the vocabulary [0, {vocab})")
        if token in seen:
            raise ValueError(f"{where}: token {token} has more than one bias")
        seen.add(token)
        if not _is_number(bias) or not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
            raise ValueError(
                f"{where}: the bias of token {token} must be a finite number in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}] "
                f"(the range vLLM's OpenAI server lets through), got {_brief(bias)}"
            )


def did_you_mean(name: str, known, prefix: str = "") -> str:
    """``"; did you mean 'X'?"`` for the closest of ``known`` names (``prefix`` + it), or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def conditional_rates(s: Scenario) -> np.ndarray:
    """Synthetic conditional acceptance rates for steps 0..K-1 (zeros when not synthetic)."""
    k = s.max_drafts
    if s.synthetic is None:
        return np.zeros(k)
    if "mean_rate" in s.synthetic:
        if k == 0:
            return np.zeros(0)
        return synth.conditional_rates_for_mean(float(s.synthetic["mean_rate"]), k)
    if "rates" in s.synthetic:
        rates = synth.check_unconditional(s.synthetic["rates"])
        if rates.size != k:
            raise ValueError(f"scenario.synthetic.rates: expected {k} rates (max draft count), got {rates.size}")
        return synth.unconditional_to_conditional(rates)
    return synth.unconditional_to_conditional(synth.rates_for_acceptance_length(float(s.synthetic["acceptance_length"]), k))
