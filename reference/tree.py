"""Tree verification: a draft tree, two rules that verify it, their samplers and exact laws.

A draft tree (``DraftTree``) is node 0, the root (the last accepted context position: it
drafts nothing), and nodes ``1 .. N-1``, each with its parent and its draft token. Node
``n``'s target row is the target's law of the token after the path root -> ``n``. Children
of a node are tried in index order (SGLang's ``retrive_next_sibling`` order, see
``DraftTree.retrive_arrays``). A request's outcome is ``(node, y)``: the walk accepted the
path root -> ``node`` (its tokens are emitted) and then emitted token ``y``; laws are
``[N, V]`` arrays, ``law[node, y]``. In a chain (node ``n``'s parent is ``n - 1``) node ``n``
is "``n`` drafts accepted", the ``(n, y)`` outcome of ``reference.laws``.

Rules (``docs/trees.md`` states each law and when it is lossless):

* ``sglang_*``: SGLang's EAGLE target-only tree rule, read from sgl-project/sglang at commit
  b227f63247cdaf7fcbc4cfec8c3379120276ec82,
  ``sgl-kernel/csrc/speculative/speculative_sampling.cuh``, ``TreeSpeculativeSamplingTargetOnly``:

  - one uniform ``coin`` per level, the accepted node's own (``uniform_samples[cur_index]``,
    the root's for the first level); ``prob_acc`` starts at 0 and adds the target
    probability of each sibling tried, in order, duplicates included;
  - sibling accepted iff ``coin <= prob_acc / threshold_acc || p(x) >= threshold_single``
    (``threshold_acc`` capped below at ``1e-9`` by the launcher);
  - a rejected sibling sets ``draft_probs[row][x] = target_probs[row][x]``; the caller
    passes ``draft_probs`` all zeros (python/sglang/srt/speculative/eagle_info.py at
    f1f60ea0258f346adb43d2371d03cbc66d9d5ba2), so the emitted token is drawn from
    ``relu(target - draft)``: the stopping node's target row with every rejected child's
    token removed, renormalized, with a separate final coin; at a leaf (no children, or the
    last level) nothing was removed: the bonus is the leaf's target row. An empty residual
    (only through rounding) emits ``V - 1`` (the kernel's initial ``sampled_id``).
  - Server defaults ``speculative_accept_threshold_single = speculative_accept_threshold_acc
    = 1.0`` (lossless when sibling tokens are distinct).

* ``specinfer_*``: SpecInfer's multi-round rejection sampling (Miao et al. 2024, "SpecInfer",
  Algorithm 2; the paper was not re-read here, see docs/trees.md): at a node with target row ``p``, children tried in order,
  child ``x`` drafted from ``q`` accepted with probability ``min(1, p(x) / q(x))``; on
  rejection ``p <- norm(max(p - q, 0))`` and the next child is tried; all rejected: the token
  is drawn from the final ``p``; a leaf: from its target row (the bonus). An empty residual
  falls back to the current ``p`` (the suite's convention, ``reference.rules``). Lossless
  when every node's children are drawn independently from the draft rows the rule uses
  (``specinfer_drawn_law``); for fixed children it is not, and ``specinfer_law`` is the law.

Not modelled: the kernel's cap of ``num_speculative_tokens - 1`` levels (SGLang builds its
trees ``speculative_num_steps`` deep and presumably passes ``num_steps + 1``: the cap should not bind;
not verified here), float32 arithmetic, and ``deterministic=False``.
Randomness: counter-based uniforms (``reference.rng``) keyed by a per-trial seed and the
node index, as ``reference.sampler`` keys them by position.
"""

import itertools
from dataclasses import dataclass

import numpy as np

from reference import rules
from reference.distributions import check_probs, softmax_rows
from reference.rng import Stream, hash64, uniforms

