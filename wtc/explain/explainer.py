"""Per-weight predicate explanations, scored by conditional zero-ablation on held-out text.

For a sampled nonzero weight:
1. its exact per-position KL(clean || zeroed) on a search set of held-out windows (wtc.scan.engine);
2. candidate predicates f(tokens, pos) -> bool: the built-in grammar's beam search
   (wtc.explain.predicates) and, optionally, an external proposer (a callable or a shell command
   given the weight's importance contexts, returning predicate sources, which run only through
   the sandbox, wtc.explain.sandbox); a model with a tokenizer (Hugging Face) is read through its
   own tokens' decoded strings instead of bytes (wtc.explain.token_predicates);
3. each candidate scored exactly on the search set: A(S) = total KL when the weight is zeroed only
   at positions S (wtc.explain.conditional); recovery R = 1 - A(not f) / A(all) (the weight kept only
   where f holds), inverse I = 1 - A(f) / A(all); score = min(R, 1 - I); only predicates with
   coverage 0 < p(f) <= max_coverage compete;
4. the best one judged on K disjoint held-out slices it was not chosen on: interpretable when its
   pooled score over the slices is >= threshold, robustly interpretable when every slice passes too.
Reliability: the share of the variance of the per-slice scores that lies between weights (an
intraclass correlation: 1 when slices agree on each weight, 0 when the score is slice noise).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from wtc import arguments
from wtc.errors import ArgumentError, ArgumentTypeError, IndexOutOfRange, ScanError, UnknownName
from wtc.explain import predicate_search
from wtc.explain import sandbox
from wtc.explain.conditional import conditional_kl, is_local, matrices
from wtc.explain.token_predicates import TokenVocab, token_atoms
from wtc.explain.proposer import ProposerTimeout, run_command
from wtc.scan.engine import scan
from wtc.scan.inputs import as_tokens


@dataclass
class Explanation:
    param: str
    index: list[int]
    total_kl: float                        # on the search set
    predicate: str | None = None           # readable name of the best predicate
    source: str | None = None              # its Python source
    proposer: str | None = None            # "grammar" or "external"
    coverage: float | None = None          # p(f) on the search set
    search_score: float | None = None
    heldout_score: float | None = None     # pooled over the K slices
    slice_scores: list[float] = field(default_factory=list)
    interpretable: bool = False
    robust: bool = False
    examples: list[str] = field(default_factory=list)   # importance contexts (text up to the position)
    note: str = ""


def sample_weights(model, n: int, params=None, seed: int = 0) -> list[tuple[str, tuple[int, ...]]]:
    """n nonzero weights drawn uniformly (seeded) from the chosen weight matrices (default: every
    matrix: embedding, positions, attention W_Q/W_K/W_V/W_O, MLP W_in/W_out, unembedding; of other
    models every nn.Linear, Conv1D and nn.Embedding weight; biases and norm weights are not weights
    here)."""
    if isinstance(params, str):
        params = [params]
    if params is not None and (not isinstance(params, (list, tuple, set, frozenset)) or
                               not all(isinstance(k, str) for k in params)):
        raise ArgumentTypeError(f"params must be None or a list of weight-matrix names, got {params!r}")
    mats = matrices(model)
    named = {k: p for k, p in model.named_parameters() if k in mats and (params is None or k in params)}
    if params is not None and set(params) - set(named):
        raise UnknownName(f"not weight matrices of this model: {sorted(set(params) - set(named))}; its matrices: "
                          f"{', '.join(mats)}")
    n, seed = arguments.positive_int(n, "sample"), arguments.seed(seed)
    names = sorted(named)
    counts = np.array([int((named[k] != 0).sum()) for k in names])
    if counts.sum() == 0:
        raise ArgumentError("the chosen parameters have no nonzero weights")
    rng = np.random.default_rng([seed, 41])
    picks = np.sort(rng.choice(counts.sum(), size=min(n, int(counts.sum())), replace=False))
    edges = np.cumsum(counts)
    out = []
    for g in picks:
        k = int(np.searchsorted(edges, g, side="right"))
        local = int(g - (edges[k - 1] if k else 0))
        flat = torch.nonzero(named[names[k]].detach().flatten() != 0).flatten()[local]
        out.append((names[k], tuple(int(i) for i in np.unravel_index(int(flat), tuple(named[names[k]].shape)))))
    return out


def _scores(a_all: float, a_f: float, a_notf: float) -> float:
    """min(R, 1 - I) with R = 1 - A(not f)/A(all), I = 1 - A(f)/A(all)."""
    if a_all <= 0:
        return float("nan")
    return float(min(1 - a_notf / a_all, a_f / a_all))


class Scorer:
    """A(all), A(f), A(not f) for one weight on one token set, exact, with the clean pass cached."""

    def __init__(self, model, tokens: torch.Tensor):
        self.model, self.tokens = model, tokens
        with torch.no_grad():
            self.clean_logp = torch.log_softmax(model(tokens).double(), -1)

    def kl_map(self, name, index) -> torch.Tensor:
        """(B, T) per-position KL of zeroing the weight everywhere."""
        full = torch.ones(self.tokens.shape, dtype=torch.bool)
        return conditional_kl(self.model, self.tokens, name, index, full, self.clean_logp, per_position=True)

    def triple(self, name, index, F: np.ndarray, kl_map: torch.Tensor | None = None) -> tuple[float, float, float]:
        F = torch.as_tensor(F, dtype=torch.bool)
        if is_local(self.model, name):            # additive shortcut, exact here
            kl = self.kl_map(name, index) if kl_map is None else kl_map
            return float(kl.sum()), float(kl[F].sum()), float(kl[~F].sum())
        masks = [F, ~F] if kl_map is not None else [torch.ones_like(F), F, ~F]
        res = conditional_kl(self.model, self.tokens, name, index, masks, self.clean_logp).tolist()
        if kl_map is not None:
            res = [float(kl_map.sum())] + res
        return res[0], res[1], res[2]


def _context_text(tokens_row: np.ndarray, pos: int, vocab: TokenVocab | None = None, width: int = 48) -> str:
    """The text up to and including pos: 48 bytes, or 16 decoded tokens of a tokenizer's model."""
    if vocab is not None:
        return "".join(vocab.texts(tokens_row[max(0, pos - 15):pos + 1]))
    lo = max(0, pos - width + 1)
    return bytes(tokens_row[lo:pos + 1].astype(np.uint8)).decode("latin-1")


