"""Builders shared by several test modules (tests import these, never each other)."""

import ast
import copy
import functools
import importlib.util
import inspect
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from reference.processing import processed_logits, processed_probs

MARK = "standard-near-target"  # the scenario the misbehaving backends fail on (templates with 1, 3 and 4 drafts)


def python_only_tree(dest):
    """A python-only vLLM tree (``.py`` files + dist-info METADATA) from the installed wheel,
    as scripts/build_vllm_tree.py makes one from a wheel or a checkout."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    src = Path(spec.origin).parent
    for path in src.rglob("*.py"):
        target = dest / "vllm" / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    version = importlib.metadata.version("vllm")
    meta = dest / f"vllm-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return dest


# --- the suite's Triton sampler (suites/test_triton_*.py, test_benchmark_tools.py) ---------------------
# Torch, Triton and the sampler are imported inside the helpers: importing this module needs neither.
TRITON_BACKEND = "harness.backends.triton.backend:TritonBackend"
TRITON_FUSED = "harness.backends.triton.backend:FusedTritonBackend"
BOTH_PATHS = ("staged", "fused")  # both paths, where a test's batches would take one only by default (auto)
TRITON_ALPHA = 1e-6  # false-alarm rate of each statistical test of the Triton sampler
TRITON_POWER = 0.99


def sample_triton(batch, device="cpu", **options):
    """``TritonBackend(device, **options)``'s outputs for ``batch`` as NumPy arrays."""
    from harness.backends.triton.backend import TritonBackend
    from harness.protocol import as_numpy_outputs

    backend = TritonBackend(device, **options)
    return as_numpy_outputs(backend.sample(batch), batch.num_requests, batch.max_drafts)


def assert_same_outputs(got, want, batch):
    """Fail naming the first request whose tokens or emitted count differ."""
    import numpy as np
    import pytest

    from reference.methods import Method

    (tok, em), (rtok, rem) = got, want
    bad = np.flatnonzero((tok != rtok).any(axis=1) | (em != rem))
    if bad.size:
        r = int(bad[0])
        lo, hi = batch.cu_num_drafts[r], batch.cu_num_drafts[r + 1]
        pytest.fail(
            f"{bad.size} of {batch.num_requests} requests differ; first r={r} method={Method(batch.methods[r]).name} "
            f"T={batch.temperature[r]} drafts={batch.draft_tokens[lo:hi].tolist()}: got {tok[r].tolist()} / {em[r]}, "
            f"want {rtok[r].tolist()} / {rem[r]}"
        )


def build_batch(requests, vocab, draft_vocab=None, with_draft=True):
    """A VerifyBatch from per-request dicts: target [d+1, V], drafts [d], draft [d, Vd],
    temperature, seed, position, method, rates [d]."""
    import numpy as np

    from harness.protocol import VerifyBatch

    k = max((len(q["drafts"]) for q in requests), default=0)
    dv = draft_vocab or vocab
    counts = np.array([len(q["drafts"]) for q in requests], dtype=np.int64)
    rates = np.zeros((len(requests), k))
    for i, q in enumerate(requests):
        rates[i, : counts[i]] = q.get("rates", np.zeros(counts[i]))
    positions = np.concatenate([q["position"] + np.arange(c + 1) for q, c in zip(requests, counts)])
    return VerifyBatch(
        target_logits=np.concatenate([q["target"] for q in requests]).astype(np.float32),
        draft_logits=np.concatenate([q["draft"] for q in requests]).reshape(-1, dv).astype(np.float32) if with_draft else None,
        draft_tokens=np.concatenate([q["drafts"] for q in requests]).astype(np.int64),
        cu_num_drafts=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        temperature=np.array([q["temperature"] for q in requests], dtype=np.float64),
        seeds=np.array([q["seed"] for q in requests], dtype=np.int64),
        positions=positions.astype(np.int64),
        methods=np.array([q["method"] for q in requests], dtype=np.int8),
        synthetic_rates=rates,
        max_drafts=k,
    ).validate()


