"""ACE on language models: the number-agreement axis (`wtc study agreement [--quick] [--model DIR]`).

Small token transformers (wtc.models.Transformer, differing in seed, depth/width and norm/activation)
are trained with the project's loop (wtc.models.training) on the agreement corpus
(wtc.tasks.agreement): one sentence per sequence, "." first, next-token cross-entropy over the
sentence, plus `verb_weight` x the mean cross-entropy at the number-marked main verbs (with
verb_weight 0 a 2-layer d64 model had not learned agreement after 400 steps here; with 1 it has at
~250; measured in bench/RESULTS.md). Or, with `--model DIR`, a user's local Hugging Face causal LM
(wtc.models.hf; its own tokenizer) is analysed instead, untrained by us.

For each model, at the position that predicts the main verb of held-out sentences (per-input
positions: sentences differ in length), with the readout (log P(singular verbs), log P(plural
verbs)) (logsumexp of the logits over the number-marked forms) and margin = plural - singular:

- the core of the last layer's residual stream (blocks.{L-1}.hook_resid_post): rank at energy 0.99,
  minimal sufficient / necessary ranks, fitted on a mixed held-out set (attractor and not);
- on a separate held-out attractor set: accuracy clean / keep / remove / flip (the readout's
  argmax is the subject's number) and the label-signed margin under each; `flip_reversal`, the
  share of sentences whose margin changes sign when the core coordinate is flipped;
- `r2`: how much of the margin the 1-D projection predicts (squared correlation);
- `generation_flip`: greedy continuations (`gen_tokens` tokens) from each attractor prefix, clean and
  with the flip applied at the verb-predicting position: the share whose first number-marked verb
  has the other number (a continuation without one counts as not reversed);
- the layer profile: rank, r2 and flip reversal at every layer's hook_resid_post;
- agreement accuracy by distance and by modifier kind (the sentence's own verb: correct form over
  the incorrect one).

The corpus (`corpus`): "graded" (wtc.tasks.agreement_graded: Zipf noun frequencies, number-ambiguous
collective and invariant nouns whose verb number is drawn with a noun-specific probability) or
"uniform" (the Session 7 corpus, reproduced exactly). The fit set, the attractor set and the
no-attractor set have subjects of definite number in both; every accuracy, keep / remove / flip,
flip reversal and generation figure is over them. In the graded corpus held-out sentences with a
number-ambiguous subject and a modifier (no other number evidence) join the attractor sentences in
the Spearman set, in the corpus's share of such subjects (`ambiguous_n` in summary.json); they have
no definite label, so they are in no accuracy or flip figure.

Across models: Spearman correlation of the 1-D coordinates over the same attractor sentences (each
coordinate's sign fixed so that it grows with the margin), and the same within each subject number
(`spearman_within_number`: for two equal classes that both coordinates separate, the split alone
gives a Spearman of 0.75 whatever the order inside the classes), the same for the models' margins
(how far their behaviour orders the sentences alike), over a mixed set, over the attractor sentences
alone (`spearman_definite`) and the ambiguous ones alone (wtc.studies.agreement_compare).
Writes summary.json (`models`: name,
rank, baseline_acc, keep_acc, remove_acc, flip_reversal, generation_flip, ...; `spearman`),
report.md and agreement.png. Each model is one unit of work kept in out/<model name>/analysis.json
(its analysis and training figures, with the settings it was computed from); training states live
in out/<model name>/train_state. A rerun reuses every finished unit (and says so), resumes an
unfinished training, and computes what is missing or was computed from other settings; a model
directory is compared as the directory it names, however it is spelled (wtc.studies.clock).
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wtc.ace import extract_core, patched, patched_accuracy, validate
from wtc.ace.core import PATCH_MODES
from wtc.errors import StudyError
from wtc.studies.agreement_compare import compare, spearman  # noqa: F401 (spearman: public)
from wtc.studies.agreement_report import markdown, plot
from wtc.studies.clock import Clock, check_config, kept, resolved, study_dir
from wtc.tasks.agreement import DEFAULT_VARIANT, VARIANTS
from wtc.threads import torch_threads

ENERGY = 0.99


@dataclass(frozen=True)
class ModelSpec:
    name: str
    n_layers: int
    d_model: int
    normalization: str | None = "LN"
    act_fn: str = "gelu"
    seed: int = 0


FULL_MODELS = (ModelSpec("L2-d128-LN-gelu-s0", 2, 128, "LN", "gelu", 0),
               ModelSpec("L2-d128-LN-gelu-s1", 2, 128, "LN", "gelu", 1),
               ModelSpec("L3-d64-RMS-relu-s0", 3, 64, "RMS", "relu", 0),
               ModelSpec("L4-d96-RMS-relu-s2", 4, 96, "RMS", "relu", 2))
QUICK_MODELS = (ModelSpec("L2-d64-LN-gelu-s0", 2, 64, "LN", "gelu", 0),
                ModelSpec("L2-d64-LN-gelu-s1", 2, 64, "LN", "gelu", 1),
                ModelSpec("L3-d64-RMS-relu-s0", 3, 64, "RMS", "relu", 0))


@dataclass
class AgreementStudy:
    models: tuple = FULL_MODELS
    corpus_seed: int = 0
    train_sentences: int = 30000
    n_ctx: int = 24
    steps: int = 600
    batch: int = 64
    lr: float = 3e-3
    warmup: int = 30
    verb_weight: float = 1.0
    fit_n: int = 600              # held-out sentences the core is fitted on (half with attractors)
    eval_n: int = 600             # held-out attractor sentences it is evaluated on
    gen_tokens: int = 4
    threads: int = 1
    model: str | None = None      # a local Hugging Face model directory: analyse it instead of training
    corpus: str = DEFAULT_VARIANT  # wtc.tasks.agreement variant: "graded" or "uniform" (the Session 7 corpus)

    @classmethod
    def quick(cls) -> "AgreementStudy":
        return cls(models=QUICK_MODELS, steps=300, fit_n=400, eval_n=400)

    def __post_init__(self) -> None:
        self.models = tuple(m if isinstance(m, ModelSpec) else ModelSpec(**m) for m in self.models)
        for name in ("train_sentences", "n_ctx", "steps", "batch", "warmup", "fit_n", "eval_n", "gen_tokens", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "warmup" else 1):
                raise StudyError(f"AgreementStudy.{name} must be a positive int, got {v!r}")
        if self.n_ctx < 20:
            raise StudyError(f"AgreementStudy.n_ctx must be >= 20 (the longest sentence and its continuation), "
                             f"got {self.n_ctx}")
        for name in ("lr", "verb_weight"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 or \
                    (name == "lr" and v == 0):
                raise StudyError(f"AgreementStudy.{name} must be a finite number ({'> 0' if name == 'lr' else '>= 0'}), "
                                 f"got {v!r}")
        if self.corpus not in VARIANTS:
            raise StudyError(f"AgreementStudy.corpus must be one of {', '.join(VARIANTS)}, got {self.corpus!r}")
        if not self.models and self.model is None:
            raise StudyError("AgreementStudy needs models to train or a model directory")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise StudyError(f"AgreementStudy.models names must be unique, got {names}")
        for m in self.models:
            if m.d_model % 4 or m.n_layers < 1:
                raise StudyError(f"model {m.name}: d_model must be a multiple of 4 (4 heads) and n_layers >= 1")


CONFIG = AgreementStudy
HEADLINE = ("models.0.rank", "models.0.baseline_acc", "models.0.keep_acc", "models.0.remove_acc",
            "models.0.flip_reversal", "models.0.generation_flip", "min_spearman")
OUTPUTS = ("summary.json", "report.md", "agreement.png")
_TRAIN_FIELDS = ("corpus_seed", "corpus", "train_sentences", "n_ctx", "batch", "lr", "warmup", "verb_weight")
ANALYSIS = 1      # the version of a kept model row: bump it when analyse() changes what it computes


# ---------------------------------------------------------------------------- the language models

class LM:
    """What the analysis needs of a model: logits of (B, T) tokens, how sentences become tokens, the
    verb forms' token ids, the layer names."""

    def __init__(self, name: str, model, encode, bos: list[int], pad: int, sing: list[int], plur: list[int],
                 n_layers: int):
        self.name, self.model, self.encode, self.bos, self.pad = name, model, encode, bos, pad
        self.sing, self.plur, self.n_layers = torch.tensor(sing), torch.tensor(plur), n_layers
        self.number = {i: 0 for i in sing} | {i: 1 for i in plur}

    def layer(self, i: int) -> str:
        return f"blocks.{i}.hook_resid_post"

    def readout(self, out: torch.Tensor) -> torch.Tensor:
        """(B, V) logits at the verb position -> (B, 2) (log-mass of singular, of plural verbs)."""
        return torch.stack([torch.logsumexp(out[:, self.sing], -1), torch.logsumexp(out[:, self.plur], -1)], -1)

    def inputs(self, sentences, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (n, length), positions (n,)): bos + the words before the verb, padded; the
        position is the prefix's last token (the one predicting the verb)."""
        rows = [self.bos + self.encode(" ".join(s.prefix)) for s in sentences]
        if max(len(r) for r in rows) > length:
            raise StudyError(f"{self.name}: a prefix has {max(len(r) for r in rows)} tokens, more than {length}")
        x = torch.full((len(rows), length), self.pad, dtype=torch.int64)
        for i, r in enumerate(rows):
            x[i, :len(r)] = torch.tensor(r)
        return x, torch.tensor([len(r) - 1 for r in rows])


