"""vLLM V1 drafting its own drafts, then verifying them (``vllm-v1`` with ``drafter = True``).

A batch with ``draft_sampling`` set (``harness.protocol``, "The backend's own drafter") is drafted
the way V1's proposers draft (``docs/adapter-contracts.md``, "vLLM V1's drafter") and verified by
``VllmV1Backend``; a batch without ``draft_sampling`` takes ``VllmV1Backend``'s path unchanged.

**The function.** V1's EAGLE / draft-model / DFlash proposers (``SpecDecodeBaseProposer`` in
``vllm/v1/spec_decode/llm_base_proposer.py``) sample a draft step with
``_sample_draft_tokens``: the argmax of the draft logits when ``draft_sample_method`` is
"greedy" (the default) or when ``sampling_metadata.all_greedy``; else
``compute_probs_and_sample_next_token(logits, sampling_metadata[, self.use_fp64_gumbel])``,
which divides the logits by the request's temperature in place (in the logits' dtype; T = 0
rows by 1), takes ``softmax(dtype=float32)`` and draws ``argmax(probs / E)``, E ~ Exp(1) per
token, argmax of the probabilities for T = 0 rows; it returns the ids and the probabilities.
Probabilistic drafting exists from 0.22 (#40269); 0.19 to 0.21 define the function but no
proposer calls it (they always draft the argmax), so this adapter declines probabilistic engine
batches there. The function is bound by its signature and by whether a proposer calls it
(``ERAS``, ``bind_era``), checked against the release (``PROBABILISTIC_DRAFTING``).

**Loading it.** The module that defines it (``llm_base_proposer.py``; 0.19's ``eagle.py``)
imports the model executor, attention backends and model classes (0.33.0: einops, which the
suite does not install, and about 290 more vLLM modules), none of which the function uses. The
adapter therefore compiles, from the release's file, the function's ``def`` together with the
module's own top-level statements that bind the names its body reads (``import torch``,
``from vllm.v1.sample.sampler import _SAMPLING_EPS``, the noise helpers of
``vllm.v1.sample.ops.topk_topp_sampler``; ``__future__`` flags applied) and runs those in a
namespace of its own: the code object is the one the module's compilation makes (same file,
lines and bytecode; ``test_loaded_function_is_the_releases_def``), its globals the module's.
A decorated ``def``, a name the module computes or binds conditionally, or a body that reads
per-request generators is api-drift: the contract below would not hold.

**What the verifier gets.** From 0.22 the runner hands the verifier exactly the probabilities
the drafter returned (``take_last_draft_probs``, then ``GPUModelRunner._get_spec_decode_draft_probs``
row by row: ``_sample`` passes them to ``RejectionSampler``), None when the batch drafted
greedily (``all_greedy`` or "greedy"): point masses. The adapter hands ``VllmV1Backend`` the
drawn ids and, in place of the probabilities it would compute from the draft logits, the
drafter's own tensor (``_rejection_sample`` replaces ``rejection_sample``'s ``draft_probs``).
Draft rows narrower than the target are padded with -inf first (as EAGLE3's ``compute_logits``
pads a reduced draft vocabulary): the probabilities are 0 there and at the target's width.

**Randomness.** The function draws its noise with ``exponential_()`` without a generator: from
the process-global torch generator of the device, whatever the requests' seeds ("TODO(woosuk):
Consider seeds"); V1's verifier draws from per-request ``torch.Generator``\\ s seeded with the
requests' seeds (``generate_uniform_probs``, ``sample_recovered_tokens``). In the engine that
global state is unrelated to any request's seed, so the drafter's noise is independent of the
verifier's. The adapter keeps exactly that: before each call it seeds the device's global
generator (inside ``torch.random.fork_rng``, so the process's state is untouched) from
``hash64(seed, position, DRAFTER_KEY)``, a key of its own that no verifier stream uses. Seeding
it with the request's seed instead would make the drafter's noise the verifier's generator's
(the shared-noise class of vLLM #47386). ``position`` is the position of the target row that
verifies the draft (``positions[cu_num_drafts[r] + r + j]``).

**Calls.** Every operation of the function is row by row (division by the row's temperature,
softmax along the row, noise per token, argmax per row), and its two branches depend on the
batch's ``all_greedy`` / ``all_random`` flags only. Up to ``max_generators`` (256) requests, the
bound under which the verifier gives each request its generator, the adapter calls it once per
draft, on that row, with the batch's flags and the request's temperature and generator (the
metadata the engine hands the proposer; the function reads no generator): a draft then depends
on (seed, position, temperature, row) only, alone or among any mates. That costs about 70 us a
draft on the CPU (half of it in the function) and more in launches on a GPU, so above that
bound, as the verifier does there, the batch draws from the global generator seeded once per
draft step from the XOR of the step's keys: one call per step over the requests with more than
``j`` drafts, as the engine calls it (one call per step over its batch); a draft then also
depends on its mates.

**Greedy drafting** ("greedy"): ``logits.argmax(-1)`` in the logits' dtype (the proposer's
``_greedy_sample``), verified as point masses (no draft probabilities), in every release. A
probabilistic batch whose requests are all greedy (T = 0) is the same (the proposer's
``all_greedy`` path).
"""

