"""Tree scenarios: a topology, the rule that verifies it, its settings, and seeded prefix
models (``reference.tree.PrefixModel``) on a small vocabulary, so every exact law is cheap.

A scenario is pure data (``to_dict``); ``build`` makes its case: the tree a backend is
given, the models, and the exact law of the cells ``tree-law`` counts. Fixed children are
the draft model's most likely tokens at their parent, in order (an EAGLE-style top-k tree);
``duplicate`` repeats the first one (the second sibling drafts the same token); ``drafted``
children are drawn per trial from the draft model (SpecInfer's i.i.d. drafting).
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from reference import tree as tr
from reference.distributions import softmax_rows

RULES = ("sglang", "specinfer")
CHILDREN = ("top-k", "duplicate", "drafted")
LOSSLESS_TOLERANCE = 1e-12  # TV between a lossless law and the target's: float64 rounding only

CHAIN = (-1, 0, 1, 2)
BINARY2 = (-1, 0, 0, 1, 1, 2, 2)
BINARY3 = BINARY2 + (3, 3, 4, 4, 5, 5, 6, 6)
WIDE_ROOT = (-1, 0, 0, 0, 0)
DUPLICATES = (-1, 0, 0, 0, 1, 1)  # root children (a, a, b), node 1's (c, c)
ONE_NODE = (-1,)


@dataclass(frozen=True)
class TreeScenario:
    name: str
    rule: str  # "sglang" or "specinfer": the rule whose law the backend is held to
    parents: tuple[int, ...]
    vocab: int
    children: str = "top-k"  # how the children's tokens are chosen: CHILDREN
    temperature: float = 1.0  # the target's (the tree's rows are logits at this temperature)
    thresholds: tuple[float, float] = (1.0, 1.0)  # SGLang's (threshold_single, threshold_acc)
    model_seed: int = 0  # the prefix models' seed: fixed, so a scenario's laws never change
    description: str = ""

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"tree scenario {self.name}: rule {self.rule!r} is not one of {', '.join(RULES)}")
        if self.children not in CHILDREN:
            raise ValueError(f"tree scenario {self.name}: children {self.children!r} is not one of {', '.join(CHILDREN)}")
        if self.children == "drafted" and self.rule != "specinfer":
            raise ValueError(f"tree scenario {self.name}: drafted children are SpecInfer's setting")
        if self.thresholds != (1.0, 1.0) and self.rule != "sglang":
            raise ValueError(f"tree scenario {self.name}: thresholds are SGLang's")
        tr.check_parents(self.parents)
        tr.check_thresholds(*self.thresholds)
        if not 2 <= self.vocab <= 32 or not self.temperature > 0:
            raise ValueError(f"tree scenario {self.name}: vocab in [2, 32] and a temperature > 0 expected")

    @property
    def depth(self) -> int:
        return int(tr.depths(np.asarray(self.parents)).max())

    @property
    def lossless(self) -> bool:
        """Whether the rule is lossless here (docs/trees.md): nothing to verify (one node);
        SGLang with thresholds that never accept on their own and distinct siblings;
        SpecInfer with drafted children. The ``lossless`` check verifies the claim exactly."""
        if self.depth == 0:
            return True
        if self.rule == "sglang":
            return self.thresholds[0] >= 1.0 and self.thresholds[1] == 1.0 and self.children != "duplicate"
        return self.children == "drafted"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["lossless"] = self.lossless
        return d

    def build(self) -> "TreeCase":
        rng = np.random.default_rng(self.model_seed)
        raw = tr.PrefixModel.random(rng, self.vocab, self.depth)
        draft = tr.PrefixModel.random(rng, self.vocab, max(self.depth - 1, 0))
        with np.errstate(divide="ignore"):
            tempered = softmax_rows(np.log(raw.rows), self.temperature)
        target = tr.PrefixModel(tempered, self.vocab, self.depth)  # the law the tree's rows follow
        if self.children == "drafted":
            law = tr.specinfer_drawn_law(self.parents, target, draft)
            return TreeCase(self, target, draft, None, law)
        tokens = self._tokens(draft)
        tree = tr.DraftTree.from_models(self.parents, tokens, raw, draft)
        if self.temperature != 1.0:
            tree = dataclasses.replace(tree, temperature=self.temperature)
        law = tr.sglang_law(tree, *self.thresholds) if self.rule == "sglang" else tr.specinfer_law(tree)
        return TreeCase(self, target, draft, tree, law.ravel())

    def _tokens(self, draft: tr.PrefixModel) -> np.ndarray:
        """Each node's children: the draft's most likely tokens after the parent's path, in
        order (``duplicate``: the second sibling repeats the first)."""
        parents = np.asarray(self.parents)
        tokens = np.full(parents.size, -1, dtype=np.int64)
        codes = np.zeros(parents.size, dtype=np.int64)
        for kids in tr.children_lists(parents):
            if not kids.size:
                continue
            parent = parents[kids[0]]
            ranked = np.argsort(-draft.rows[codes[parent]], kind="stable")
            picks = ranked[: kids.size].copy()
            if self.children == "duplicate" and kids.size > 1:
                picks[1:] = ranked[: kids.size - 1]
            tokens[kids] = picks
            codes[kids] = tr.child_code(codes[parent], picks, self.vocab)
        return tokens


@dataclass(frozen=True, eq=False)
class TreeCase:
    """A built scenario: ``tree`` (fixed children) or None (drafted), the models, and
    ``law``: flat probabilities of the cells ``tree-law`` counts, ``(accepted node, emitted
    token)`` for fixed children, the emitted token sequence's code for drafted ones."""

    scenario: TreeScenario
    target: tr.PrefixModel  # the target at the scenario's temperature
    draft: tr.PrefixModel
    tree: tr.DraftTree | None
    law: np.ndarray

    @property
    def cells(self) -> str:
        return "emitted sequence" if self.tree is None else "(accepted node, emitted token)"

    def label(self, cell: int) -> str:
        if self.tree is None:
            return "seq " + " ".join(map(str, tr.decode(cell, self.scenario.vocab)))
        node, token = divmod(cell, self.scenario.vocab)
        return f"node {node} token {token}"

    def emitted_law(self) -> np.ndarray:
        """The law over emitted token sequences (codes)."""
        if self.tree is None:
            return self.law
        return tr.emitted_sequence_law(self.tree, self.law.reshape(self.tree.num_nodes, self.tree.vocab))

    def lossless_tv(self) -> float:
        """TV between the emitted sequences continued by the target and the target's own
        law of ``depth + 1`` tokens: 0 up to rounding where the rule is lossless."""
        length = self.scenario.depth + 1
        completed = self.target.completed(self.emitted_law(), length)
        return 0.5 * float(np.abs(completed - self.target.sequence_law(length)).sum())