def _corpus_lm(spec: ModelSpec, model, corpus) -> LM:
    sing, plur = corpus.verb_forms
    return LM(spec.name, model, corpus.encode, [corpus.ids["."]], corpus.ids["."], corpus.encode(list(sing)),
              corpus.encode(list(plur)), spec.n_layers)


def hf_lm(path, corpus, n_ctx: int | None = None) -> LM:
    """A local Hugging Face model directory as an LM (its tokenizer; the first token of " form" for
    each verb form; pairs whose forms share that token are dropped). Refused before any analysis: a
    context shorter than n_ctx (the length the sentences are padded to), non-finite weights."""
    from wtc.models.hf import load

    model = load(path)
    if model.tokenizer is None:
        raise StudyError(f"{path}: the model directory has no tokenizer (the sentences must be tokenized)")
    cfg = model.hf.config
    ctx = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
    if n_ctx is not None and ctx is not None and int(ctx) < n_ctx:
        raise StudyError(f"{path}: the model's context ({int(ctx)} positions) is shorter than the study's "
                         f"n_ctx={n_ctx} (the sentences are padded to it)")
    for name, p in model.hf.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            raise StudyError(f"{path}: the model's weight {name} holds NaN or inf; every result would be NaN")
    tok = model.tokenizer
    if tok.unk_token_id is not None:             # a word-level tokenizer made for another corpus variant
        unknown = [w for w in corpus.vocab if w != "<unk>" and tok.unk_token_id in model.encode(" " + w)]
        if unknown:
            raise StudyError(f"{path}: the tokenizer does not know {len(unknown)} of the {corpus.variant} corpus's "
                             f"words ({', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}); a model made "
                             "for the uniform corpus takes AgreementStudy(corpus='uniform')")
    sing, plur = [], []
    for s, p in zip(*corpus.verb_forms):
        a, b = model.encode(" " + s), model.encode(" " + p)
        if a and b and a[0] != b[0]:
            sing.append(a[0])
            plur.append(b[0])
    if not sing:
        raise StudyError(f"{path}: no singular/plural verb pair has distinct first tokens in this tokenizer")
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id if tok.eos_token_id is not None else 0)
    return LM(Path(path).name, model, model.encode, bos, int(pad), sing, plur, model.n_layers)