import ast
import builtins
import copy
import dataclasses
import importlib
import importlib.util
import inspect
from pathlib import Path

import numpy as np

from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import v1
from harness.backends.vllm.processing import ReleaseBoundary
from harness.protocol import host, method_codes
from reference.methods import Method
from reference.rng import hash64

FUNCTION = "compute_probs_and_sample_next_token"
MODULES = ("vllm.v1.spec_decode.llm_base_proposer", "vllm.v1.spec_decode.eagle")  # 0.20+; 0.19
DRAFTER_KEY = 0x7631_6472_6166_74  # "v1draft": the drafter's key, used by no verifier stream
PROBABILISTIC_DRAFTING = ReleaseBoundary(
    "V1's proposers draw probabilistic drafts with compute_probs_and_sample_next_token (draft_sample_method 'probabilistic', #40269)",
    "0.21.0",
    "0.22.1",
)


@dataclasses.dataclass(frozen=True)
class Era:
    """One contract of V1's draft sampling, told apart by the function's parameters and whether
    a proposer calls it."""

    releases: str
    params: tuple[str, ...]
    probabilistic: bool  # a proposer calls it (draft_sample_method "probabilistic"), its probs go to the verifier


ERAS = (
    Era("0.19-0.21", ("logits", "sampling_metadata"), probabilistic=False),
    Era("0.22", ("logits", "sampling_metadata"), probabilistic=True),
    Era("0.23+", ("logits", "sampling_metadata", "use_fp64_gumbel"), probabilistic=True),
)


def bind_era(params, called: bool, version) -> Era:
    """The era of a function with parameters ``params`` that a proposer calls (``called``) or
    not; api-drift when none matches, or when the release says otherwise."""
    found = [e for e in ERAS if tuple(params) == e.params and called == e.probabilistic]
    if len(found) != 1:
        known = "; ".join(f"{e.releases}: {e.params}, {_called(e.probabilistic)}" for e in ERAS)
        raise vllm_env.api_changed(
            f"V1's {FUNCTION}{tuple(params)}, {_called(called)} by a proposer, matches no known drafter contract (known: {known})"
        )
    era = found[0]
    holds = PROBABILISTIC_DRAFTING.holds(version)
    if holds is not None and holds != era.probabilistic:
        raise vllm_env.api_changed(
            f"vLLM {version} is {'at or after' if holds else 'before'} {PROBABILISTIC_DRAFTING.first_with} "
            f"({PROBABILISTIC_DRAFTING.what}), but its proposers {'do not call' if holds else 'call'} {FUNCTION}"
        )
    return era