MIN_THRESHOLD_ACC = 1e-9  # the launcher's fmaxf(threshold_acc, 1e-9f)
FINAL_POSITION = 0  # position key of a trial's final (residual or bonus) coin
MAX_ENUMERATED_CHILDREN = 200_000  # child-token tuples the drawn law may enumerate at one node


# --- tree topology -------------------------------------------------------------------------
def check_parents(parents) -> np.ndarray:
    """``parents`` as int64, or ``ValueError``: node 0 is the root (parent -1), every other
    node's parent is an earlier node (no cycle, no parent listed after its child)."""
    arr = np.asarray(parents)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise ValueError(f"parents: expected a non-empty 1-D array of integer node indices, got {parents!r}")
    arr = arr.astype(np.int64)
    n = arr.size
    if arr[0] != -1:
        raise ValueError(f"parents: node 0 is the root and must have parent -1, got {arr[0]}")
    for j in range(1, n):
        if arr[j] == -1:
            raise ValueError(f"parents: node {j} has parent -1, but only node 0 may be the root")
        if not 0 <= arr[j] < n:
            raise ValueError(f"parents: node {j} has parent {arr[j]}, outside [0, {n})")
    for j in range(1, n):  # walk up: a path longer than n nodes revisits one
        seen, k = [j], arr[j]
        while k > 0 and len(seen) <= n:
            if k == j:
                raise ValueError(f"parents: cycle through nodes {sorted(seen)}")
            seen.append(int(k))
            k = arr[k]
    late = np.flatnonzero(arr[1:] >= np.arange(1, n))
    if late.size:
        j = int(late[0]) + 1
        raise ValueError(f"parents: node {j}'s parent {arr[j]} comes after it; list every parent before its children")
    return arr


def children_lists(parents: np.ndarray) -> tuple[np.ndarray, ...]:
    """Children of each node, in index order (the order a rule tries them)."""
    kids = [[] for _ in range(parents.size)]
    for j in range(1, parents.size):
        kids[parents[j]].append(j)
    return tuple(np.array(k, dtype=np.int64) for k in kids)


def children_table(parents: np.ndarray) -> np.ndarray:
    """``[N, K]`` children per node in index order, padded with -1 (``K >= 1``)."""
    kids = children_lists(parents)
    table = np.full((parents.size, max(1, max(k.size for k in kids))), -1, dtype=np.int64)
    for n, k in enumerate(kids):
        table[n, : k.size] = k
    return table


def depths(parents: np.ndarray) -> np.ndarray:
    """Depth of each node (the root 0); parents come before children."""
    d = np.zeros(parents.size, dtype=np.int64)
    for j in range(1, parents.size):
        d[j] = d[parents[j]] + 1
    return d


# --- token prefixes ------------------------------------------------------------------------
# Every token sequence has a code: the empty one 0, and ``s + (x,)`` has ``code(s) * V + 1 + x``
# (level order of the complete V-ary tree). Codes of length l fill [offset(l), offset(l + 1)).
def num_codes(vocab: int, max_len: int) -> int:
    """Number of sequences of length ``0 .. max_len`` over ``vocab`` tokens."""
    return sum(vocab**length for length in range(max_len + 1))


def child_code(code, token, vocab: int):
    """Code of the sequence ``code`` followed by ``token`` (arrays broadcast)."""
    return np.asarray(code) * vocab + 1 + np.asarray(token)


def decode(code: int, vocab: int) -> tuple[int, ...]:
    """The token sequence of a code."""
    out = []
    while code > 0:
        code, x = divmod(code - 1, vocab)
        out.append(x)
    return tuple(reversed(out))