def greedy_requests(rng, vocab, n, methods, draft_vocab=None, max_drafts=5):
    """Temperature-0 requests with ties, NaN rows, fully and partly masked rows, placeholders,
    and drafts that are the target's argmax often enough to be accepted."""
    import numpy as np

    from reference.distributions import greedy_tokens

    out = []
    for i in range(n):
        d = int(rng.integers(0, max_drafts + 1))
        target = rng.normal(0.0, 2.0, (d + 1, vocab)).astype(np.float32)
        for row in target:
            kind = rng.random()
            if kind < 0.3 and vocab > 1:  # ties with the max, lowest id must win
                row[rng.choice(vocab, size=min(3, vocab), replace=False)] = row.max() + 1.0
            elif kind < 0.4:
                row[rng.integers(vocab)] = np.nan
            elif kind < 0.45:
                row[:] = -np.inf
            elif kind < 0.6:
                row[rng.random(vocab) < 0.5] = -np.inf
        top = greedy_tokens(target)
        drafts = np.where(rng.random(d) < 0.75, top[:d], rng.integers(0, vocab, d))
        if d and rng.random() < 0.15:
            drafts[rng.integers(d)] = -1
        method = methods[i % len(methods)]
        out.append(
            dict(
                target=target, drafts=drafts, draft=rng.normal(0.0, 2.0, (d, draft_vocab or vocab)),
                temperature=0.0, seed=int(rng.integers(1 << 62)), position=int(rng.integers(1 << 40)),
                method=method, rates=rng.integers(0, 2, d).astype(np.float64),
            )
        )  # fmt: skip
    return out


def mixed_requests(rng, vocab, n):
    """n requests of every method, up to 4 drafts, draft rows near the target, T in {0, 0.7, 1}."""
    from reference.methods import Method

    methods = [Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC]
    out = []
    for i in range(n):
        d = int(rng.integers(0, 5))
        target = rng.normal(0.0, 1.0, (d + 1, vocab))
        draft = target[:d] + rng.normal(0.0, 0.5, (d, vocab))
        drafts = rng.integers(0, vocab, d)
        out.append(
            dict(
                target=target, draft=draft, drafts=drafts, temperature=float(rng.choice([0.0, 0.7, 1.0])),
                seed=int(rng.integers(1 << 62)), position=int(rng.integers(1 << 40)), method=methods[i % 4],
                rates=rng.random(d),
            )
        )  # fmt: skip
    return out


def any_requests(rng, vocab, n, draft_vocab, max_drafts):
    """Every method at temperatures 0, 1e-4, 0.5, 1 and 2, with what ``greedy_requests`` plants
    (ties, NaN and masked rows, placeholders), draft rows near the target or not, some fully
    masked, and random synthetic rates."""
    import numpy as np

    from reference.methods import Method

    out = greedy_requests(rng, vocab, n, (Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC), draft_vocab, max_drafts)
    for q in out:
        d = len(q["drafts"])
        q["temperature"] = float(rng.choice([0.0, 1e-4, 0.5, 1.0, 2.0]))
        if rng.random() < 0.5:
            q["draft"] = q["target"][:d, :draft_vocab] + rng.normal(0.0, 0.5, (d, draft_vocab))
        q["draft"] = np.nan_to_num(q["draft"], nan=0.0, posinf=0.0, neginf=-np.inf)  # draft logits are never NaN
        if d and rng.random() < 0.2:
            q["draft"][rng.integers(d)] = -np.inf
        q["rates"] = rng.random(d)
    return out