def _called(called: bool) -> str:
    return "called" if called else "not called"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the function was read: its file, its ``def`` line, the proposer call sites."""

    module: str
    path: str
    line: int
    calls: tuple[tuple[int, str, int], ...]  # (line, enclosing function, arguments passed) of every call in the module

    def where(self) -> str:
        called = ", ".join(f"{fn} :{line}" for line, fn, _ in self.calls) or "no proposer"
        return f"{self.module}.{FUNCTION} ({Path(self.path).name}:{self.line}; called by {called})"


def load_function(module: str, name: str = FUNCTION):
    """``(fn, Source)``: the release's ``def name`` from ``module``'s file, compiled together with
    the module's own top-level statements that bind the names it reads (its imports, literal
    constants; run in a namespace of its own), without running the module: the code object is
    the one the module's compilation makes. None when the module has no such file or function."""
    vllm_env.prepare()
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    path = spec.origin
    tree, node, calls = read_def(path, name)
    if node is None:
        return None
    flags = 0
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            for alias in stmt.names:
                flags |= getattr(__import__("__future__"), alias.name).compiler_flag

    def compiled(body):
        return compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), path, "exec", flags=flags, dont_inherit=True)

    bound = {}
    for global_name in sorted(_global_names(compiled([node]))):
        for i, stmt in _module_bindings(tree, module, global_name).items():
            if i in bound:  # one import statement binding several of the names
                stmt.names = [a for a in tree.body[i].names if a in bound[i].names or a in stmt.names]
            bound[i] = stmt
    namespace = {"__name__": module, "__package__": spec.parent, "__file__": path, "__builtins__": builtins}
    exec(compiled([bound[i] for i in sorted(bound)] + [node]), namespace)
    return namespace[name], Source(module, path, node.lineno, calls)


