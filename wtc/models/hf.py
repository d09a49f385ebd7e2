"""Hugging Face causal LMs with TransformerLens-style hook names (wtc.hooks).

`load(source)` wraps a `transformers` causal LM (GPT-2, GPT-NeoX/Pythia, LLaMA-family: LLaMA,
Mistral, Qwen2/3, Gemma, Gemma-2), read from a local directory (never downloaded) or given as an
object, in an `HFModel`: tokens (B, T) -> logits (B, T, V), a `wtc.hooks.Hooked` root whose hook
points are

    blocks.{i}.hook_resid_pre    the residual stream entering layer i (= hidden_states[i])
    blocks.{i}.hook_attn_out     what the attention adds to the residual (after its dropout and,
                                 in Gemma-2, its post-attention norm)
    blocks.{i}.hook_resid_mid    resid_pre + attn_out (sequential blocks only; parallel-residual
                                 GPT-NeoX/Pythia blocks have none, as in TransformerLens)
    blocks.{i}.hook_mlp_out      what the MLP adds
    blocks.{i}.hook_resid_post   the layer's output (= hidden_states[i + 1] for all but the last
                                 layer: Hugging Face's last hidden state is after the final norm)

So `run_with_cache`, `run_with_hooks`, `wtc.ace.extract_core(model, tokens,
"blocks.11.hook_resid_post", ...)` and its patches work on a Hugging Face model as on a wtc
Transformer. The points are the wrapper's own HookPoints; while one of a block's points has a hook,
the forward routes that block's values through them with torch hooks on the Hugging Face modules
(removed after the call), so an unhooked wrapper runs the Hugging Face model untouched. A value a
hook replaces flows on: a replaced resid_mid reaches the MLP and the residual sum (attn_out is
adjusted to resid_mid' - resid_pre).

The Hugging Face modules themselves can be hooked too (wtc.hooks.hook_modules takes element 0 of
the tuples layers return): extract_core(hf_model, tokens, "transformer.h.1", readout) works, and
ACE reads a model output's `.logits` (module wtc.ace.core).

`transformers` is an optional dependency (pip install 'wtc[hf]'); importing this module does not
import it, `load` and `word_tokenizer` do.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from wtc.errors import WtcError
from wtc.hooks import Hooked, HookPoint


class HFModelError(WtcError, ValueError):
    """A Hugging Face model or directory wtc cannot use (missing, not a causal LM, an unknown layout)."""


@dataclass(frozen=True)
class Layout:
    """Where a family keeps its blocks: `layers` (path from the causal-LM root to the ModuleList),
    `attn` / `mlp` (paths inside a layer to the module whose output is what joins the residual),
    `final_norm` (path from the root) and whether attention and MLP read the same input (parallel)."""
    layers: str
    attn: str
    mlp: str
    final_norm: str
    parallel: bool = False


_LLAMA = Layout("model.layers", "self_attn", "mlp", "model.norm")
LAYOUTS = {
    "gpt2": Layout("transformer.h", "attn", "mlp", "transformer.ln_f"),
    "gpt_neox": Layout("gpt_neox.layers", "post_attention_dropout", "post_mlp_dropout", "gpt_neox.final_layer_norm"),
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA, "gemma": _LLAMA,
    "gemma2": Layout("model.layers", "post_attention_layernorm", "post_feedforward_layernorm", "model.norm"),
}


def layout_of(model: nn.Module) -> Layout:
    """The Layout of a Hugging Face causal LM (by config.model_type)."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in LAYOUTS:
        raise HFModelError(f"no TransformerLens-style layout for Hugging Face model_type {kind!r} "
                           f"(known: {', '.join(LAYOUTS)}); hook its modules by path with wtc.hooks.hook_modules")
    lay = LAYOUTS[kind]
    if kind == "gpt_neox":
        lay = Layout(lay.layers, lay.attn, lay.mlp, lay.final_norm, parallel=bool(cfg.use_parallel_residual))
    try:
        model.get_submodule(lay.layers)
    except AttributeError:
        raise HFModelError(f"a {kind} model without {lay.layers!r}: pass the causal LM (e.g. "
                           f"{type(model).__name__.replace('Model', 'ForCausalLM')}), not its base model") from None
    return lay


class BlockHooks(nn.Module):
    """The hook points of one Hugging Face layer."""

    def __init__(self, parallel: bool):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        if not parallel:
            self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    @property
    def listened(self) -> bool:
        return any(p.has_hooks for p in self.children())


def _first(value):
    """(tensor, repack) of a module's output: a tensor, or a tuple by its element 0."""
    if isinstance(value, torch.Tensor):
        return value, lambda new: new
    if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
        return value[0], lambda new: (new, *value[1:])
    raise HFModelError(f"a Hugging Face module returned {type(value).__name__}, not a tensor or a tuple starting with one")