def device_mixed_batch(vocab, b, k, seed, device="cuda", chain_only=False, equal_counts=False):
    """Ragged mixed batch built on the device (``equal_counts``: k drafts each): every method
    (``chain_only``: standard and synthetic only), temperatures 0 / 0.5 / 1, masked and
    near-target bf16 draft rows, drafts mostly the target's argmax, a placeholder, rates."""

    import numpy as np
    import torch

    from reference.methods import Method

    g = torch.Generator(device).manual_seed(seed)
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, k + 1, b)
    counts[: min(b, 2)] = [k, 0][: min(b, 2)]
    if equal_counts:
        counts[:] = k
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)])).to(device)
    d = int(counts.sum())
    target = torch.randn(d + b, vocab, device=device, generator=g) * 3
    target[::5, vocab // 3 :] = -math.inf
    rows = torch.from_numpy(np.arange(d) + np.repeat(np.arange(b), counts)).to(device)
    draft = (target[rows] + torch.randn(d, vocab, device=device, generator=g) * 0.5).to(torch.bfloat16)
    drafts = torch.where(
        torch.rand(d, device=device, generator=g) < 0.7, target[rows].argmax(1), torch.randint(0, vocab, (d,), device=device, generator=g)
    )
    if d > 1:
        drafts[d // 2] = -1
    kinds = [Method.STANDARD, Method.SYNTHETIC] if chain_only else [Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC]
    methods = torch.from_numpy(np.resize(np.array(kinds, np.int8), b)).to(device)
    temps = torch.from_numpy(np.resize([1.0, 0.0, 0.5], b)).to(device)
    seeds = torch.randint(0, 1 << 62, (b,), device=device, generator=g)
    positions = torch.arange(d + b, device=device, dtype=torch.int64) * 7
    rates = torch.rand(b, k, device=device, generator=g, dtype=torch.float64)
    return target, draft, drafts, cu, temps, seeds, positions, methods, rates, k


def fused_scratch(monkeypatch, run, prepare=None):
    """The fused path's float64 scratch after ``run()``, allocated zeroed (unwritten slots compare
    equal), then given to ``prepare`` where one is passed."""
    import torch

    real_empty = torch.empty
    made = []

    def zeroed(*shape, **kwargs):
        made.append(torch.zeros(*shape, **kwargs))
        if prepare is not None and made[-1].dtype == torch.float64:
            prepare(made[-1])
        return made[-1]

    monkeypatch.setattr(torch, "empty", zeroed)
    try:
        run()
    finally:
        monkeypatch.setattr(torch, "empty", real_empty)
    (scratch,) = [t for t in made if t.dtype == torch.float64]
    return scratch


# Two fp32 sums of the same row in different orders (CUDA tiles, V <= 262,144): each within 64 u
# of the exact sum (u = 2**-24; a term passes at most 31 in-thread, 5 warp and 2 cross-warp adds
# in the fused kernel's 4096-wide tile (15 in the staged kernel's 2048-wide one, then 2 running-sum
# steps of a multiply and an add), two exp2 of about 2 u each, and the merge's two roundings: at
# most 46), and each log rounds once: |log-sum difference| <= 128 u + 2 ulps.
ORDER_SLACK = 128 * 2.0**-24


def assert_stats_equal(stored, want, label: str, log_sum_order_bound: bool = False, rows=None):
    """Stored final statistics (``[4, n]`` float64: max, log-sum, argmax, flag) equal ``staged_jobs.Stats``
    bit for bit in ``rows`` (default all); with ``log_sum_order_bound`` the log-sums within
    ``ORDER_SLACK`` + 2 ulps."""

    import torch

    rows = slice(None) if rows is None else rows
    for field, got, w in zip(("max", "log-sum", "argmax", "degenerate"), stored[:, rows], (want.m, want.logs, want.arg, want.bad)):
        w = w[rows]
        if field == "log-sum" and log_sum_order_bound:
            ulp = torch.where(w.isfinite(), torch.nextafter(w, torch.full_like(w, math.inf)) - w, 0.0).to(torch.float64)
            w = w.to(torch.float64)
            same = ((got - w).abs() <= ORDER_SLACK + 2 * ulp) | (got.isnan() & w.isnan()) | (got == w)
            worst = float(torch.where(same, 0.0, (got - w).abs()).nan_to_num(math.inf).max()) if len(w) else 0.0
            assert bool(same.all()), f"{label} log-sum: {int((~same).sum())} of {len(w)} rows past the order bound (worst {worst:.3g})"
            continue
        w = w.to(torch.float64)
        same = (got == w) | (got.isnan() & w.isnan())
        assert bool(same.all()), f"{label} {field}: {int((~same).sum())} of {len(w)} rows differ"


def rows_with_drafts(counts):
    """Target rows 0..count-1 of each request (ragged ``counts``): the rows the fused path
    keeps statistics of (a request's last row has none, ``_fused_stats_kernel``)."""
    import torch

    owner = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts + 1)
    first = torch.cumsum(counts + 1, 0) - (counts + 1)
    return torch.arange(len(owner), device=counts.device) - first[owner] < counts[owner]


def staged_group(vocab, cuda, block_v=None, splits=None) -> int:
    """The group width the staged path's target statistics sum by (``verify``: residual candidates on)."""
    from harness.backends.triton.common import candidate_plan, tile_plan
    from harness.backends.triton.tunables import DEFAULT_TUNABLES

    draw_v = tile_plan(vocab, cuda, block_v, splits)[0]
    return candidate_plan(vocab, draw_v, draw_v)[0] if DEFAULT_TUNABLES.candidates else 0


def tail_rate(tail_tokens, log_ratio):
    """The share of draws landing in ``tail_tokens`` tokens each ``exp(log_ratio)`` below a head of 1."""

    import numpy as np

    tail = tail_tokens * math.exp(float(np.float32(log_ratio)))
    return tail / (1.0 + tail)


def binomial_check(hits, n, rate, max_shift):
    """Binomial test at ``TRITON_ALPHA`` of ``hits`` in ``n`` against ``rate``, powered to detect ``max_shift``."""
    from harness.checking import power, stats

    p = stats.binomial_test(hits, n, rate)
    detect = power.binomial_detectable(TRITON_ALPHA, TRITON_POWER, rate, n)
    assert detect < max_shift, f"underpowered: detects a shift of {detect:.3g} only (wanted {max_shift:.3g})"
    assert p > TRITON_ALPHA, f"tail drawn {hits}/{n} = {hits / n:.4g} vs rate {rate:.4g}: p = {p:.3g} <= alpha {TRITON_ALPHA}"


REPO_ROOT = Path(__file__).resolve().parent.parent
NEG_INF = float("-inf")


# --- vLLM's source, compiled without importing vLLM --------------------------------------------
def installed_vllm_tree() -> tuple[str, Path] | None:
    spec = importlib.util.find_spec("vllm")  # a top-level spec: vLLM is not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    version = "dev"
    for meta in sorted(folder.parent.glob("vllm-*.dist-info/METADATA")):
        found = re.search(r"^Version: *(\S+)", meta.read_text(errors="replace"), re.M)
        version = found.group(1) if found else version
    return f"installed-{version}", folder


def vllm_trees() -> list:
    trees = []
    installed = installed_vllm_tree()
    if installed is not None:
        trees.append(pytest.param(installed[1], id=installed[0]))
    else:
        trees.append(pytest.param(None, id="installed", marks=pytest.mark.skip(reason="vLLM is not installed")))
    for version in ("0.19.1", "0.20.2", "0.24.0", "0.27.1"):
        folder = REPO_ROOT / "vendor" / f"vllm-{version}" / "vllm"
        if folder.is_dir():
            trees.append(pytest.param(folder, id=version))
    return trees


VLLM_TREES = vllm_trees()


@functools.cache
def parsed_source(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


class PlainPython(ast.NodeTransformer):
    """Annotations name vLLM's types (evaluated at ``def`` time) and decorators its helpers:
    drop both, so the functions compile in a namespace of torch and the test's stand-ins."""

    def visit_FunctionDef(self, node):
        node.decorator_list, node.returns = [], None
        args = node.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None:
                arg.annotation = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node):
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)