def _vocab(model, tokenizer) -> TokenVocab | None:
    """The token strings a model is read through: the given tokenizer's, else the model's own
    (a Hugging Face model's `tokenizer`), else None (byte tokens)."""
    from wtc.scan.inputs import vocab_size

    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    return None if tokenizer is None else TokenVocab.from_tokenizer(tokenizer, vocab_size(model))


def _external(proposer, contexts: list[str], timeout_s: float) -> list[str]:
    """Candidate sources from a callable or a shell command (JSON list of contexts on stdin,
    JSON list of sources on stdout; run contained: wtc.explain.proposer)."""
    if not callable(proposer):
        return run_command(proposer, contexts, timeout_s)
    out = proposer(contexts)
    if not isinstance(out, (list, tuple)) or not all(isinstance(s, str) for s in out):
        raise TypeError(f"a proposer must return a list of predicate sources, got {type(out).__name__}")
    return list(out)


def _given_weights(model, weights) -> list[tuple[str, tuple[int, ...]]]:
    """[(name, index tuple)] checked against the model's parameters (UnknownName / IndexError)."""
    params, out = dict(model.named_parameters()), []
    for item in weights:
        try:
            name, idx = item
            idx = (int(idx),) if isinstance(idx, (int, np.integer)) else tuple(int(i) for i in idx)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"weights must be (name, index) pairs, got {item!r}") from None
        if name not in params:
            raise UnknownName(f"weights: {name!r} is not a parameter of this model")
        shape = tuple(params[name].shape)
        if len(idx) != len(shape):
            raise IndexOutOfRange(f"weights: index {idx} of {name} must have one entry per dimension of its "
                                  f"shape {shape}")
        if any(not 0 <= i < n for i, n in zip(idx, shape)):
            raise IndexOutOfRange(f"weights: index {idx} out of range for {name} {shape}")
        out.append((name, idx))
    return out


def _restoring_mode(fn):
    """fn(model, ...) with every submodule's train/eval mode as it was afterwards (explain runs the
    model in eval mode; it used to leave a model in training in eval mode)."""
    import functools

    @functools.wraps(fn)
    def run(model, *args, **kwargs):
        modes = [(m, m.training) for m in model.modules()] if isinstance(model, torch.nn.Module) else []
        try:
            return fn(model, *args, **kwargs)
        finally:
            for m, training in modes:
                m.training = training
    return run