def read_def(path, name: str = FUNCTION):
    """``(tree, def, calls)`` of a module file, read without running it: its top-level ``def
    name`` (None when it has none; api-drift when decorated or defined twice) and every call of
    it in the module's functions, as (line, enclosing function, arguments passed)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(defs) > 1 or (defs and defs[0].decorator_list):
        raise vllm_env.api_changed(
            f"{path}: {name} {'defined twice' if len(defs) > 1 else 'decorated'} (the adapter compiles its def alone)"
        )
    node = defs[0] if defs else None
    reads = set() if node is None else {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute)}
    reads |= set() if node is None else {k.arg for c in ast.walk(node) if isinstance(c, ast.Call) for k in c.keywords}
    if {"generators", "generator"} & reads:
        raise vllm_env.api_changed(f"{path}: {name} reads per-request generators: its noise is no longer the global generator's alone")
    calls = set()
    for outer in ast.walk(tree):
        if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)) and outer is not node:
            for call in ast.walk(outer):
                if isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", None)) == name:
                    calls.add((call.lineno, outer.name, len(call.args) + len(call.keywords)))
    return tree, node, tuple(sorted(calls))


def _global_names(code) -> set:
    """Names the code (and the functions it defines) reads as globals."""
    import dis

    out, stack = set(), [code]
    while stack:
        c = stack.pop()
        out |= {i.argval for i in dis.get_instructions(c) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        stack += [k for k in c.co_consts if inspect.iscode(k)]
    return out


def _module_bindings(tree, module: str, name: str) -> dict:
    """{statement index: the top-level statement of ``module`` that binds ``name``, cut to that
    name}: its imports, or one literal constant. None for a builtin it does not rebind. Anything
    else is api-drift (the def alone would read another value than in the module)."""
    imports, others = {}, []
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                continue
            mine = [a for a in stmt.names if _import_binds(stmt, a) == name]
            if mine:
                imports[i] = ast.copy_location(copy.copy(stmt), stmt)
                imports[i].names = mine
        elif name in _bound_names(stmt):
            others.append((i, stmt))
    if not imports and not others:
        if hasattr(builtins, name):
            return {}
        raise vllm_env.api_changed(f"{module}.{FUNCTION} reads {name}, bound 0 ways at its module's top level")
    if others:
        (i, stmt), *rest = others
        literal = isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets) and not rest and not imports
        try:
            ast.literal_eval(stmt.value) if literal else None
        except ValueError:
            literal = False
        if not literal:
            raise vllm_env.api_changed(f"{module}.{FUNCTION} reads {name}, which its module computes (line {stmt.lineno})")
        return {i: stmt}
    return imports


def _import_binds(stmt, alias) -> str:
    """The name ``import a.b`` (a), ``import a.b as c`` (c) or ``from m import a [as c]`` binds."""
    if alias.asname:
        return alias.asname
    return alias.name.split(".")[0] if isinstance(stmt, ast.Import) else alias.name


def _bound_names(stmt) -> set:
    """Names a top-level statement binds (other than by an import)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}  # (not its body's names)
    stored = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined = {n.name for n in ast.walk(stmt) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    imported = {_import_binds(n, a) for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    return stored | defined | imported


def _discover():
    found = None
    for module in MODULES:
        found = load_function(module)
        if found is not None:
            break
    if found is None:
        raise vllm_env.api_changed(f"no {FUNCTION} in {' or '.join(MODULES)}")
    fn, source = found
    params = vllm_env.parameters(fn)
    passed = {n for _, _, n in source.calls}
    if passed - {len(params)}:  # the adapter passes every parameter, as the proposer does
        raise vllm_env.api_changed(f"{source.where()} is called with {sorted(passed)} arguments, its signature has {params}")
    return fn, source, bind_era(params, bool(source.calls), vllm_env.version())


def availability() -> tuple[bool, str]:
    return vllm_env.availability(lambda: (v1._discover(), _discover()))


class VllmV1DrafterBackend(v1.VllmV1Backend):
    """vLLM V1's verifier, and its proposers' draft sampling for batches it drafts (``draft_sampling``)."""

    drafter = True

    def __init__(self, max_generators: int = 256, use_fp64_gumbel: bool = False):
        super().__init__(max_generators, use_fp64_gumbel)
        self.draft_fn, self.source, self.era = _discover()
        self._verifier = self._fn
        self._verifier_signature = inspect.signature(self._fn)
        self._fn = self._rejection_sample
        self._handed = None  # the drafter's probabilities while its batch is verified

    @property
    def api(self) -> str:
        return f"vllm.v1.sample.rejection_sampler.rejection_sample; drafts: {self.source.where()} ({self.era.releases})"

    def supports(self, batch) -> str | None:
        sampling = getattr(batch, "draft_sampling", None)
        if sampling is None:
            return super().supports(batch)
        # The verifier is asked about the batch it will get: drawn ids (any valid ones here).
        reason = super().supports(_verified(batch, np.zeros(len(batch.draft_tokens), np.int64), True))
        if reason or sampling == "greedy":
            return reason
        if not self.era.probabilistic:
            return (
                f"vLLM {self.era.releases}'s V1 proposers draft only the argmax ({FUNCTION} is defined but never called; "
                "draft_sample_method 'probabilistic' is V1's from 0.22, #40269)"
            )
        method = Method(int(method_codes(batch)[0]))  # one method: the verifier declines mixes
        if method is not Method.STANDARD:
            return (
                "V1's proposers draft probabilistically only under rejection_sample_method 'standard' "
                f"(_enable_probabilistic_draft_probs): under {method.name.lower()} they draft the argmax"
            )
        return None

    def sample(self, batch):
        if getattr(batch, "draft_sampling", None) is None:
            return super().sample(batch)
        reason = self.supports(batch)
        if reason:
            raise ValueError(f"{self.name}: cannot draft this batch: {reason}")
        drafts, probs = self.draw(batch)
        host_drafts = drafts.cpu().numpy() if isinstance(batch.draft_tokens, np.ndarray) else drafts
        self._handed = probs
        try:
            tokens, emitted = super().sample(_verified(batch, host_drafts, probs is not None))
        finally:
            self._handed = None
        return tokens, emitted, drafts

    def _rejection_sample(self, *args, **kwargs):
        """vLLM's ``rejection_sample``, given the drafter's probabilities as ``draft_probs``
        (None for greedy drafts: ``VllmV1Backend`` passes None then)."""
        if self._handed is not None:
            bound = self._verifier_signature.bind(*args, **kwargs)
            bound.arguments["draft_probs"] = self._handed
            args, kwargs = bound.args, bound.kwargs
        return self._verifier(*args, **kwargs)

    def draw(self, batch):
        """``(drafts [D] int64, probs)``: every draft, drawn as V1's proposer draws it, and the
        ``[D, V]`` float32 probabilities the engine hands its verifier (None: point masses)."""
        import torch

        device = self.device
        cu = host(batch.cu_num_drafts).astype(np.int64)
        counts = np.diff(cu)
        num_drafts, b = int(cu[-1]), len(counts)
        f = batch.to_torch(device)
        dtype = getattr(torch, batch.logits_dtype)  # the draft head's dtype: the values are exact in it
        logits = f["draft_logits"]
        temperature = host(batch.temperature).astype(np.float64)
        if batch.draft_sampling == "greedy" or not self.era.probabilistic or np.all(temperature == 0):
            return logits.to(dtype).argmax(dim=-1), None  # _greedy_sample (and the all_greedy path)
        if num_drafts == 0:  # V1 never reaches the rejection sampler
            return torch.empty(0, dtype=torch.int64, device=device), None
        # Every draft row at the target's width (-inf beyond the draft's), fresh: the function divides in place.
        rows = torch.full((num_drafts, batch.vocab_size), float("-inf"), dtype=dtype, device=device)
        rows[:, : logits.shape[1]] = logits.to(dtype)
        owner = np.repeat(np.arange(b), counts)
        step = np.arange(num_drafts) - cu[owner]
        positions = host(batch.positions)[np.arange(num_drafts) + owner]  # the verifying target rows'
        keys = hash64(host(batch.seeds)[owner], positions, DRAFTER_KEY)
        temps = torch.from_numpy(temperature.astype(np.float32)).to(device)  # the sampler's table (0: greedy)
        metadata = self._sampling_metadata(temps, temperature, {})  # the batch's all_greedy / all_random, as the verifier's
        index = None if device == "cpu" else torch.device(device).index
        cuda_devices = [] if device == "cpu" else [torch.cuda.current_device() if index is None else index]
        generator = torch.cuda.default_generators[cuda_devices[0]] if cuda_devices else torch.default_generator  # the global one
        with torch.random.fork_rng(devices=cuda_devices), torch.no_grad():
            if b <= self.max_generators:  # one call per draft, keyed by its own (seed, position)
                seeds, out = host(batch.seeds), []
                for r in np.flatnonzero(counts):
                    row_meta = copy.copy(metadata)  # the request's temperature, its generator as the verifier seeds it
                    row_meta.temperature = temps[r : r + 1]
                    row_meta.generators = {0: torch.Generator(device=device).manual_seed(int(seeds[r]))}
                    for d in range(cu[r], cu[r + 1]):
                        generator.manual_seed(int(keys[d]))
                        out.append(self._call(rows[d : d + 1], row_meta))
                drafts, probs = (torch.cat(x) for x in zip(*out))
            else:  # one call per step, keyed by all its drafts' keys
                drafts = torch.empty(num_drafts, dtype=torch.int64, device=device)
                probs = torch.empty((num_drafts, batch.vocab_size), dtype=torch.float32, device=device)
                for j in range(int(step.max(initial=-1)) + 1):
                    sel = np.flatnonzero(step == j)
                    generator.manual_seed(int(np.bitwise_xor.reduce(keys[sel])))
                    idx = torch.from_numpy(sel).to(device)
                    step_meta = copy.copy(metadata)
                    step_meta.temperature = temps[torch.from_numpy(owner[sel]).to(device)]
                    drafts[idx], probs[idx] = self._call(rows[idx], step_meta)
        return drafts, probs

    def _call(self, logits, metadata):
        """One call of V1's function, with the arguments its proposer passes (0.23+: the
        engine's one use_fp64_gumbel flag, the verifier's too)."""
        if "use_fp64_gumbel" in self.era.params:
            return self.draft_fn(logits, metadata, self.use_fp64_gumbel)
        return self.draft_fn(logits, metadata)


def _verified(batch, drafts, with_probs: bool):
    """The batch as the verifier gets it: the drawn ids, and no draft logits when the drafter
    handed no probabilities (greedy drafts: point masses)."""
    return dataclasses.replace(batch, draft_tokens=drafts, draft_logits=batch.draft_logits if with_probs else None, draft_sampling=None)
