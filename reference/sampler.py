"""The vectorized float64 reference sampler.

``ReferenceSampler().sample(batch)`` takes a batch in the harness protocol's layout
(``harness.protocol.VerifyBatch``; any object with the same attributes works) and returns
``(tokens [B, K+1] int64, num_emitted [B] int64)``; slots past ``num_emitted`` hold -1.
Work is vectorized over requests and loops only over draft steps; a batch of trials repeats
its templates' rows, whose probabilities are computed once per period (``RepeatingRows``).
Each step of the algorithm is a method, so a planted fault (``harness.backends.faults``) overrides
exactly one of them.
"""

import dataclasses

import numpy as np

from reference import fly, processing, rules, typical
from reference.distributions import RepeatingRows, pad_vocab, repeat_period, softmax_rows
from reference.methods import Method
from reference.rng import Stream, uniforms


class ReferenceSampler:
    """Greedy, strict, standard (with or without draft probabilities), block, synthetic, typical, FLy."""

    stop_at_rejection = True  # a rejection ends the request's verification
    drafter = True  # draws its own drafts when a batch asks (``draft_sampling``)

    # --- inputs -----------------------------------------------------------------------
    def request_temperature(self, batch) -> np.ndarray:
        return np.asarray(batch.temperature, dtype=np.float64)

    def request_seeds(self, batch) -> np.ndarray:
        return np.asarray(batch.seeds)

    def request_params(self, batch):
        """Per-request (top_k, top_p, min_p) in the protocol's spelling (0, 1, 0 = off), or None
        when the batch has none."""
        if all(getattr(batch, name, None) is None for name in ("top_k", "top_p", "min_p")):
            return None
        n = len(batch.temperature)
        return [
            np.full(n, off, np.float64) if getattr(batch, name) is None else np.asarray(getattr(batch, name), np.float64)
            for name, off in (("top_k", 0.0), ("top_p", 1.0), ("min_p", 0.0))
        ]

    def request_logit_bias(self, batch):
        """Per-request logit bias as the protocol spells it, ``(ids [B, L] int64, biases [B, L]
        float64)`` (``-1`` pads), or None when the batch has none."""
        ids = getattr(batch, "logit_bias_ids", None)
        if ids is None:
            return None
        return np.asarray(ids, dtype=np.int64), np.asarray(batch.logit_bias, dtype=np.float64)

    def request_typical_params(self, batch) -> tuple[np.ndarray, np.ndarray]:
        """Per-request typical acceptance ``(posterior_threshold, posterior_alpha)`` [B] each, as
        the batch gives them (the protocol requires them with typical requests)."""
        if batch.posterior_threshold is None or batch.posterior_alpha is None:
            raise ValueError("posterior_threshold, posterior_alpha: a batch with typical requests must give both")
        return np.asarray(batch.posterior_threshold, dtype=np.float64), np.asarray(batch.posterior_alpha, dtype=np.float64)

    def request_fly_params(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-request FLy ``(window, entropy_threshold, entropy_top_k)`` [B] each, as the batch
        gives them (the protocol requires them with FLy requests)."""
        names = ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
        if any(getattr(batch, name, None) is None for name in names):
            raise ValueError(f"{', '.join(names)}: a batch with FLy requests must give all three")
        w, thr, k = (np.asarray(getattr(batch, name)) for name in names)
        return w.astype(np.int64), thr.astype(np.float64), k.astype(np.int64)

    def target_probs(self, logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
        return softmax_rows(logits, temperature)

    def processed_target_probs(
        self, logits, temperature, top_k, top_p, min_p, engine: str, logit_bias_ids=None, logit_bias=None
    ) -> np.ndarray:
        """Target rows with their requests' logit bias, then top-k / top-p / min-p (``reference.processing``)."""
        return processing.processed_rows(logits, temperature, top_k, top_p, min_p, engine, logit_bias_ids, logit_bias)

    def draft_probs(self, logits, temperature: np.ndarray, vocab_size: int):
        if logits is None:
            return None
        return pad_vocab(softmax_rows(logits, temperature), vocab_size)

    def effective_draft_counts(self, draft_tokens: np.ndarray, cu_num_drafts: np.ndarray):
        """Drafts end at the first placeholder (-1), which is never accepted."""
        counts = np.diff(cu_num_drafts)
        holes = np.flatnonzero(draft_tokens < 0)
        out = counts.copy()
        if holes.size:
            owner = np.searchsorted(cu_num_drafts, holes, side="right") - 1
            np.minimum.at(out, owner, holes - cu_num_drafts[owner])
        return out

    # --- its own drafter (``draft_sampling``) ------------------------------------------
    def draft_rows_probs(self, logits, temperature: np.ndarray, sampling: str, vocab_size: int) -> np.ndarray:
        """The law each draft is drawn from: ``softmax(row / T)``, the argmax when greedy or T = 0."""
        t = np.zeros_like(temperature) if sampling == "greedy" else temperature
        return pad_vocab(softmax_rows(logits, t), vocab_size)

    def draft_uniforms(self, seeds, positions):
        """The drafter's noise: its own stream, keyed like the verifier's by (seed, position)."""
        return uniforms(seeds, positions, Stream.DRAFT)

    def draw_drafts(self, batch) -> np.ndarray:
        """Draft ``j`` of request ``r`` from its draft row, keyed by the position of the row verifying it."""
        cu = np.asarray(batch.cu_num_drafts, dtype=np.int64)
        counts = np.diff(cu)
        owner = np.repeat(np.arange(counts.size), counts)
        rows = np.arange(int(cu[-1])) + owner  # the target row verifying each draft
        temperature = np.asarray(batch.temperature, dtype=np.float64)[owner]
        probs = self.draft_rows_probs(np.asarray(batch.draft_logits), temperature, batch.draft_sampling, batch.vocab_size)
        u = self.draft_uniforms(np.asarray(batch.seeds)[owner], np.asarray(batch.positions)[rows])
        return rules.inverse_cdf(probs, u)

    # --- one draft step ---------------------------------------------------------------
    def accept(self, method, target_rows, draft_rows, x, u_accept, rates, target_sample):
        """Whether each request accepts its draft ``x`` at this step."""
        accept = u_accept < rules.acceptance_probability(target_rows, draft_rows, x)
        accept = np.where(method == Method.STRICT, target_sample == x, accept)
        return np.where(method == Method.SYNTHETIC, u_accept < rates, accept)

    def verify_rows(self, rows: np.ndarray, bonus_rows: np.ndarray) -> np.ndarray:
        """The target row each draft is verified against (and resampled from)."""
        return rows

    def residual_rows(self, rows: np.ndarray, bonus_rows: np.ndarray) -> np.ndarray:
        """The target row the replacement token is drawn from after a rejection."""
        return rows

    def draft_index(self, starts: np.ndarray, step: int) -> np.ndarray:
        """The draft row of each request at this step."""
        return starts + step

    def residual_uniform(self, seeds, positions, u_accept):
        return uniforms(seeds, positions, Stream.RESIDUAL)

    def rejection_token(self, method, target_rows, draft_rows, x, u, target_sample):
        weights = rules.residual_weights(target_rows, draft_rows, x)
        drawn = rules.inverse_cdf(weights, u)
        return np.where(method == Method.STRICT, target_sample, drawn)

    # --- typical acceptance (reference.typical) ----------------------------------------
    def typical_accept(self, target_rows, x, posterior_threshold, posterior_alpha):
        """Whether each request accepts its draft ``x``: ``p(x) > min(eps, delta * exp(-H))``."""
        return typical.accepts(target_rows, x, posterior_threshold, posterior_alpha)

    def typical_recovered(self, target_rows):
        """The token emitted at the first rejection: the target row's argmax."""
        return typical.recovered_tokens(target_rows)

    # --- FLy (reference.fly) ----------------------------------------------------------
    def fly_entropy(self, gate_rows, top_k):
        """The top-k entropy gating an override (``compute_fly_entropy``)."""
        return fly.topk_entropy(gate_rows, top_k)

    def fly_deferrable(self, gate_rows, draft_rows, x, threshold, top_k, greedy):
        """Whether a native rejection of ``x`` may be overridden, the window aside."""
        out = np.empty(x.shape, dtype=bool)
        h = self.fly_entropy(gate_rows, top_k)
        for g in (True, False):  # greedy rows read no draft probability
            m = greedy == g
            if m.any():
                d = None if draft_rows is None else draft_rows[m]
                out[m] = fly.deferrable(gate_rows[m], d, x[m], threshold[m], top_k[m], greedy=g, entropy=h[m])
        return out

    def fly_passes(self, native, deferred, num_drafts, window):
        """Which positions pass: natively accepted, or overridden (the window rule)."""
        return fly.passes(native, deferred, num_drafts, window)

    def bonus_row(self, row_start: np.ndarray, num_drafts: np.ndarray) -> np.ndarray:
        return row_start + num_drafts

    def bonus_token(self, target_rows, u):
        return rules.inverse_cdf(target_rows, u)

    # --- the whole batch --------------------------------------------------------------
    def sample(self, batch):
        sampling = getattr(batch, "draft_sampling", None)
        if sampling is None:
            return self.verify(batch)
        drafts = self.draw_drafts(batch)
        # Greedy drafts come with no draft distribution: the engine verifies them as point masses.
        verified = self.verify(
            dataclasses.replace(
                batch, draft_tokens=drafts, draft_logits=None if sampling == "greedy" else batch.draft_logits, draft_sampling=None
            )
        )
        return (*verified, drafts)

    def verify(self, batch):
        cu = np.asarray(batch.cu_num_drafts, dtype=np.int64)
        num_reqs = cu.size - 1
        counts = np.diff(cu)
        starts = cu[:-1]
        row_start = starts + np.arange(num_reqs)
        temperature = self.request_temperature(batch)
        seeds = self.request_seeds(batch)
        positions = np.asarray(batch.positions)
        methods = np.asarray(batch.methods)
        drafts = np.asarray(batch.draft_tokens, dtype=np.int64)
        vocab = batch.target_logits.shape[-1]
        width = int(batch.max_drafts) + 1

        params = self.request_params(batch)
        bias = self.request_logit_bias(batch)
        row_temperature = np.repeat(temperature, counts + 1)
        if params is None and bias is None:

            def target_at(row_temperature):
                return _per_period(self.target_probs, batch.target_logits, row_temperature)
        else:
            engine = getattr(batch, "processing", None) or "vllm"
            if params is None:  # a bias alone: top-k, top-p and min-p off
                params = [np.zeros(num_reqs), np.ones(num_reqs), np.zeros(num_reqs)]

            def processed(logits, temperature, top_k, top_p, min_p, *bias):
                return self.processed_target_probs(logits, temperature, top_k, top_p, min_p, engine, *bias)

            per_row = [np.repeat(x, counts + 1, axis=0) for x in (*params, *(bias or ()))]

            def target_at(row_temperature):
                return _per_period(processed, batch.target_logits, row_temperature, per_row)

        target = target_at(row_temperature)
        draft = _per_period(lambda x, t: self.draft_probs(x, t, vocab), batch.draft_logits, np.repeat(temperature, counts))
        num_drafts = self.effective_draft_counts(drafts, cu)

        tokens = np.full((num_reqs, width), -1, dtype=np.int64)
        emitted = np.zeros(num_reqs, dtype=np.int64)
        block = methods == Method.BLOCK
        typical_reqs = methods == Method.TYPICAL
        fly_reqs = methods == Method.FLY
        chain = ~block & ~typical_reqs & ~fly_reqs
        if chain.any():
            self._verify_chain(
                np.flatnonzero(chain), target, draft, drafts, starts, row_start, num_drafts,
                seeds, positions, methods, batch.synthetic_rates, tokens, emitted,
            )  # fmt: skip
        if block.any():
            self._verify_block(
                np.flatnonzero(block), target, draft, drafts, starts, row_start, num_drafts,
                seeds, positions, tokens, emitted,
            )  # fmt: skip
        if typical_reqs.any():
            self._verify_typical(
                np.flatnonzero(typical_reqs), target, drafts, starts, row_start, num_drafts,
                seeds, positions, self.request_typical_params(batch), tokens, emitted,
            )  # fmt: skip
        if fly_reqs.any():
            # A greedy FLy row's entropy is read at temperature 1 (reference.fly); others' from the target.
            greedy_fly = fly_reqs & (temperature == 0)
            gate = target_at(np.where(row_temperature > 0, row_temperature, 1.0)) if greedy_fly.any() else target
            self._verify_fly(
                np.flatnonzero(fly_reqs), target, gate, draft, drafts, starts, row_start, num_drafts,
                seeds, positions, methods, temperature, self.request_fly_params(batch), tokens, emitted,
            )  # fmt: skip
        return tokens, emitted

    def _verify_fly(self, reqs, target, gate, draft, drafts, starts, row_start, num_drafts,
                    seeds, positions, methods, temperature, params, tokens, emitted):  # fmt: skip
        """FLy: every position's native decision (the chain's rule and uniform) and whether a
        native rejection there is deferrable; a position passes natively or by an override
        whose next ``W`` positions are natively accepted (``fly_passes``). The drafts before
        the first position that does not pass are emitted, then that position's native
        rejection token, or the bonus when all pass."""
        window, threshold, top_k = params
        n = num_drafts[reqs]
        depth = int(n.max(initial=0))
        native = np.zeros((reqs.size, depth), dtype=bool)
        deferred = np.zeros((reqs.size, depth), dtype=bool)
        greedy = temperature[reqs] == 0
        for step in range(depth):
            live = step < n
            r = reqs[live]
            rows = row_start[r] + step
            x = drafts[starts[r] + step]
            vrows = self.verify_rows(rows, row_start[r] + n[live])
            draft_rows = None if draft is None else draft[self.draft_index(starts[r], step)]
            u_accept = uniforms(seeds[r], positions[rows], Stream.ACCEPT)
            none = np.full(r.size, -1, dtype=np.int64)
            native[live, step] = self.accept(methods[r], target[vrows], draft_rows, x, u_accept, np.zeros(r.size), none)
            deferred[live, step] = self.fly_deferrable(gate[vrows], draft_rows, x, threshold[r], top_k[r], greedy[live])
        ok = self.fly_passes(native, deferred, n, window[reqs])
        stop = np.full(reqs.size, depth, dtype=np.int64)
        failed = (~ok).any(axis=1)
        if failed.any():
            stop[failed] = np.argmax(~ok[failed], axis=1)
        stop = np.minimum(stop, n)  # positions past a request's drafts are not verified
        for step in range(depth):
            kept = step < stop
            tokens[reqs[kept], step] = drafts[starts[reqs[kept]] + step]
        rejected = stop < n
        if rejected.any():
            r, step = reqs[rejected], stop[rejected]
            rows = row_start[r] + step
            bonus_rows = row_start[r] + n[rejected]
            u_accept = uniforms(seeds[r], positions[rows], Stream.ACCEPT)
            u = self.residual_uniform(seeds[r], positions[rows], u_accept)
            draft_rows = None if draft is None else draft[self.draft_index(starts[r], step)]
            none = np.full(r.size, -1, dtype=np.int64)
            residual_rows = target[self.residual_rows(self.verify_rows(rows, bonus_rows), bonus_rows)]
            tokens[r, step] = self.rejection_token(methods[r], residual_rows, draft_rows, drafts[starts[r] + step], u, none)
            emitted[r] = step + 1
        done = reqs[~rejected]
        rows = self.bonus_row(row_start[done], num_drafts[done])
        u = uniforms(seeds[done], positions[rows], Stream.RESIDUAL)
        tokens[done, num_drafts[done]] = self.bonus_token(target[rows], u)
        emitted[done] = num_drafts[done] + 1

    def _verify_typical(self, reqs, target, drafts, starts, row_start, num_drafts,
                        seeds, positions, params, tokens, emitted):  # fmt: skip
        """Typical acceptance: drafts kept up to the first one the rule rejects, whose row's
        argmax is emitted in its place; when all are kept, the bonus row is sampled."""
        eps, delta = params
        verifying = np.ones(reqs.size, dtype=bool)
        for step in range(int(num_drafts[reqs].max(initial=0))):
            live = verifying & (step < num_drafts[reqs])
            if not live.any():
                break
            r = reqs[live]
            rows = row_start[r] + step
            x = drafts[starts[r] + step]
            target_rows = target[rows]
            ok = self.typical_accept(target_rows, x, eps[r], delta[r])
            tokens[r[ok], step] = x[ok]
            bad = ~ok
            if bad.any():
                tokens[r[bad], step] = self.typical_recovered(target_rows[bad])
                verifying[np.flatnonzero(live)[bad]] = False
            emitted[r] = step + 1
        done = reqs[verifying]
        rows = self.bonus_row(row_start[done], num_drafts[done])
        u = uniforms(seeds[done], positions[rows], Stream.RESIDUAL)
        tokens[done, num_drafts[done]] = self.bonus_token(target[rows], u)
        emitted[done] = num_drafts[done] + 1

    def _verify_chain(self, reqs, target, draft, drafts, starts, row_start, num_drafts,
                      seeds, positions, methods, rates, tokens, emitted):  # fmt: skip
        verifying = np.ones(reqs.size, dtype=bool)
        for step in range(int(num_drafts[reqs].max(initial=0))):
            live = verifying & (step < num_drafts[reqs])
            if not live.any():
                break
            r = reqs[live]
            rows = row_start[r] + step
            x = drafts[starts[r] + step]
            bonus_rows = row_start[r] + num_drafts[r]
            vrows = self.verify_rows(rows, bonus_rows)
            target_rows = target[vrows]
            draft_rows = None if draft is None else draft[self.draft_index(starts[r], step)]
            u_accept = uniforms(seeds[r], positions[rows], Stream.ACCEPT)
            step_rates = np.zeros(r.size) if rates is None else np.asarray(rates)[r, step]
            sample = np.full(r.size, -1, dtype=np.int64)
            strict = methods[r] == Method.STRICT
            if strict.any():
                u_target = uniforms(seeds[r[strict]], positions[rows[strict]], Stream.TARGET)
                sample[strict] = rules.inverse_cdf(target_rows[strict], u_target)
            ok = self.accept(methods[r], target_rows, draft_rows, x, u_accept, step_rates, sample)
            tokens[r[ok], step] = x[ok]
            bad = ~ok
            if bad.any():
                u = self.residual_uniform(seeds[r[bad]], positions[rows[bad]], u_accept[bad])
                tokens[r[bad], step] = self.rejection_token(
                    methods[r[bad]],
                    target[self.residual_rows(vrows[bad], bonus_rows[bad])],
                    None if draft_rows is None else draft_rows[bad],
                    x[bad],
                    u,
                    sample[bad],
                )
                if self.stop_at_rejection:
                    idx = np.flatnonzero(live)[bad]
                    verifying[idx] = False
            emitted[r] = step + 1
        done = reqs[verifying]
        rows = self.bonus_row(row_start[done], num_drafts[done])
        u = uniforms(seeds[done], positions[rows], Stream.RESIDUAL)
        tokens[done, num_drafts[done]] = self.bonus_token(target[rows], u)
        emitted[done] = num_drafts[done] + 1

    def _verify_block(self, reqs, target, draft, drafts, starts, row_start, num_drafts,
                      seeds, positions, tokens, emitted):  # fmt: skip
        n = num_drafts[reqs]
        depth = int(n.max(initial=0))
        vocab = target.shape[-1]

        def draft_row(r, i):
            if draft is not None:
                return draft[starts[r] + i]
            one_hot = np.zeros((r.size, vocab))
            one_hot[np.arange(r.size), drafts[starts[r] + i]] = 1.0
            return one_hot

        rho = np.ones((reqs.size, depth + 1))
        stop = np.zeros(reqs.size, dtype=np.int64)
        for i in range(1, depth + 1):
            live = i <= n
            r = reqs[live]
            prev_rows = row_start[r] + i - 1
            x = drafts[starts[r] + i - 1]
            t_x = target[prev_rows, x]
            q_x = draft_row(r, i - 1)[np.arange(r.size), x]
            rho[live, i] = rules.block_step(rho[live, i - 1], rules.ratio(t_x, q_x))
            h = rho[live, i].copy()
            inner = i < n[live]
            if inner.any():
                ri = r[inner]
                res = rules.block_residual(rho[live, i][inner], target[row_start[ri] + i], draft_row(ri, i))
                mass = res.sum(axis=-1)
                denom = mass + 1.0 - rho[live, i][inner]
                with np.errstate(divide="ignore", invalid="ignore"):
                    h[inner] = np.where(denom > 0, mass / denom, 1.0)
            eta = uniforms(seeds[r], positions[prev_rows], Stream.BLOCK)
            stop[live] = np.where(eta <= h, i, stop[live])
        for i in range(depth):
            kept = i < stop
            tokens[reqs[kept], i] = drafts[starts[reqs[kept]] + i]
        rows = row_start[reqs] + stop
        full = stop == n
        weights = target[rows].copy()
        part = ~full
        if part.any():
            rp = reqs[part]
            res = rules.block_residual(rho[part, stop[part]], target[rows[part]], draft_row(rp, stop[part]))
            has_mass = res.sum(axis=-1) > 0
            weights[part] = np.where(has_mass[:, None], res, weights[part])
        u = uniforms(seeds[reqs], positions[rows], Stream.RESIDUAL)
        tokens[reqs, stop] = rules.inverse_cdf(weights, u)
        emitted[reqs] = stop + 1


def _per_period(probs_of, logits, temperature, params=()):
    """``probs_of(logits, temperature, *params)`` computed on one period of rows and standing
    for every row (``RepeatingRows``) where the rows, their temperatures and ``params``
    (per-row arrays) repeat bit for bit, as a batch of trials repeats its templates' rows:
    each row still gets its own result."""
    if logits is None:
        return probs_of(None, temperature)
    logits = np.asarray(logits)
    period = repeat_period(logits, np.column_stack([temperature, *params]) if params else temperature)
    probs = probs_of(logits[:period], temperature[:period], *(x[:period] for x in params))
    return None if probs is None else RepeatingRows(probs, len(logits))