@_restoring_mode
def explain(model, search_tokens, slices: list, sample: int = 100, params=None, seed: int = 0, proposer=None,
            threshold: float = 0.75, max_coverage: float = 0.5, candidates: int = 5, beam: int = 10,
            max_atoms: int = 3, progress: bool = True, proposer_timeout_s: float = 60.0, weights=None,
            builtin: bool = True, tokenizer=None) -> dict:
    """Explain `sample` weights of `model` (see the module docstring). search_tokens (n, T) and each
    slice (n_k, T) are tokens of held-out text: bytes, or the ids of the model's tokenizer (given as
    tokenizer=, or the model's own `tokenizer`: Hugging Face models), whose decoded strings the
    predicates then read (wtc.explain.token_predicates); weights: explain these [(name, index), ...]
    instead of a sample; builtin=False: only the external proposer's candidates compete.
    Returns {"weights": [Explanation...], "summary": {...}}."""
    search = as_tokens(search_tokens, model, name="search_tokens")      # integers only: floats are not truncated
    if isinstance(slices, (str, bytes)) or not hasattr(slices, "__len__") or len(slices) == 0:
        raise ScanError(f"slices must be a non-empty list of (n, T) token arrays, got {type(slices).__name__}")
    slices = [as_tokens(s, model, name=f"slices[{k}]") for k, s in enumerate(slices)]
    max_coverage, threshold = arguments.fraction(max_coverage, "max_coverage"), arguments.fraction(threshold, "threshold")
    candidates, beam = arguments.positive_int(candidates, "candidates"), arguments.positive_int(beam, "beam")
    max_atoms = arguments.positive_int(max_atoms, "max_atoms", upper=16)
    proposer_timeout_s = arguments.positive_seconds(proposer_timeout_s, "proposer_timeout_s")
    if proposer is not None and not callable(proposer) and not (isinstance(proposer, str) and proposer.strip()):
        raise ArgumentTypeError(f"proposer must be None, a callable or a shell command (a non-empty str), got {proposer!r}")
    t0 = time.perf_counter()
    model.eval()
    weights = sample_weights(model, sample, params, seed) if weights is None else _given_weights(model, weights)
    search_scorer = Scorer(model, search)
    slice_scorers = [Scorer(model, s) for s in slices]
    search_np = search.numpy()
    vocab = _vocab(model, tokenizer)
    library = token_atoms(search_np, vocab) if vocab is not None else None    # bytes: built per weight, as always
    params, chosen = dict(model.named_parameters()), {}
    for name, index in weights:
        chosen.setdefault(name, torch.zeros(params[name].shape, dtype=torch.bool))[index] = True
    scanned = scan(model, search, params=sorted(chosen), weights=chosen, keep_positions=True, progress=False)
    out: list[Explanation] = []
    failures: list[str] = []                 # what the external proposer raised, one per failed call
    gave_up = None                           # why the proposer is no longer asked (its first timeout)
    for name, index in tqdm(weights, disable=not progress, desc="explain", unit="w"):
        kl = scanned.position_kl(name, index).reshape(search.shape)         # (n, T) exact
        total = float(kl.sum())
        ex = Explanation(name, list(index), total)
        out.append(ex)
        if total <= 1e-12:
            ex.note = "no effect on the search set"
            continue
        kl_np = kl.numpy()
        found = predicate_search.search(search_np, kl_np, beam=beam, max_atoms=max_atoms, max_coverage=max_coverage,
                                        top=candidates, library=library) if builtin else []
        cands = [(p.name, p.source, p.evaluate, "grammar") for p, _ in found]
        flat = np.argsort(-kl_np, axis=None)[:20]
        ex.examples = [_context_text(search_np[i // kl_np.shape[1]], int(i % kl_np.shape[1]), vocab)
                       for i in flat[:5]]
        if proposer is not None and gave_up is not None:
            ex.note += "external proposer not asked (it timed out earlier); "
        elif proposer is not None:
            ctx = [_context_text(search_np[i // kl_np.shape[1]], int(i % kl_np.shape[1]), vocab) for i in flat]
            try:
                sources = _external(proposer, ctx, proposer_timeout_s)
            except Exception as exc:        # a broken proposer costs its candidates, not the run
                ex.note += f"external proposer failed: {type(exc).__name__}: {exc}; "
                failures.append(f"{type(exc).__name__}: {exc}")
                sources = []
                if isinstance(exc, ProposerTimeout):     # a hung proposer would cost its timeout on every weight
                    gave_up = (f"the proposer timed out after {proposer_timeout_s:g} s on weight {len(out)} of "
                               f"{len(weights)} and was not asked again; the built-in search went on alone")
                    if progress:
                        tqdm.write(f"explain: {gave_up}")
            for src in sources:
                try:
                    sandbox.check_source(src)
                except sandbox.PredicateRejected as exc:
                    ex.note += f"rejected external predicate: {exc}; "
                    continue
                cands.append(("external", src, lambda toks, src=src: sandboxed_truth(src, toks, vocab=vocab),
                              "external"))
        best = None
        for cname, src, truth, who in cands:
            try:
                F = truth(search_np)
            except sandbox.PredicateRejected as exc:
                ex.note += f"rejected external predicate: {exc}; "
                continue
            cov = float(F.mean())
            if not 0 < cov <= max_coverage:
                continue
            a = search_scorer.triple(name, index, F, kl)
            score = _scores(*a)
            if best is None or score > best[0]:
                best = (score, cname, src, cov, who, truth)
        if best is None:
            ex.note += "no candidate predicate within the coverage gate"
            continue
        ex.search_score, ex.predicate, ex.source, ex.coverage, ex.proposer, truth = best
        sums = np.zeros(3)
        for sc in slice_scorers:
            a = np.array(sc.triple(name, index, truth(sc.tokens.numpy())))
            sums += a
            ex.slice_scores.append(_scores(*a))
        ex.heldout_score = _scores(*sums)
        ex.interpretable = bool(ex.heldout_score >= threshold)
        ex.robust = bool(ex.interpretable and all(s >= threshold for s in ex.slice_scores))
    summary = summarise(out, threshold)
    summary.update(seconds=round(time.perf_counter() - t0, 1), threshold=threshold, max_coverage=max_coverage,
                   slices=len(slices), search_positions=int(search.numel()))
    if vocab is not None:                    # byte-level summaries stay as they were
        summary["tokenizer"] = vocab.name
    if proposer is not None:                 # said in the summary, not only in each weight's note
        summary.update(proposer_failures=len(failures), proposer_error=failures[0][:300] if failures else None,
                       proposer_gave_up=gave_up)
    return {"weights": out, "summary": summary}


def sandboxed_truth(source: str, tokens: np.ndarray, timeout_s: float = 30.0, vocab: TokenVocab | None = None) -> np.ndarray:
    """(n, T) truth array of an untrusted predicate source on byte tokens (or on the decoded strings
    of token ids, given their vocab), run in the sandbox. (Grammar predicates use their vectorised
    form, equal to their source by construction and test.)"""
    tokens = np.asarray(tokens)
    contexts = ([[chr(int(b)) for b in row] for row in tokens] if vocab is None
                else [vocab.texts(row) for row in tokens])
    return np.asarray(sandbox.evaluate(source, contexts, None, timeout_s=timeout_s), bool).reshape(tokens.shape)


def reliability(score_matrix: np.ndarray) -> float | None:
    """Between-weight share of the variance of per-slice scores (rows: weights, columns: slices)."""
    s = np.asarray(score_matrix, float)
    s = s[~np.isnan(s).any(1)] if s.ndim == 2 else s
    if s.ndim != 2 or s.shape[0] < 2 or s.shape[1] < 2:
        return None
    within = float(s.var(1, ddof=1).mean())
    between = float(s.mean(1).var(ddof=1)) - within / s.shape[1]     # the mean carries within / K of noise
    between = max(between, 0.0)
    return between / (between + within) if between + within > 0 else None


def summarise(expl: list[Explanation], threshold: float) -> dict:
    scored = [e for e in expl if e.total_kl > 1e-12]
    n = len(scored)
    with_slices = [e.slice_scores for e in scored if e.slice_scores]
    return {"weights_sampled": len(expl), "weights_scored": n,
            "interpretable_fraction": (sum(e.interpretable for e in scored) / n) if n else None,
            "robust_fraction": (sum(e.robust for e in scored) / n) if n else None,
            "reliability": reliability(np.array(with_slices)) if len(with_slices) >= 2 else None,
            "mean_heldout_score": _finite_mean([e.heldout_score for e in scored])}


def _finite_mean(values) -> float | None:
    v = [x for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else None


def _plain(v):
    """NaN (a score whose A(all) is 0 on some slice) as None: JSON has no NaN."""
    if isinstance(v, float) and not np.isfinite(v):
        return None
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def to_json(result: dict) -> dict:
    return {"summary": {k: _plain(v) for k, v in result["summary"].items()},
            "weights": [{k: _plain(v) for k, v in asdict(e).items()} for e in result["weights"]]}


__all__ = ["explain", "Explanation", "Scorer", "sample_weights", "reliability", "summarise", "to_json"]