class PrefixModel:
    """A language model on a small vocabulary as a table: ``rows[code(s)]`` is the law of the
    next token after the sequence ``s``, for every ``s`` of length ``0 .. max_len``. A tree
    built from it (``DraftTree.from_models``) has target rows that depend on the tokens of a
    node's path only, as a real target's do: the setting of the lossless claims."""

    def __init__(self, rows, vocab: int, max_len: int):
        if not isinstance(vocab, int | np.integer) or vocab < 1 or not isinstance(max_len, int | np.integer) or max_len < 0:
            raise ValueError(f"PrefixModel: vocab >= 1 and max_len >= 0 integers expected, got {vocab!r}, {max_len!r}")
        self.vocab, self.max_len = int(vocab), int(max_len)
        self.rows = check_probs(rows, "rows")
        want = (num_codes(self.vocab, self.max_len), self.vocab)
        if self.rows.shape != want:
            raise ValueError(f"rows: expected shape {want} (every prefix of length <= {max_len}), got {self.rows.shape}")

    @classmethod
    def random(cls, rng: np.random.Generator, vocab: int, max_len: int, concentration: float = 0.8) -> "PrefixModel":
        """Dirichlet rows, one per prefix."""
        return cls(rng.dirichlet(np.full(vocab, concentration), size=num_codes(vocab, max_len)), vocab, max_len)

    @classmethod
    def from_depth_rows(cls, rows) -> "PrefixModel":
        """Rows that depend on the prefix's length only: ``rows[l]`` after every length-``l`` prefix."""
        rows = check_probs(rows, "rows")
        if rows.ndim != 2:
            raise ValueError(f"rows: expected [max_len + 1, V], got shape {rows.shape}")
        vocab, max_len = rows.shape[1], rows.shape[0] - 1
        return cls(np.repeat(rows, [vocab**length for length in range(max_len + 1)], axis=0), vocab, max_len)

    def completed(self, emitted, length: int) -> np.ndarray:
        """Law of length-``length`` sequences: ``emitted`` (a law over codes of length
        ``<= length``) with each sequence continued by draws from this model's rows.

        ``completed(delta_root, L)`` is the model's own law of ``L`` tokens; a lossless rule's
        emitted law completes to the same."""
        if length > self.max_len + 1:
            raise ValueError(f"length: {length} needs prefixes of length {length - 1}, the model has <= {self.max_len}")
        v = self.vocab
        mass = np.zeros(num_codes(v, length))
        emitted = np.asarray(emitted, dtype=np.float64)
        if emitted.size > mass.size and emitted[mass.size :].any():
            raise ValueError(f"emitted: mass on sequences longer than {length}")
        mass[: min(emitted.size, mass.size)] = emitted[: mass.size]
        for level in range(length):
            lo, hi = num_codes(v, level - 1) if level else 0, num_codes(v, level)
            mass[hi : num_codes(v, level + 1)] += (mass[lo:hi, None] * self.rows[lo:hi]).ravel()
        return mass[num_codes(v, length - 1) if length else 0 :]

    def sequence_law(self, length: int) -> np.ndarray:
        """The model's law of its first ``length`` tokens, over their codes."""
        root = np.zeros(1)
        root[0] = 1.0
        return self.completed(root, length)