def find_definition(body, name):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
    return None


def vllm_source(tree: Path, files, *names, **env) -> SimpleNamespace:
    """``names`` ("func", "Class.method", "CONSTANT") from the first of ``files`` (paths under
    ``vllm/``) that defines the first of them, compiled in ``{torch, np, **env}``."""
    files = (files,) if isinstance(files, str) else files
    for rel in files:
        path = tree / rel
        if not path.is_file():
            continue
        module = parsed_source(path)
        nodes = []
        for name in names:
            cls, _, leaf = name.rpartition(".")
            body = module.body
            if cls:
                owner = find_definition(body, cls)
                body = owner.body if isinstance(owner, ast.ClassDef) else []
            node = find_definition(body, leaf)
            if node is None:
                break
            nodes.append(PlainPython().visit(copy.deepcopy(node)))
        else:
            namespace = {"torch": torch, "np": np, **env}
            exec(compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), str(path), "exec"), namespace)
            return SimpleNamespace(**{name.rpartition(".")[2]: namespace[name.rpartition(".")[2]] for name in names})
    raise AssertionError(f"vLLM API changed: {names} not found in {files} under {tree}")


@functools.cache
def vllm_ops(tree):
    return vllm_source(tree, "v1/sample/ops/topk_topp_sampler.py", "apply_top_k_top_p_pytorch", "apply_top_k_only")