class HFModel(Hooked):
    """A Hugging Face causal LM: tokens (B, T) -> logits (B, T, V), with TL-style hook points
    (module doc). `hf` is the wrapped model, `tokenizer` its tokenizer (or None), `layout` where
    its blocks are. Extra keyword arguments of forward (attention_mask, ...) go to the model."""

    def __init__(self, model: nn.Module, tokenizer=None):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise HFModelError(f"model must be a transformers causal LM (an nn.Module), got {type(model).__name__}")
        if tokenizer is not None and not callable(tokenizer):
            raise HFModelError(f"tokenizer must be None or a transformers tokenizer, got {type(tokenizer).__name__}")
        self.layout = layout_of(model)
        self.hf = model.eval()
        self.tokenizer = tokenizer
        self.layers = list(model.get_submodule(self.layout.layers))
        self.blocks = nn.ModuleList(BlockHooks(self.layout.parallel) for _ in self.layers)
        self.cfg = model.config                      # vocab_size / n_positions for wtc.scan's checks
        self.setup_hooks()

    @property
    def config(self):
        return self.hf.config

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        return int(self.hf.config.hidden_size)

    @property
    def final_norm(self) -> nn.Module:
        return self.hf.get_submodule(self.layout.final_norm)

    def forward(self, tokens, **kwargs) -> torch.Tensor:
        tokens = torch.as_tensor(tokens)
        if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise HFModelError(f"tokens must be integer ids (B, T), got {tuple(tokens.shape)} {tokens.dtype}")
        vocab = int(self.hf.config.vocab_size)
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise HFModelError(f"token ids must lie in [0, {vocab}), got [{int(tokens.min())}, {int(tokens.max())}]")
        if tokens.shape[1] == 0:
            raise HFModelError("tokens are empty: a forward needs at least one position")
        ctx = getattr(self.hf.config, "n_positions", None) or getattr(self.hf.config, "max_position_embeddings", None)
        if ctx is not None and tokens.shape[1] > int(ctx):
            raise HFModelError(f"tokens have {tokens.shape[1]} positions, more than the model's context of {ctx}")
        if kwargs:
            self._check_kwargs(kwargs)
        kwargs.setdefault("use_cache", False)
        with self._routing():
            return self.hf(input_ids=tokens.long(), **kwargs).logits

    _NOT_KWARGS = ("input_ids", "inputs_embeds", "return_dict")   # the tokens are the first argument; logits come back

    def _check_kwargs(self, kwargs: dict) -> None:
        """Refuse keyword arguments the Hugging Face forward does not name (its **kwargs would take
        and ignore a misspelt attention_mask) or that would change what this forward returns."""
        import inspect

        try:
            params = inspect.signature(self.hf.forward).parameters
        except (TypeError, ValueError):
            return
        named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        taken = sorted(k for k in kwargs if k in self._NOT_KWARGS)
        if taken:
            raise HFModelError(f"{', '.join(taken)} cannot be passed to HFModel's forward (tokens are its first "
                               "argument and it returns the logits)")
        unknown = sorted(k for k in kwargs if k not in named)
        if unknown:
            raise HFModelError(f"unknown keyword argument(s) {', '.join(map(repr, unknown))} for "
                               f"{type(self.hf).__name__}.forward (it takes: "
                               f"{', '.join(n for n in named if n not in self._NOT_KWARGS)})")

    @contextlib.contextmanager
    def _routing(self):
        handles = []
        try:
            for block, layer in zip(self.blocks, self.layers):
                if block.listened:
                    handles += self._route(block, layer)
            yield
        finally:
            for h in handles:
                h.remove()

    def _route(self, points: BlockHooks, layer: nn.Module) -> list:
        """Torch hooks on one Hugging Face layer passing its values through its hook points."""
        state = {}
        mid = getattr(points, "hook_resid_mid", None)

        def pre(module, args, kwargs):
            if args:
                h = args[0]
                new = points.hook_resid_pre(h)
                state["pre"] = new
                return None if new is h else ((new, *args[1:]), kwargs)
            if "hidden_states" not in kwargs:
                raise HFModelError(f"{type(module).__name__} was called without hidden_states")
            h = kwargs["hidden_states"]
            new = points.hook_resid_pre(h)
            state["pre"] = new
            return None if new is h else (args, {**kwargs, "hidden_states": new})

        def attn(module, args, out):
            a, repack = _first(out)
            new = points.hook_attn_out(a)
            if mid is not None:
                m = new + state["pre"]                     # as the layer sums them (a + b == b + a exactly)
                m2 = mid(m)
                if m2 is not m:
                    new = m2 - state["pre"]
            return None if new is a else repack(new)

        def mlp(module, args, out):
            m, repack = _first(out)
            new = points.hook_mlp_out(m)
            return None if new is m else repack(new)

        def post(module, args, out):
            r, repack = _first(out)
            new = points.hook_resid_post(r)
            return None if new is r else repack(new)

        return [layer.register_forward_pre_hook(pre, with_kwargs=True),
                layer.get_submodule(self.layout.attn).register_forward_hook(attn),
                layer.get_submodule(self.layout.mlp).register_forward_hook(mlp),
                layer.register_forward_hook(post)]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` by the model's tokenizer (no special tokens added)."""
        if self.tokenizer is None:
            raise HFModelError("this model has no tokenizer (load it from a directory that has one, or pass tokenizer=)")
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _transformers():
    try:
        import transformers
    except ImportError:
        raise HFModelError("transformers is not installed (optional: pip install 'wtc[hf]')") from None
    return transformers


@contextlib.contextmanager
def _quiet(tf):
    """transformers' logging, progress bars and Python warnings held back while loading: what matters (weights
    missing from the checkpoint, a failure) becomes an HFModelError, so a user sees one line."""
    import warnings

    verbosity = tf.logging.get_verbosity()
    bars = tf.logging.is_progress_bar_enabled()   # transformers 5 draws one per load ("Loading weights")
    tf.logging.set_verbosity_error()
    tf.logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf.logging.set_verbosity(verbosity)
        if bars:
            tf.logging.enable_progress_bar()


def load(source, tokenizer=None, dtype: torch.dtype | None = None) -> HFModel:
    """An HFModel from a local directory (config.json + weights, as save_pretrained writes; the
    tokenizer too when its files are there) or from a transformers model object. Nothing is
    downloaded: a directory is read with local_files_only. dtype: convert to it (None: as saved /
    as given). A directory whose weights lack some of the model's parameters (transformers would
    initialise them at random) or hold them in other shapes is refused."""
    if isinstance(source, HFModel):
        if tokenizer is not None or dtype is not None:
            raise HFModelError("load(an HFModel) takes no tokenizer= or dtype=: it returns the model as it is")
        return source
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        dtype = getattr(torch, dtype)                # "float16", as transformers takes it
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise HFModelError(f"dtype must be None or a floating-point torch.dtype (e.g. torch.float32), got {dtype!r}")
    if tokenizer is not None and not callable(tokenizer):
        raise HFModelError(f"tokenizer must be None or a transformers tokenizer, got {type(tokenizer).__name__}")
    if isinstance(source, nn.Module):
        model = source if dtype is None else source.to(dtype)
        return HFModel(model, tokenizer)
    if not isinstance(source, (str, Path)):
        raise HFModelError(f"source must be a model directory or a transformers model, got {type(source).__name__}")
    path = Path(source)
    if not path.is_dir():
        raise HFModelError(f"{path} is not a directory (a Hugging Face model directory holds config.json and weights)")
    if not (path / "config.json").is_file():
        raise HFModelError(f"{path} has no config.json: not a Hugging Face model directory")
    tf = _transformers()
    with _quiet(tf):
        try:
            model, info = tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, output_loading_info=True,
                                                                  **({} if dtype is None else {"dtype": dtype}))
        except Exception as exc:     # transformers / safetensors raise their own types for a bad directory
            raise HFModelError(f"{path}: cannot load a causal LM ({type(exc).__name__}: "
                               f"{(str(exc).splitlines() or [''])[0]})") from None
        for what, keys in (("lacks", info.get("missing_keys")), ("holds in other shapes", info.get("mismatched_keys"))):
            if keys:
                names = [k if isinstance(k, str) else k[0] for k in keys]
                raise HFModelError(f"{path}: the weights file {what} {len(names)} of the model's parameters "
                                   f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); transformers would "
                                   "initialise them at random")
        if tokenizer is None and any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
            try:
                tokenizer = tf.AutoTokenizer.from_pretrained(path, local_files_only=True)
            except Exception as exc:  # e.g. ImportError for a tokenizer that needs protobuf
                raise HFModelError(f"{path}: cannot load its tokenizer ({type(exc).__name__}: "
                                   f"{(str(exc).splitlines() or [''])[0]})") from None
    return HFModel(model, tokenizer)


def word_tokenizer(words, unk: str = "<unk>", bos: str | None = None):
    """A transformers fast tokenizer splitting on whitespace, one id per word (ids in the order of
    `words`; `unk` is added when missing; `bos`, one of the words, its beginning-of-sequence token):
    save it with save_pretrained next to a model."""
    _transformers()
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if isinstance(words, (str, bytes)):
        raise HFModelError("word_tokenizer: words must be a list of words, not one string")
    words = list(words)
    if not all(isinstance(w, str) for w in words):
        raise HFModelError("word_tokenizer: every word must be a str")
    if len(set(words)) != len(words):
        raise HFModelError("word_tokenizer: the words are not unique")
    if unk not in words:
        words.append(unk)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos is not None and bos not in words:
        raise HFModelError(f"word_tokenizer: bos {bos!r} is not one of the words")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, **({} if bos is None else {"bos_token": bos}))


__all__ = ["HFModel", "HFModelError", "Layout", "LAYOUTS", "layout_of", "load", "word_tokenizer"]