# --- the draft tree ------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DraftTree:
    """One request's draft tree.

    Parameters
    ----------
    parents : array_like of int, shape (N,)
        ``parents[0] = -1`` (the root); every other node's parent is an earlier node.
    tokens : array_like of int, shape (N,)
        ``tokens[0] = -1`` (the root drafts nothing); the others in ``[0, V)``.
    target_logits : array_like of float, shape (N, V)
        Row ``n``: the target's logits for the token after the path root -> ``n``; ``-inf``
        masks a token; NaN and ``+inf`` are refused, and every row needs a finite logit.
    temperature : float or array_like of float, shape (N,), default 1.0
        Finite, ``>= 0``; 0 is greedy (the row's argmax as a point mass).
    draft_probs : array_like of float, shape (N, V), or None
        Row ``j >= 1``: the law node ``j``'s token was drafted from (after temperature); the
        token must have positive probability there. Row 0 is not read. SpecInfer needs it.
    """

    parents: np.ndarray
    tokens: np.ndarray
    target_logits: np.ndarray
    temperature: object = 1.0
    draft_probs: np.ndarray | None = None

    def __post_init__(self):
        parents = check_parents(self.parents)
        n = parents.size
        logits = np.asarray(self.target_logits, dtype=np.float64)
        if logits.ndim != 2 or logits.shape[0] != n or logits.shape[1] < 1:
            raise ValueError(f"target_logits: expected shape ({n}, V) with V >= 1, got {logits.shape}")
        if np.isnan(logits).any() or np.isposinf(logits).any():
            raise ValueError("target_logits: NaN or +inf found (only -inf, a masked token, is allowed)")
        if not np.isfinite(logits).any(axis=1).all():
            raise ValueError(f"target_logits: rows {np.flatnonzero(~np.isfinite(logits).any(axis=1)).tolist()} have no finite logit")
        vocab = logits.shape[1]
        tokens = np.asarray(self.tokens)
        if tokens.shape != (n,) or tokens.dtype.kind not in "iu":
            raise ValueError(f"tokens: expected {n} integer ids, got {self.tokens!r}")
        tokens = tokens.astype(np.int64)
        if tokens[0] != -1:
            raise ValueError(f"tokens: the root (node 0) drafts nothing and must be -1, got {tokens[0]}")
        bad = np.flatnonzero((tokens[1:] < 0) | (tokens[1:] >= vocab)) + 1
        if bad.size:
            raise ValueError(f"tokens: node {bad[0]} has token {tokens[bad[0]]}, outside [0, {vocab})")
        temp = np.asarray(self.temperature, dtype=np.float64)
        if temp.shape not in ((), (n,)) or not np.isfinite(temp).all() or (temp < 0).any():
            raise ValueError(f"temperature: expected a finite number >= 0 or {n} of them, got {self.temperature!r}")
        draft = None
        if self.draft_probs is not None:
            draft = np.array(self.draft_probs, dtype=np.float64)
            if draft.shape != (n, vocab):
                raise ValueError(f"draft_probs: expected shape {(n, vocab)}, got {draft.shape}")
            if n > 1:
                check_probs(draft[1:], "draft_probs")
                zero = np.flatnonzero(draft[np.arange(1, n), tokens[1:]] <= 0) + 1
                if zero.size:
                    j = int(zero[0])
                    raise ValueError(f"draft_probs: node {j}'s token {tokens[j]} has draft probability 0 (it cannot have been drafted)")
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "target_logits", logits)
        object.__setattr__(self, "temperature", temp)
        object.__setattr__(self, "draft_probs", draft)

    @classmethod
    def from_models(cls, parents, tokens, target: PrefixModel, draft: PrefixModel | None = None) -> "DraftTree":
        """A tree whose rows come from prefix models: node ``n``'s target row is
        ``target``'s row after its path's tokens, node ``j``'s draft row ``draft``'s row after
        its parent's path (the law ``j``'s token is drafted from). Temperature 1."""
        parents = check_parents(parents)
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.shape != parents.shape or ((tokens[1:] < 0) | (tokens[1:] >= target.vocab)).any():
            raise ValueError(f"tokens: expected {parents.size} ids, each in [0, {target.vocab}) but the root's, got {tokens}")
        if depths(parents).max() > target.max_len:
            raise ValueError(f"target: the tree is {depths(parents).max()} deep, the model covers prefixes of length <= {target.max_len}")
        codes = path_codes(parents, np.where(tokens < 0, 0, tokens), target.vocab)
        with np.errstate(divide="ignore"):
            logits = np.log(target.rows[codes])
        probs = None
        if draft is not None:
            if draft.vocab != target.vocab or depths(parents).max() - 1 > draft.max_len:
                raise ValueError("draft: needs the target's vocabulary and the prefixes of every parent")
            probs = draft.rows[codes[np.maximum(parents, 0)]]
        return cls(parents, tokens, logits, 1.0, probs)

    @property
    def num_nodes(self) -> int:
        return self.parents.size

    @property
    def vocab(self) -> int:
        return self.target_logits.shape[1]

    @property
    def max_depth(self) -> int:
        return int(depths(self.parents).max())

    def target_probs(self) -> np.ndarray:
        """``[N, V]`` target rows after temperature (``reference.distributions.softmax_rows``)."""
        return softmax_rows(self.target_logits, np.broadcast_to(self.temperature, (self.num_nodes,)))

    def path_codes(self) -> np.ndarray:
        """Code (``decode``) of each node's path tokens, the root's 0."""
        return path_codes(self.parents, self.tokens, self.vocab)

    def retrive_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """SGLang's ``(retrive_next_token, retrive_next_sibling)`` for this tree: first child
        and next sibling in index order, -1 for none (``retrive_index`` is ``arange(N)`` plus
        the request's offset; ``candidates`` is ``tokens`` with the last verified token at 0)."""
        first = np.full(self.num_nodes, -1, dtype=np.int64)
        sibling = np.full(self.num_nodes, -1, dtype=np.int64)
        for kids in children_lists(self.parents):
            if kids.size:
                first[self.parents[kids[0]]] = kids[0]
                sibling[kids[:-1]] = kids[1:]
        return first, sibling