CATALOG = (
    TreeScenario("sglang-chain", "sglang", CHAIN, 16, model_seed=1, description="a chain 3 deep: the standard rule without draft probabilities"),
    TreeScenario("sglang-binary", "sglang", BINARY3, 8, model_seed=2, description="a binary tree 3 deep (15 nodes)"),
    TreeScenario("sglang-wide-root", "sglang", WIDE_ROOT, 8, model_seed=3, description="four children of the root, one level"),
    TreeScenario(
        "sglang-duplicates", "sglang", DUPLICATES, 8, "duplicate", model_seed=4,
        description="siblings drafting the same token: their mass counted twice (a known lossy setting)",
    ),
    TreeScenario("sglang-one-node", "sglang", ONE_NODE, 32, model_seed=5, description="no drafts: the bonus row"),
    TreeScenario(
        "sglang-lossy-thresholds", "sglang", BINARY2, 8, thresholds=(0.45, 0.6), model_seed=6,
        description="threshold_single 0.45, threshold_acc 0.6: SGLang's lossy acceptance",
    ),
    TreeScenario("sglang-low-temperature", "sglang", BINARY2, 8, temperature=0.3, model_seed=7, description="the target at T = 0.3"),
    TreeScenario("specinfer-chain", "specinfer", CHAIN, 16, temperature=0.7, model_seed=8, description="a chain 3 deep at T = 0.7, fixed drafts"),
    TreeScenario("specinfer-binary", "specinfer", BINARY3, 8, model_seed=9, description="a binary tree 3 deep, fixed children"),
    TreeScenario("specinfer-wide-root", "specinfer", WIDE_ROOT, 8, model_seed=10, description="four fixed children of the root"),
    TreeScenario("specinfer-duplicates", "specinfer", DUPLICATES, 8, "duplicate", model_seed=11, description="siblings drafting the same token"),
    TreeScenario("specinfer-one-node", "specinfer", ONE_NODE, 32, model_seed=12, description="no drafts: the bonus row"),
    TreeScenario(
        "specinfer-drafted-binary", "specinfer", BINARY2, 8, "drafted", model_seed=13,
        description="a binary tree 2 deep, every child drawn i.i.d. from the draft (lossless)",
    ),
    TreeScenario(
        "specinfer-drafted-wide-root", "specinfer", WIDE_ROOT, 8, "drafted", model_seed=14,
        description="four children of the root drawn i.i.d. from the draft: duplicates drawn too (lossless)",
    ),
    TreeScenario("specinfer-low-temperature", "specinfer", BINARY2, 8, temperature=0.3, model_seed=15, description="the target at T = 0.3"),
)  # fmt: skip


def find(name: str) -> TreeScenario:
    """The catalog scenario ``name``; ``ValueError`` with the closest name and the list."""
    from harness.scenarios.scenario import did_you_mean

    for s in CATALOG:
        if s.name == name:
            return s
    names = [s.name for s in CATALOG]
    raise ValueError(f"--scenario: unknown tree scenario {name!r}{did_you_mean(name, names)} (known: {', '.join(names)})")