# --- helpers ------------------------------------------------------------------------------------
def random_logits(vocab, rows=3, seed=0, scale=2.0):
    return (np.random.default_rng([seed, vocab]).standard_normal((rows, vocab)) * scale).astype(np.float32)


def kept_tokens(logits) -> np.ndarray:
    return np.isfinite(np.asarray(logits, dtype=np.float64))


def assert_processing_matches(vllm_logits: torch.Tensor, logits32: np.ndarray, params, engine, where=""):
    """vLLM's processed logits (float32, -inf removed) against the reference: the kept set
    exactly, the probabilities to 1e-6."""
    got = vllm_logits.detach().cpu().double()
    want_kept = kept_tokens(processed_logits(logits32.astype(np.float64), params, engine))
    got_kept = kept_tokens(got.numpy())
    assert (got_kept == want_kept).all(), f"{where}: kept sets differ in rows {np.flatnonzero((got_kept != want_kept).any(1))}"
    got_probs = torch.softmax(vllm_logits.float(), dim=-1).double().numpy()
    want_probs = processed_probs(logits32.astype(np.float64), params, engine)
    assert np.abs(got_probs - want_probs).max() <= 1e-6, f"{where}: max |dp| {np.abs(got_probs - want_probs).max():.3g}"


def per_row(rows, value, dtype):
    return torch.full((rows,), value, dtype=dtype)


def dyadic_row(weights):
    """Logits whose softmax is exactly ``weights / sum`` (dyadic, summing to a power of two) in
    float64 NumPy and in float32 torch here; skip where this platform's exp is not exact."""
    weights = np.asarray(weights, dtype=np.float64)
    x = np.log(weights / weights.max())  # the maximum at 0: softmax subtracts it exactly
    probs = weights / weights.sum()
    e = np.exp(x - x.max())
    ours = torch.softmax(torch.tensor(x, dtype=torch.float32), dim=-1).double().numpy()
    if not ((e / e.sum() == probs).all() and (ours == probs).all()):
        pytest.skip("this platform's exp does not give the exact dyadic probabilities the boundary cases need")
    return x[None, :], probs


# --- sort path: apply_top_k_top_p_pytorch / apply_top_k_only ------------------------------------
PARAMS_BY_VOCAB = {
    1: [dict(top_k=1), dict(top_p=0.3), dict(top_k=1, top_p=0.5)],
    2: [dict(top_k=1), dict(top_p=0.6), dict(top_k=2, top_p=0.9)],
    7: [dict(top_k=3), dict(top_p=0.95), dict(top_k=5, top_p=0.9)],
    1000: [dict(top_k=50), dict(top_p=0.9), dict(top_k=200, top_p=0.75), dict(top_k=1000, top_p=0.5)],
}