def path_codes(parents: np.ndarray, tokens: np.ndarray, vocab: int) -> np.ndarray:
    codes = np.zeros(parents.size, dtype=np.int64)
    for j in range(1, parents.size):
        codes[j] = child_code(codes[parents[j]], tokens[j], vocab)
    return codes


def emitted_sequence_law(tree: DraftTree, law: np.ndarray) -> np.ndarray:
    """An outcome law ``[N, V]`` as a law over the codes of the emitted token sequences
    (path tokens, then ``y``): sequences of length ``1 .. max_depth + 1``."""
    out = np.zeros(num_codes(tree.vocab, tree.max_depth + 1))
    np.add.at(out, child_code(tree.path_codes()[:, None], np.arange(tree.vocab)[None], tree.vocab), law)
    return out


def _trial_seeds(seed: int, trials: int) -> np.ndarray:
    if not isinstance(trials, int | np.integer) or trials < 1:
        raise ValueError(f"trials: expected a positive integer, got {trials!r}")
    return hash64(seed, np.arange(trials))


# --- SGLang's EAGLE target-only rule -------------------------------------------------------
def check_thresholds(threshold_single, threshold_acc) -> tuple[float, float]:
    """``(threshold_single, threshold_acc)`` as floats (acc capped below at 1e-9, as the
    launcher does), or ``ValueError``: each finite and ``>= 0``."""
    out = []
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating) or not np.isfinite(value) or value < 0:
            raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        out.append(float(value))
    return out[0], max(out[1], MIN_THRESHOLD_ACC)


def sglang_residual_rows(tree: DraftTree, target: np.ndarray) -> np.ndarray:
    """``[N, V]`` unnormalized law emitted when the walk stops at each node: its target row
    without its children's tokens (every child was tried and rejected; none at a leaf)."""
    w = target.copy()
    for n, kids in enumerate(children_lists(tree.parents)):
        w[n, tree.tokens[kids]] = 0.0
    return w


def _emission(weights: np.ndarray) -> np.ndarray:
    """The normalized law an inverse-CDF draw from ``weights`` gives; ``V - 1`` when empty."""
    total = weights.sum()
    if total > 0:
        return weights / total
    out = np.zeros_like(weights)
    out[-1] = 1.0
    return out