def sentence_batch(corpus, n: int, n_ctx: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training sentences (n, n_ctx): "." + sentence, padded with "."; the mask of real targets
    and of number-marked main-verb targets (both (n, n_ctx - 1), aligned with tokens[:, 1:])."""
    rng = np.random.default_rng([corpus.seed, seed, 77])
    x = torch.full((n, n_ctx), corpus.ids["."], dtype=torch.int64)
    real = torch.zeros(n, n_ctx - 1, dtype=torch.bool)
    verb = torch.zeros(n, n_ctx - 1, dtype=torch.bool)
    for i in range(n):
        s = corpus.sentence(rng, split="train")
        ids = [corpus.ids["."]] + corpus.encode(s.words)
        if len(ids) > n_ctx:
            raise StudyError(f"a training sentence has {len(ids)} tokens, more than n_ctx={n_ctx}")
        x[i, :len(ids)] = torch.tensor(ids)
        real[i, :len(ids) - 1] = True
        if s.verb_kind != "past":
            verb[i, s.verb_index] = True             # target index of words[verb_index] (after the ".")
    return x, real, verb


def agreement_loss(model, batch, verb_weight: float) -> torch.Tensor:
    x, real, verb = batch
    logits = model(x)[:, :-1]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none").view(real.shape)
    loss = (ce * real).sum() / real.sum()
    if verb_weight:
        loss = loss + verb_weight * (ce * verb).sum() / verb.sum().clamp(min=1)
    return loss


def train_model(cfg: AgreementStudy, spec: ModelSpec, corpus, data, out: Path | None, progress: bool):
    from wtc.models import Transformer, TransformerConfig
    from wtc.models.training import TrainConfig, train

    model = Transformer(TransformerConfig(n_layers=spec.n_layers, d_model=spec.d_model, n_heads=4,
                                          d_head=spec.d_model // 4, d_mlp=4 * spec.d_model, d_vocab=corpus.d_vocab,
                                          n_ctx=cfg.n_ctx, act_fn=spec.act_fn, normalization=spec.normalization),
                        seed=spec.seed)
    gen = torch.Generator().manual_seed(spec.seed)
    x, real, verb = data

    def batch_fn(step):
        i = torch.randint(0, len(x), (cfg.batch,), generator=gen)
        return x[i], real[i], verb[i]

    tc = TrainConfig(steps=cfg.steps, lr=cfg.lr, warmup=min(cfg.warmup, cfg.steps), schedule="cosine", min_lr_frac=0.1)
    r = train(model, tc, batch_fn, lambda b: agreement_loss(model, b, cfg.verb_weight), rngs={"batch": gen},
              path=None if out is None else out / spec.name / "train_state",
              identity={**{k: getattr(cfg, k) for k in _TRAIN_FIELDS}, **asdict(spec)}, checkpoint_every=200,
              progress=progress, desc=f"agreement {spec.name}", leave=False)
    return model.eval(), r


# ---------------------------------------------------------------------------- the analysis

def _margins(lm: LM, x, pos, core=None, mode=None) -> torch.Tensor:
    with torch.no_grad():
        if core is None:
            out = lm.model(x)
        else:
            with patched(lm.model, core, mode, positions=pos):
                out = lm.model(x)
        y = lm.readout(out[torch.arange(len(x)), pos].double())
    return y[:, 1] - y[:, 0]


def _coordinate(lm: LM, core, x, pos) -> torch.Tensor:
    with torch.no_grad():
        _, cache = lm.model.run_with_cache(x, names_filter=core.layer)
    h = cache[core.layer][torch.arange(len(x)), pos]
    return core.project(h, 1)[:, 0]


def _r2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    den = float(a.norm() * b.norm())
    return float((a @ b) ** 2 / den ** 2) if den > 0 else 0.0


def _generate(lm: LM, x, pos, steps: int, core=None) -> torch.Tensor:
    """Greedy continuations (n, steps) from each prefix (tokens after position pos), with the core
    flipped at the verb-predicting position when a core is given."""
    x = x.clone()
    n, T = x.shape
    if int(pos.max()) + steps >= T:
        x = torch.cat([x, torch.full((n, int(pos.max()) + steps + 1 - T), lm.pad, dtype=x.dtype)], 1)
    rows = torch.arange(n)
    gen = []
    with torch.no_grad():
        for k in range(steps):
            with patched(lm.model, core, "flip", positions=pos) if core is not None else contextlib.nullcontext():
                logits = lm.model(x)
            nxt = logits[rows, pos + k].argmax(-1)
            x[rows, pos + k + 1] = nxt
            gen.append(nxt)
    return torch.stack(gen, 1)


def _first_number(lm: LM, ids) -> int | None:
    for t in ids:
        v = lm.number.get(int(t))
        if v is not None:
            return v
    return None


def _lemma_accuracy(lm: LM, corpus, sentences, x, pos) -> list[bool]:
    """Per sentence: the correct form of its own verb beats the incorrect one."""
    sing, plur = corpus.verb_forms
    with torch.no_grad():
        logits = lm.model(x)[torch.arange(len(x)), pos]
    out = []
    for i, s in enumerate(sentences):
        form = s.words[s.verb_index]
        j = (sing if s.number == 0 else plur).index(form)
        a, b = lm.encode(" " + sing[j]), lm.encode(" " + plur[j])
        right, wrong = (a[0], b[0]) if s.number == 0 else (b[0], a[0])
        out.append(bool(logits[i, right] > logits[i, wrong]))
    return out


def analyse(lm: LM, corpus, fit, evals, cfg: AgreementStudy) -> dict:
    length = cfg.n_ctx
    xf, pf = lm.inputs(fit, length)
    xe, pe = lm.inputs(evals, length)
    from wtc.tasks.agreement import labels as numbers
    ye = numbers(evals)
    last = lm.layer(lm.n_layers - 1)
    core = extract_core(lm.model, xf, last, readout=lm.readout, position=pf, energy=ENERGY)
    v = validate(core, lm.model, xe, ye, readout=lm.readout, positions=pe)
    # the axis: the smallest sufficient rank (the energy rank when none is); patches use it
    r_axis = v["minimal_sufficient_rank"] or core.rank
    energy_rank = core.rank
    core = replace(core, rank=r_axis)
    at = {m: patched_accuracy(lm.model, xe, ye, core, m, readout=lm.readout, positions=pe) for m in PATCH_MODES}
    # necessary: the smallest rank whose removal leaves chance (+0.05); validate's rule (<= 2 x chance) is
    # vacuous for two classes
    necessary = next((r for r in range(0, min(core.basis.shape[1], 8) + 1)
                      if patched_accuracy(lm.model, xe, ye, core, "remove", r, lm.readout, positions=pe) <= 0.55), None)
    sign = 2 * ye.double() - 1
    m = {mode: _margins(lm, xe, pe, None if mode == "clean" else core, None if mode == "clean" else mode)
         for mode in ("clean", "keep", "remove", "flip")}
    z = _coordinate(lm, core, xe, pe)
    z_sign = -1.0 if float(((z - z.mean()) * (m["clean"] - m["clean"].mean())).sum()) < 0 else 1.0
    z = z_sign * z                                 # the sign of a singular vector is arbitrary
    flip_reversal = float(((m["flip"] > 0) != (m["clean"] > 0)).double().mean())
    clean_gen = _generate(lm, xe, pe, cfg.gen_tokens)
    flip_gen = _generate(lm, xe, pe, cfg.gen_tokens, core)
    nums = [(_first_number(lm, a), _first_number(lm, b)) for a, b in zip(clean_gen.tolist(), flip_gen.tolist())]
    reversed_ = [a is not None and b is not None and a != b for a, b in nums]
    profile = []
    for i in range(lm.n_layers):
        if i == lm.n_layers - 1:
            c, r_energy, mf = core, energy_rank, m["flip"]
        else:
            c = extract_core(lm.model, xf, lm.layer(i), readout=lm.readout, position=pf, energy=ENERGY)
            r_energy, c = c.rank, replace(c, rank=r_axis)
            mf = _margins(lm, xe, pe, c, "flip")
        zi = _coordinate(lm, c, xe, pe)
        profile.append({"layer": c.layer, "rank": r_energy, "r2": _r2(zi, m["clean"]),
                        "flip_reversal": float(((mf > 0) != (m["clean"] > 0)).double().mean())})
    lemma = _lemma_accuracy(lm, corpus, evals, xe, pe)
    by_distance, by_modifier = {}, {}
    for s, ok in zip(evals, lemma):
        by_distance.setdefault(s.distance, []).append(ok)
        by_modifier.setdefault(s.modifier, []).append(ok)
    e2 = np.asarray(core.s.double() ** 2)
    return {"name": lm.name, "layer": last, "rank": energy_rank, "axis_rank": r_axis, "baseline_acc": v["baseline_acc"],
            "keep_acc": at["keep"], "remove_acc": at["remove"], "flip_acc": at["flip"],
            "at_energy_rank": {"keep_acc": v["keep_acc"], "remove_acc": v["remove_acc"], "flip_acc": v["flip_acc"]},
            "minimal_sufficient_rank": v["minimal_sufficient_rank"], "minimal_necessary_rank": necessary,
            "flip_reversal": flip_reversal, "generation_flip": float(np.mean(reversed_)),
            "generation_with_verb": float(np.mean([a is not None and b is not None for a, b in nums])),
            "r2": _r2(z, m["clean"]),
            "signed_margin": {k: float((sign * val).mean()) for k, val in m.items()},
            "energy_top1": float(e2[0] / e2.sum()) if e2.sum() > 0 else None,
            "singular_values": [float(x) for x in core.s[:6]],
            "lemma_acc": float(np.mean(lemma)),
            "lemma_acc_by_distance": {str(d): float(np.mean(v)) for d, v in sorted(by_distance.items())},
            "lemma_acc_by_modifier": {k: float(np.mean(v)) for k, v in sorted(by_modifier.items())},
            "layer_profile": profile, "_coordinate": z, "_margin": m["clean"], "_core": core,
            "_sign": z_sign}


# ---------------------------------------------------------------------------- the study

def run(cfg: AgreementStudy | None, out_dir, progress: bool = True) -> dict:
    """Train (resumably) or load the models, analyse each, compare them; writes summary.json,
    report.md and agreement.png; returns the summary."""
    cfg = cfg or AgreementStudy()
    if not isinstance(cfg, AgreementStudy):
        raise StudyError(f"cfg must be an AgreementStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(out)
    from wtc.tasks.agreement import AgreementCorpus

    corpus = AgreementCorpus(cfg.corpus_seed, variant=cfg.corpus)
    user = hf_lm(cfg.model, corpus, cfg.n_ctx) if cfg.model is not None else None     # a bad directory fails before anything is written
    check_config(out, {k: v for k, v in asdict(cfg).items() if k in _TRAIN_FIELDS + ("models", "model")},
                 free=("models",), label="agreement", paths=("model",))
    with torch_threads(cfg.threads):
        summary = _study(cfg, corpus, user, out, progress, clock)
    clock.save()
    summary["seconds"] = round(clock.total(), 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(out, summary)
    (out / "report.md").write_text(markdown(summary))
    return summary


def _study(cfg: AgreementStudy, corpus, user: LM | None, out: Path, progress: bool, clock: Clock) -> dict:
    fit = corpus.eval_set("attractor", cfg.fit_n // 2, seed=11) + corpus.eval_set("no_attractor", cfg.fit_n - cfg.fit_n // 2,
                                                                                 seed=12)
    evals = corpus.eval_set("attractor", cfg.eval_n, seed=13)
    no_attr = corpus.eval_set("no_attractor", cfg.eval_n, seed=14)
    # number-ambiguous subjects join the attractor sentences in the Spearman set, in the corpus's share
    q = corpus.ambiguous_share
    n_amb = round(cfg.eval_n * q / (1 - q))
    amb = corpus.eval_set("ambiguous", n_amb, seed=15) if n_amb else []
    sets = (fit, evals, no_attr, amb)
    say = (lambda message: print(f"agreement: {message}", file=sys.stderr, flush=True)) if progress else None
    settings = {**{k: v for k, v in asdict(cfg).items() if k not in ("models", "model", "threads")},
                "analysis": ANALYSIS}
    if user is not None:
        units = [(user.name, {"model": resolved(cfg.model)}, lambda: _row(user, corpus, sets, cfg, None))]
    else:
        data = []                      # the training sentences: made once, and only if a model trains

        def trained(spec: ModelSpec) -> dict:
            if not data:
                data.append(sentence_batch(corpus, cfg.train_sentences, cfg.n_ctx, seed=0))
            model, r = train_model(cfg, spec, corpus, data[0], out, progress)
            training = {"steps": r.step, "seconds": round(r.seconds, 1),
                        "final_loss": float(np.mean(r.history["loss"][-20:])), "seconds_per_step": r.seconds_per_step}
            return _row(_corpus_lm(spec, model, corpus), corpus, sets, cfg, training)
        units = [(spec.name, {"spec": asdict(spec)}, lambda spec=spec: trained(spec)) for spec in cfg.models]
    results = [kept(out / name / "analysis.json", compute, clock, key={**settings, **unit}, log=say)
               for name, unit, compute in units]
    coords = [np.asarray(r.pop("_coordinate")) for r in results]
    margins = [np.asarray(r.pop("_margin")) for r in results]
    na = [[np.asarray(v) for v in r.pop("_no_attractor")] for r in results]
    am = [[np.asarray(v) for v in r.pop("_ambiguous", ())] for r in results]
    summary = {"config": asdict(cfg), "models": results,
               **compare(coords, margins, [s.number for s in evals], [z for z, _ in na], [m for _, m in na],
                         [s.number for s in no_attr], [z for z, _ in am] if amb else None,
                         [m for _, m in am] if amb else None, [s.p_plural for s in amb]),
               "fit_n": len(fit), "eval_n": len(evals), "ambiguous_n": len(amb), "corpus": corpus.variant}
    return summary


def _row(lm: LM, corpus, sets, cfg: AgreementStudy, training: dict | None) -> dict:
    """One model's unit of work (kept): analyse() on it, its no-attractor and ambiguous-subject
    coordinates and margins (the coordinates in the orientation fixed on the attractor set), as
    JSON data."""
    fit, evals, no_attr, amb = sets
    res = analyse(lm, corpus, fit, evals, cfg)
    core, sign = res.pop("_core"), res.pop("_sign")
    xn, pn = lm.inputs(no_attr, cfg.n_ctx)
    res["no_attractor_lemma_acc"] = float(np.mean(_lemma_accuracy(lm, corpus, no_attr, xn, pn)))
    res["_no_attractor"] = [(sign * _coordinate(lm, core, xn, pn)).tolist(), _margins(lm, xn, pn).tolist()]
    if amb:
        xa, pa = lm.inputs(amb, cfg.n_ctx)
        res["_ambiguous"] = [(sign * _coordinate(lm, core, xa, pa)).tolist(), _margins(lm, xa, pa).tolist()]
    res["_coordinate"], res["_margin"] = res["_coordinate"].tolist(), res["_margin"].tolist()
    res["training"] = training
    return res