RANDOM_CASES = [(v, kw) for v, kws in PARAMS_BY_VOCAB.items() for kw in kws]


V1_CASES = {
    "V1": (1, dict(temperature=0.7, top_k=1, top_p=0.5, min_p=0.1, logit_bias=((0, 3.0),))),
    "V2": (2, dict(temperature=1.3, min_p=0.3)),
    "V7": (7, dict(temperature=0.5, top_k=4, top_p=0.8, min_p=0.05, logit_bias=((6, 2.5), (1, -1.0)))),
    "V1000-all": (1000, dict(temperature=0.8, top_k=100, top_p=0.85, min_p=0.02, logit_bias=((3, 4.0), (999, -2.0), (10, 1.5)))),
    "V1000-min_p": (1000, dict(temperature=1.7, min_p=0.15)),
    "V1000-top_p-min_p": (1000, dict(temperature=0.4, top_p=0.6, min_p=0.001)),
}


# --- vLLM adapters on the CPU (suites/test_vllm*.py) ---------------------------------------------
def wrapped(fn, change):
    """``fn`` with its bound arguments passed through ``change`` first (same signature): vLLM's
    function made to break, or watched keeping, a convention."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        change(bound.arguments)
        return fn(*bound.args, **bound.kwargs)

    return call


def vllm_backend(module, cls_name):
    """An adapter of ``harness.backends.vllm``, or a skip naming why vLLM is not usable here."""
    ok, why = module.availability()
    if not ok:
        pytest.skip(f"vLLM not usable here: {why}")
    return getattr(module, cls_name)()


def first_batch(scenario, count=1):
    """The first ``count`` trials of ``scenario``, as the runner builds them."""
    from harness.scenarios.materialize import materialize, trials

    return trials(scenario, materialize(scenario), 0, count).batch


def failing_checks(dotted: str, scenario, profile, device: str = "cpu") -> list[str]:
    """Run one scenario through the runner: the failing or erroring checks' lines (empty when all pass)."""
    from harness.run.runner import run

    result = run([dotted], [scenario], profile, 0, device=device)
    return [
        f"{r.scenario}[{r.template}] {r.check}: {r.verdict}: {r.message}\n  {r.reproducer}"
        for r in result.records
        if r.verdict in ("fail", "error")
    ]


# --- drafter backends (suites/test_*drafting.py) -------------------------------------------------
def engine_batch(
    seed, n=10, vocab=12, draft_vocab=None, sampling="probabilistic", temps=(0.9, 1.3, 0.0), dtype="float32", scattered_slots=False
):
    """n requests of 0-4 drafts for a drafter backend to draw (``draft_tokens`` -1); with
    ``scattered_slots``, at random state slots out of 3 n."""
    import dataclasses

    from harness.scenarios.materialize import round_to_dtype
    from reference.methods import Method

    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        d = int(rng.integers(0, 5)) if i else 3
        target = rng.normal(0.0, 1.5, (d + 1, vocab))
        draft = round_to_dtype(target[:d, : draft_vocab or vocab] + rng.normal(0.0, 0.7, (d, draft_vocab or vocab)), dtype)
        requests.append(
            dict(target=round_to_dtype(target, dtype), drafts=np.full(d, -1), draft=draft, temperature=float(temps[i % len(temps)]),
                 seed=int(rng.integers(1 << 62)), position=int(rng.integers(1 << 20)), method=Method.STANDARD)
        )  # fmt: skip
    batch = build_batch(requests, vocab, draft_vocab)
    slots = rng.permutation(3 * n)[:n] if scattered_slots else batch.request_slots
    return dataclasses.replace(batch, draft_sampling=sampling, request_slots=slots, logits_dtype=dtype).validate()