def sglang_law(tree: DraftTree, threshold_single=1.0, threshold_acc=1.0) -> np.ndarray:
    """Exact ``[N, V]`` law of ``(accepted node, emitted token)`` under SGLang's rule.

    At a node reached, sibling ``i`` (token ``x_i``, cumulative target mass ``C_i`` of
    siblings ``0..i``) is accepted with probability ``min(1, C_i / acc) - min(1, C_{i-1} /
    acc)`` (the coin's interval), or all the mass left, ``1 - min(1, C_{i-1} / acc)``, when
    ``p(x_i) >= single``; later siblings are then never reached. The rest stops there and
    emits ``sglang_residual_rows``, normalized.

    Raises
    ------
    ValueError
        If a threshold is not a finite number ``>= 0``.
    """
    single, acc = check_thresholds(threshold_single, threshold_acc)
    target = tree.target_probs()
    residual = sglang_residual_rows(tree, target)
    reach = np.zeros(tree.num_nodes)
    reach[0] = 1.0
    law = np.zeros_like(target)
    for n, kids in enumerate(children_lists(tree.parents)):
        taken, mass = 0.0, 0.0  # P(coin <= C_{i-1} / acc), C_{i-1}
        for k in kids:
            if taken >= 1.0:
                break
            p_x = target[n, tree.tokens[k]]
            mass += p_x
            a = 1.0 - taken if p_x >= single else max(min(1.0, mass / acc) - taken, 0.0)
            reach[k] = reach[n] * a
            taken += a
        law[n] = reach[n] * max(1.0 - taken, 0.0) * _emission(residual[n])
    return law


class SGLangTreeSampler:
    """SGLang's rule drawn trial by trial (vectorized over trials), from the kernel's
    comparisons. Hooks, overridden by planted faults: ``accepts``, ``stop_weights``."""

    def accepts(self, coin, prob_acc, p_single, threshold_single, threshold_acc):
        """``coin <= prob_acc / threshold_acc || p(x) >= threshold_single`` (the kernel's test)."""
        return (coin <= prob_acc / threshold_acc) | (p_single >= threshold_single)

    def stop_weights(self, tree: DraftTree, target: np.ndarray) -> np.ndarray:
        """Per node, the weights the emitted token is drawn from when the walk stops there."""
        return sglang_residual_rows(tree, target)

    def sample(self, tree: DraftTree, trials: int, seed: int = 0, threshold_single=1.0, threshold_acc=1.0):
        """``(node, token)``, each ``[trials]`` int64: the deepest accepted node and the emitted token.

        Raises
        ------
        ValueError
            If ``trials`` is not a positive integer or a threshold is not finite and ``>= 0``.
        """
        single, acc = check_thresholds(threshold_single, threshold_acc)
        seeds = _trial_seeds(seed, trials)
        target = tree.target_probs()
        table = children_table(tree.parents)
        node = np.zeros(trials, dtype=np.int64)
        live = np.arange(trials)
        while live.size:
            n = node[live]
            coin = uniforms(seeds[live], n, Stream.ACCEPT)  # the accepted node's coin for its children
            kids = table[n]
            p_single = np.where(kids >= 0, target[n[:, None], tree.tokens[np.maximum(kids, 0)]], 0.0)
            ok = (kids >= 0) & self.accepts(coin[:, None], np.cumsum(p_single, axis=1), p_single, single, acc)
            hit = ok.any(axis=1)
            node[live[hit]] = kids[hit, np.argmax(ok[hit], axis=1)]
            live = live[hit]
        weights = self.stop_weights(tree, target)[node]
        return node, rules.inverse_cdf(weights, uniforms(seeds, FINAL_POSITION, Stream.RESIDUAL))


# --- SpecInfer's multi-round rule ----------------------------------------------------------
def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm(max(p - q, 0))`` row-wise; an empty residual keeps ``p``."""
    w = np.maximum(p - q, 0.0)
    total = w.sum(axis=-1, keepdims=True)
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), p)


def specinfer_node(target_row: np.ndarray, draft_rows: np.ndarray, child_tokens) -> tuple[np.ndarray, float, np.ndarray]:
    """One node of SpecInfer's rule: ``(accept, stop, emit)``.

    ``accept[k]``: probability that child ``k`` (token ``child_tokens[k]``, drafted from
    ``draft_rows[k]``) is the one accepted; ``stop``: every child rejected; ``emit``: the final
    residual, the law of the token emitted then (the target row when there are no children).
    """
    p = target_row
    accept = np.zeros(len(child_tokens))
    rejected = 1.0
    for k, (q, x) in enumerate(zip(draft_rows, child_tokens)):
        a = float(np.minimum(rules.ratio(p[x], q[x]), 1.0))
        accept[k] = rejected * a
        rejected *= 1.0 - a
        p = _residual(p, q)
    return accept, rejected, p


def _need_draft(tree: DraftTree):
    if tree.draft_probs is None:
        raise ValueError("draft_probs: SpecInfer's rule needs each node's draft probabilities")


def specinfer_law(tree: DraftTree) -> np.ndarray:
    """Exact ``[N, V]`` law of ``(accepted node, emitted token)`` under SpecInfer's rule for
    this tree's fixed children (not the target's law in general: see ``specinfer_drawn_law``).

    Raises
    ------
    ValueError
        If the tree has no ``draft_probs``.
    """
    _need_draft(tree)
    target = tree.target_probs()
    reach = np.zeros(tree.num_nodes)
    reach[0] = 1.0
    law = np.zeros_like(target)
    for n, kids in enumerate(children_lists(tree.parents)):
        accept, stop, emit = specinfer_node(target[n], tree.draft_probs[kids], tree.tokens[kids])
        reach[kids] = reach[n] * accept
        law[n] = reach[n] * stop * emit
    return law


def _check_drawn(parents, target: PrefixModel, draft: PrefixModel):
    parents = check_parents(parents)
    depth = int(depths(parents).max())
    if target.vocab != draft.vocab:
        raise ValueError(f"draft: vocabulary {draft.vocab} differs from the target's {target.vocab}")
    if target.max_len < depth or draft.max_len < depth - 1:
        raise ValueError(f"target/draft: a tree {depth} deep needs target prefixes up to {depth} and draft prefixes up to {depth - 1}")
    return parents, depth


def specinfer_drawn_law(parents, target: PrefixModel, draft: PrefixModel) -> np.ndarray:
    """Exact law of the emitted token sequence (over its codes, lengths ``1 .. depth + 1``)
    when every node's children are drafted independently from ``draft``'s row after the
    node's path and verified by SpecInfer's rule against ``target``'s rows.

    Enumerates every tuple of child tokens at each node reached (the draft row's support to
    the power of the node's child count). The rule is lossless here:
    ``target.completed(law, depth + 1) == target.sequence_law(depth + 1)``.

    Raises
    ------
    ValueError
        If ``parents`` is no tree, the models' vocabularies differ or they are too shallow
        for the tree, or a node would enumerate more than ``MAX_ENUMERATED_CHILDREN`` tuples.
    """
    parents, depth = _check_drawn(parents, target, draft)
    v = target.vocab
    kids = children_lists(parents)
    memo = {}

    def walk(n: int, code: int) -> np.ndarray:
        if (n, code) in memo:
            return memo[n, code]
        out = np.zeros(num_codes(v, depth + 1))
        here = child_code(code, np.arange(v), v)
        q = draft.rows[code] if kids[n].size else None
        support = np.flatnonzero(q > 0) if q is not None else np.zeros(0, dtype=np.int64)
        if kids[n].size == 0:
            out[here] = target.rows[code]
        elif support.size ** kids[n].size > MAX_ENUMERATED_CHILDREN:
            raise ValueError(
                f"parents: node {n}'s {kids[n].size} children over {support.size} tokens exceed {MAX_ENUMERATED_CHILDREN} tuples"
            )
        else:
            for xs in itertools.product(support, repeat=kids[n].size):
                weight = float(np.prod(q[list(xs)]))
                accept, stop, emit = specinfer_node(target.rows[code], np.broadcast_to(q, (len(xs), v)), xs)
                for k, x, a in zip(kids[n], xs, accept):
                    if a > 0:
                        out += weight * a * walk(int(k), int(child_code(code, x, v)))
                out[here] += weight * stop * emit
        memo[n, code] = out
        return out

    return walk(0, 0)


class SpecInferTreeSampler:
    """SpecInfer's rule drawn trial by trial (vectorized over trials). Hook, overridden by
    planted faults: ``residual`` (the target row after a rejection)."""

    def residual(self, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        """``norm(max(p - q, 0))`` per row; an empty residual keeps ``p``."""
        return _residual(p, q)

    def _walk(self, parents, trials, seed, target_rows, child):
        """The walk shared by fixed and drafted children: ``(node, code, token)`` per trial.

        ``target_rows(node, code)`` gives the rows to verify against; ``child(seeds, kid,
        code)`` gives the children's ``(tokens, draft rows)``."""
        seeds = _trial_seeds(seed, trials)
        table = children_table(parents)
        node = np.zeros(trials, dtype=np.int64)
        code = np.zeros(trials, dtype=np.int64)
        token = np.zeros(trials, dtype=np.int64)
        final = uniforms(seeds, FINAL_POSITION, Stream.RESIDUAL)
        live = np.arange(trials)
        while live.size:
            p = target_rows(node[live], code[live]).copy()
            vocab = p.shape[1]
            open_ = np.ones(live.size, dtype=bool)  # no child accepted yet
            kids = table[node[live]]
            for k in range(kids.shape[1]):
                act = np.flatnonzero(open_ & (kids[:, k] >= 0))
                if not act.size:
                    break
                trial, kid = live[act], kids[act, k]
                x, q = child(seeds[trial], kid, code[trial])
                at = np.arange(act.size)
                ok = uniforms(seeds[trial], kid, Stream.ACCEPT) < np.minimum(rules.ratio(p[act, x], q[at, x]), 1.0)
                node[trial[ok]] = kid[ok]
                code[trial[ok]] = child_code(code[trial[ok]], x[ok], vocab)
                open_[act[ok]] = False
                p[act[~ok]] = self.residual(p[act[~ok]], q[~ok])
            stop = np.flatnonzero(open_)
            token[live[stop]] = rules.inverse_cdf(p[stop], final[live[stop]])
            live = live[~open_]
        return node, code, token

    def sample(self, tree: DraftTree, trials: int, seed: int = 0):
        """``(node, token)``, each ``[trials]`` int64, for the tree's fixed children.

        Raises
        ------
        ValueError
            If the tree has no ``draft_probs`` or ``trials`` is not a positive integer.
        """
        _need_draft(tree)
        target = tree.target_probs()
        node, _, token = self._walk(
            tree.parents, trials, seed, lambda n, c: target[n], lambda s, kid, c: (tree.tokens[kid], tree.draft_probs[kid])
        )
        return node, token

    def sample_drawn(self, parents, target: PrefixModel, draft: PrefixModel, trials: int, seed: int = 0) -> np.ndarray:
        """Codes of the emitted token sequences, ``[trials]``, with every child drafted from
        ``draft`` (independently, from the row after its parent's path) when first tried.

        Raises
        ------
        ValueError
            As ``specinfer_drawn_law`` for the tree and models, or if ``trials`` is not a
            positive integer.
        """
        parents, _ = _check_drawn(parents, target, draft)

        def child(seeds, kid, code):
            q = draft.rows[code]
            return rules.inverse_cdf(q, uniforms(seeds, kid, Stream.DRAFT)), q

        _, code, token = self._walk(parents, trials, seed, lambda n, c: target.rows[c], child)
        return child_code(code, token, target.vocab)


def outcome_counts(tree: DraftTree, node, token) -> np.ndarray:
    """``[N, V]`` counts of sampled ``(node, token)`` outcomes, in the layout of the laws."""
    node, token = np.asarray(node, dtype=np.int64), np.asarray(token, dtype=np.int64)
    return (
        np.bincount(node * tree.vocab + token, minlength=tree.num_nodes * tree.vocab).reshape(tree.num_nodes, tree.vocab).astype(np.float64)
    )
