"""Exact per-position KL of zeroing weight matrices of a wtc Transformer, from cached clean activations.

Zeroing one weight changes the residual stream at one point of one block, and the change has
structure the scan can use instead of re-running the block (every formula below is exact):

    mlp.W_out[m, d]     residual after the block += delta (x) e_d,      delta = -W * post_m
    mlp.W_in[d, m]      residual after the block += delta (x) W_out[m], delta = act(pre_m - W * x_d) - post_m
    attn.W_O[h, e, d]   residual after attention += delta (x) e_d,      delta = -W * z_he
    attn.W_V[h, d, e]   residual after attention += delta (x) W_O[h, e], delta = pattern_h @ (-W * x_d)
    attn.W_Q / W_K      one head's scores move by a rank-1 term: that head alone is recomputed
    embed / pos_embed   only sequences holding the token / positions from the row on are run
                        (clean keys and values of earlier positions come from the cache)

A rank-1 change delta (x) w (delta per position, w a direction) reaches the next linear map through
a norm in closed form (`NormedLinear`): per position, the perturbed projection is a mix of the
clean projection and one vector, O(N (D + K)) instead of O(N D K). From the first dense change on,
the remaining blocks run as one batch of A copies. A rank-1 change after the last block with no
final norm reaches the KL without forming logits (wtc.scan.kl.kl_rank1).

AbsTopK MLPs: the selection is recomputed on the perturbed pre-activations (exact, no rank-1 MLP
entry). Anything not listed (biases, norm weights) goes through the generic batched path in scan.
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

from wtc.scan.kl import kl_rank1, kl_rows
from wtc.models.transformer import LayerNorm, RMSNorm, abstopk

_NAME = re.compile(r"^blocks\.(\d+)\.(attn\.W_[QKVO]|mlp\.W_in|mlp\.W_out)$")
EPS = 1e-5                   # the model's norm epsilon (TransformerLens's)


class NormedLinear:
    """norm(x) @ W for a clean x (N, D), and exactly the same for x + delta (x) w, cheaply.

    LN: with xc = x - mean(x), sigma^2 = var(x) + eps, the perturbed stream has centred value
    xc + delta wc and variance var(x) + 2 delta cov(x, w) + delta^2 var(w), so
    norm(x')@W = (sigma / sigma') P0 + (delta / sigma') (wc * gamma)@W + beta@W with P0 = (xc / sigma * gamma)@W.
    RMS: the same without centring or beta. No norm: P0 + delta (w@W)."""

    def __init__(self, norm: torch.nn.Module, x: torch.Tensor, W: torch.Tensor):
        self.kind = "LN" if isinstance(norm, LayerNorm) else "RMS" if isinstance(norm, RMSNorm) else None
        self.W, self.x = W, x                                      # (D, K), (N, D)
        if self.kind is None:
            self.P0, self.offset = x @ W, 0.0
            return
        self.gamma = norm.w.detach()
        if self.kind == "LN":
            self.xc = x - x.mean(-1, keepdim=True)
            self.var = self.xc.pow(2).mean(-1)                     # biased, as F.layer_norm
            self.offset = norm.b.detach() @ W                      # (K,)
        else:
            self.xc, self.var, self.offset = x, x.pow(2).mean(-1), 0.0
        self.scale = (self.var + EPS).sqrt()                       # (N,)
        self.P0 = (self.xc / self.scale[:, None] * self.gamma) @ W  # (N, K)

    def clean(self) -> torch.Tensor:
        return self.P0 + self.offset

    def perturbed(self, delta: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """(A, N, K) projection of x + delta[a, n] w[a]; delta (A, N), w (A, D); written into out if given."""
        if self.kind is None:
            return torch.addcmul(self.P0, delta[..., None], (w @ self.W)[:, None, :], out=out)
        D = w.shape[-1]
        wc = w - w.mean(-1, keepdim=True) if self.kind == "LN" else w
        cov = (wc @ self.xc.T) / D                                  # (A, N)
        var_w = wc.pow(2).mean(-1, keepdim=True)                    # (A, 1)
        scale = (self.var + 2 * delta * cov + delta.pow(2) * var_w + EPS).sqrt()   # (A, N)
        u = (wc * self.gamma) @ self.W                              # (A, K)
        out = torch.mul(self.P0, (self.scale / scale)[..., None], out=out)
        out.addcmul_((delta / scale)[..., None], u[:, None, :])
        return out.add_(self.offset) if self.kind == "LN" else out


class _Rank1:
    """delta (A, B, T) times a direction w (A, D) added to the residual stream."""

    def __init__(self, delta: torch.Tensor, w: torch.Tensor):
        self.delta, self.w = delta, w

    def dense(self) -> torch.Tensor:                                # (A, B, T, D)
        return self.delta[..., None] * self.w[:, None, None, :]


class _Workspace:
    """Buffers reused from batch to batch for the large per-batch tensors (A x N x d_mlp, vocab, or
    H x T): a fresh ~17 MB tensor per step is a fresh mapping whose pages fault and get zeroed, which
    took about half of a batch's time on the bench machine (bench/RESULTS.md)."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, shape, like: torch.Tensor) -> torch.Tensor:
        n = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buf = self.buffers[name] = torch.empty(n, dtype=like.dtype, device=like.device)
        return buf[:n].view(shape)


class Suffix:
    """Clean activations of every block, and per-weight KL rows (A, N) for the matrices above."""

    def __init__(self, model, tokens: torch.Tensor):
        self.model, self.tokens = model, tokens
        cfg = model.cfg
        self.cfg, self.L = cfg, cfg.n_layers
        B, T = tokens.shape
        self.B, self.T, self.N = B, T, B * T
        self.pre, self.blocks = [], []
        self.ws = _Workspace()
        self._attention_of = (None, None, None)
        with torch.no_grad():
            resid = model.embed_tokens(tokens)
            # additive causal mask (0 / -inf), the input of the scores GEMM in _from_pre
            self.mask = torch.zeros(T, T, dtype=resid.dtype, device=resid.device).masked_fill_(
                ~torch.ones(T, T, dtype=torch.bool, device=resid.device).tril(), float("-inf"))
            for layer, block in enumerate(model.blocks):
                self.pre.append(resid)
                c = self._block_cache(block, resid, rank1_entry=layer > 0)
                self.blocks.append(c)
                resid = c["post_resid"]
            self.final = resid
            self.hidden = model.final_hidden(resid)                 # what the unembedding reads
            self.logits = model.unembed(self.hidden)                # (B, T, V)
            self.V = self.logits.shape[-1]
            self.logits_flat = self.logits.reshape(-1, self.V)
            # float64 whatever the model's precision: see wtc.scan.kl.kl_rows
            self.logp = torch.log_softmax(self.logits.double(), -1).reshape(-1, self.V)
            # a rank-1 change through the final norm (without one, kl_rank1 takes it as it is)
            self.unembed_lin = (NormedLinear(model.ln_final, resid.reshape(-1, cfg.d_model), model.unembed.W_U.detach())
                                if cfg.normalization is not None else None)

    def _pattern(self, scores: torch.Tensor) -> torch.Tensor:
        return (scores + self.mask).softmax(-1)

    def _block_cache(self, block, resid, rank1_entry: bool):
        attn, D = block.attn, self.cfg.d_model
        x = block.ln1(resid)                                        # (B, T, D)
        q = torch.einsum("btd,hde->bthe", x, attn.W_Q) + attn.b_Q   # (B, T, H, dh)
        k = torch.einsum("btd,hde->bthe", x, attn.W_K) + attn.b_K
        v = torch.einsum("btd,hde->bthe", x, attn.W_V) + attn.b_V
        pattern = self._pattern(_scores(q, k))                                         # (B, H, T, T)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        mid = resid + torch.einsum("bqhe,hed->bqd", z, attn.W_O) + attn.b_O
        # the (B, H, T, T) scores and pattern are not kept: W_Q / W_K / W_V recompute them per block
        c = {"x1": x, "q": q, "k": k, "v": v, "z": z, "mid": mid}
        # the three projections side by side, for a change arriving from the block before (rank-1:
        # in closed form; the first block has no block before)
        W_qkv = torch.stack([attn.W_Q, attn.W_K, attn.W_V], 1).detach().transpose(0, 2).reshape(D, -1)   # (D, 3 H dh)
        c["W_qkv"] = W_qkv
        if rank1_entry:
            c["qkv_in"] = NormedLinear(block.ln1, resid.reshape(-1, D), W_qkv)
        c["attn_out"] = mid - resid
        c["b_qkv"] = torch.stack([attn.b_Q, attn.b_K, attn.b_V]).detach().flatten()        # (3 H dh,)
        if block.has_mlp:
            mlp = block.mlp
            lin = NormedLinear(block.ln2, mid.reshape(-1, D), mlp.W_in.detach())
            pre = lin.clean() + mlp.b_in                            # (N, M)
            post = _mlp_post(mlp, pre)
            c.update(x2=block.ln2(mid).reshape(-1, D), mlp_in=lin, pre=pre, post=post,
                     post_resid=mid + (post @ mlp.W_out + mlp.b_out).reshape(mid.shape))
        else:
            c["post_resid"] = mid
        return c

    def _attention(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean attention scores and pattern (B, H, T, T) of one block; the last block asked for is
        kept (a scan goes parameter by parameter: one block's worth of memory, not n_layers')."""
        if self._attention_of[0] != layer:
            c = self.blocks[layer]
            scores = _scores(c["q"], c["k"])
            self._attention_of = (layer, scores, self._pattern(scores))
        return self._attention_of[1:]

    # ------------------------------------------------------------------ which weights
    @staticmethod
    def handles(name: str) -> bool:
        return name in ("embed.W_E", "pos_embed.W_pos") or _NAME.match(name) is not None

    def batch_key(self, name: str, param: torch.Tensor, flat: torch.Tensor) -> torch.Tensor | None:
        """Weights that must share a batch (embedding rows: one row per batch), else None."""
        if name in ("embed.W_E", "pos_embed.W_pos"):
            return flat // param.shape[1]
        return None

    def cheap(self, name: str) -> bool:
        """Whether the KL of this parameter needs no (A, N, V) logits: large batches pay."""
        m = _NAME.match(name)
        return (m is not None and int(m.group(1)) == self.L - 1 and m.group(2).startswith("mlp")
                and self.cfg.normalization is None and not self.cfg.mlp_abstopk)

    # ------------------------------------------------------------------ entries
    @torch.no_grad()
    def kl(self, name: str, param: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """(A, N) float64 per-position KL(clean || weight flat[a] of `name` zeroed)."""
        W = param.detach()
        flat = flat.to(W.device)
        value = W.flatten()[flat]                                   # (A,)
        if name == "embed.W_E":
            return self._embedding(flat // W.shape[1], flat % W.shape[1], value, by_token=True)
        if name == "pos_embed.W_pos":
            return self._embedding(flat // W.shape[1], flat % W.shape[1], value, by_token=False)
        m = _NAME.match(name)
        layer, kind = int(m.group(1)), m.group(2)
        c, block = self.blocks[layer], self.model.blocks[layer]
        if kind.startswith("mlp"):
            return self._mlp_entry(layer, kind, c, block.mlp, W, flat, value)
        H, D, dh = W.shape if kind != "attn.W_O" else (W.shape[0], W.shape[2], W.shape[1])
        if kind == "attn.W_O":                                      # (H, dh, D): flat = (h dh + e) D + d
            he, d = flat // D, flat % D
            h, e = he // dh, he % dh
            delta = -value[:, None, None] * c["z"][:, :, h, e].permute(2, 0, 1)            # (A, B, T)
            return self._from_mid(layer, _Rank1(delta, _onehot(d, D, W)))
        h, rest = flat // (D * dh), flat % (D * dh)                 # (H, D, dh): flat = (h D + d) dh + e
        d, e = rest // dh, rest % dh
        dx = -value[:, None, None] * c["x1"][:, :, d].permute(2, 0, 1)                     # (A, B, T)
        if kind == "attn.W_V":
            pat = self._attention(layer)[1][:, h].transpose(0, 1)                         # (A, B, T, T)
            delta = (pat @ dx[..., None])[..., 0]
            return self._from_mid(layer, _Rank1(delta, block.attn.W_O.detach()[h, e]))
        scores = self._attention(layer)[0][:, h].transpose(0, 1)                          # (A, B, T, T)
        if kind == "attn.W_Q":                                      # query row n moves by dq_n k_m
            other = c["k"][:, :, h, e].permute(2, 0, 1)                                   # (A, B, T)
            scores = scores + dx[..., :, None] * other[..., None, :] / math.sqrt(dh)
        else:                                                       # key column m moves by q_n dk_m
            other = c["q"][:, :, h, e].permute(2, 0, 1)
            scores = scores + other[..., :, None] * dx[..., None, :] / math.sqrt(dh)
        v = c["v"][:, :, h].permute(2, 0, 1, 3)                                           # (A, B, T, dh)
        dz = self._pattern(scores) @ v - c["z"][:, :, h].permute(2, 0, 1, 3)
        dresid = torch.einsum("abte,aed->abtd", dz, block.attn.W_O.detach()[h])
        return self._from_mid(layer, dresid)

    def _mlp_entry(self, layer, kind, c, mlp, W, flat, value):
        M = mlp.W_in.shape[1]
        if kind == "mlp.W_out":                                     # (M, D): flat = m D + d
            D = W.shape[1]
            m, d = flat // D, flat % D
            delta = -value[:, None] * c["post"][:, m].T                                     # (A, N)
            return self._from_post(layer, _Rank1(delta.reshape(-1, self.B, self.T), _onehot(d, D, W)))
        d, m = flat // M, flat % M                                  # W_in (D, M): flat = d M + m
        pre_m = c["pre"][:, m].T - value[:, None] * c["x2"][:, d].T                       # (A, N)
        if not mlp.abstopk:
            delta = mlp.act(pre_m) - c["post"][:, m].T
            return self._from_post(layer, _Rank1(delta.reshape(-1, self.B, self.T), mlp.W_out.detach()[m]))
        pre = c["pre"].expand(len(flat), -1, -1).clone()                                   # (A, N, M)
        pre[torch.arange(len(flat)), :, m] = pre_m
        dresid = (_mlp_post(mlp, pre) - c["post"]) @ mlp.W_out
        return self._from_post(layer, dresid.reshape(-1, self.B, self.T, dresid.shape[-1]))

    def _embedding(self, row, d, value, by_token: bool):
        """Zeroing W_E[v, d] / W_pos[t, d]: only sequences holding token v / positions from t on change."""
        r = int(row[0])
        assert bool((row == r).all()), "embedding batches are per row"
        A = len(row)
        if by_token:
            holds = self.tokens == r                                                       # (B, T)
            seqs = holds.any(-1).nonzero().flatten()
            if len(seqs) == 0:                                      # a token that never occurs: KL exactly 0
                return torch.zeros(A, self.N, dtype=torch.float64, device=self.logp.device)
            where = holds[seqs].to(self.pre[0].dtype)                                      # (B', T)
            start = int(holds[seqs].float().argmax(-1).min())       # earlier positions keep their clean values
        else:
            if r >= self.T:                                         # a position the tokens do not reach
                return torch.zeros(A, self.N, dtype=torch.float64, device=self.logp.device)
            seqs = torch.arange(self.B, device=self.tokens.device)
            where = torch.zeros(self.B, self.T, dtype=self.pre[0].dtype, device=self.tokens.device)
            where[:, r] = 1
            start = r
        delta = -value[:, None, None] * where[None, :, start:]                              # (A, B', T')
        tail = self.pre[0][seqs, start:][None] + _Rank1(delta, _onehot(d, self.cfg.d_model, value)).dense()
        Bs, Tt = len(seqs), self.T - start
        tail = tail.reshape(A * Bs, Tt, -1)
        for layer, block in enumerate(self.model.blocks):
            head = self.pre[layer][seqs, :start].repeat(A, 1, 1)                           # (A B', start, D)
            tail = block(torch.cat([head, tail], 1), slice(start, None))
        logits = self.model.unembed(self.model.final_hidden(tail)).reshape(A, -1, self.V)
        rows = (seqs[:, None] * self.T + torch.arange(start, self.T, device=seqs.device)).flatten()
        out = torch.zeros(A, self.N, dtype=torch.float64, device=logits.device)
        out[:, rows] = kl_rows(self.logp[rows], logits)
        return out

    # ------------------------------------------------------------------ propagation
    def _from_pre(self, layer: int, change) -> torch.Tensor:
        """A change of the residual stream entering block `layer` -> KL rows: the block's forward,
        batched over A copies, from the clean activations (the model's own hooks are not run)."""
        c, attn = self.blocks[layer], self.model.blocks[layer].attn
        ws, B, T, N = self.ws, self.B, self.T, self.N
        H, dh = attn.W_Q.shape[0], attn.W_Q.shape[2]
        pre = self.pre[layer]
        if isinstance(change, _Rank1):                              # q, k, v in closed form
            A = len(change.w)
            qkv = c["qkv_in"].perturbed(change.delta.reshape(A, N), change.w, out=ws("qkv", (A, N, 3 * H * dh), pre))
            qkv.add_(c["b_qkv"])
            change = change.dense()
        else:
            A = len(change)
            x = self.model.blocks[layer].ln1(pre[None] + change).reshape(A * N, -1)
            qkv = torch.addmm(c["b_qkv"], x, c["W_qkv"], out=ws("qkv", (A * N, 3 * H * dh), pre))
        qkv = qkv.view(A * B, T, 3, H, dh)
        q, k, v = (qkv[:, :, i].transpose(1, 2).reshape(A * B * H, T, dh) for i in range(3))
        # scale and causal mask fused into the batched GEMM (the mask as its additive input)
        scores = torch.baddbmm(self.mask, q, k.transpose(1, 2), alpha=1 / math.sqrt(dh),
                               out=ws("scores", (A * B * H, T, T), pre))
        pattern = torch.ops.aten._softmax.out(scores, -1, False, out=ws("pattern", scores.shape, pre))
        z = torch.bmm(pattern, v).view(A * B, H, T, dh)
        attn_out = torch.einsum("bhte,hed->btd", z, attn.W_O) + attn.b_O                  # (A B, T, D)
        change = change + (attn_out.view(change.shape) - c["attn_out"])
        return self._from_mid(layer, change)

    def _from_mid(self, layer: int, change) -> torch.Tensor:
        """A change of the residual stream after block `layer`'s attention -> KL rows."""
        c, block = self.blocks[layer], self.model.blocks[layer]
        if not block.has_mlp:
            return self._from_post(layer, change)
        mlp, ws = block.mlp, self.ws
        M = mlp.W_in.shape[1]
        if isinstance(change, _Rank1):
            A = len(change.w)
            pre = c["mlp_in"].perturbed(change.delta.reshape(A, -1), change.w, out=ws("pre", (A, self.N, M), c["pre"]))
            pre.add_(mlp.b_in)
            change = change.dense()
        else:
            A = len(change)
            x = block.ln2(c["mid"][None] + change).reshape(A * self.N, -1)
            pre = torch.addmm(mlp.b_in, x, mlp.W_in, out=ws("pre", (A * self.N, M), c["pre"])).view(A, self.N, M)
        dresid = self._mlp_change(mlp, pre, c["post"])                                   # (A, N, D)
        return self._from_post(layer, change + dresid.view(change.shape))

    def _mlp_change(self, mlp, pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
        """(post(pre) - post) @ W_out for perturbed pre-activations (A, N, M); pre is overwritten."""
        if mlp.abstopk is not None:
            new = _mlp_post(mlp, pre)
        elif mlp.act is F.relu:
            new = F.relu(pre, inplace=True)
        else:
            new = torch._C._nn.gelu(pre, out=pre)
        new.sub_(post)
        A, N, M = new.shape
        return torch.matmul(new.view(A * N, M), mlp.W_out, out=self.ws("dresid", (A * N, mlp.W_out.shape[1]), new))

    def _from_post(self, layer: int, change) -> torch.Tensor:
        """A change of the residual stream after block `layer` -> KL rows (A, N)."""
        if layer < self.L - 1:
            return self._from_pre(layer + 1, change)
        unembed, ws = self.model.unembed, self.ws
        if isinstance(change, _Rank1):
            A = len(change.w)
            delta = change.delta.reshape(A, -1)
            if self.cfg.normalization is None:                       # logits + delta (x) (w @ W_U)
                direction = change.w @ unembed.W_U.detach()
                return kl_rank1(self.logp, self.logits_flat, delta.contiguous(), direction.contiguous())
            logits = self.unembed_lin.perturbed(delta, change.w, out=ws("logits", (A, self.N, self.V), delta))
            return kl_rows(self.logp, logits.add_(unembed.b_U))
        A = len(change)
        resid = torch.add(self.final[None], change.view(A, self.B, self.T, -1), out=ws("resid", (A, self.B, self.T, self.cfg.d_model), change))
        hidden = self.model.final_hidden(resid).reshape(A * self.N, -1)
        logits = torch.addmm(unembed.b_U, hidden, unembed.W_U, out=ws("logits", (A * self.N, self.V), hidden))
        return kl_rows(self.logp, logits.view(A, self.N, self.V))


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, T, H, dh) queries and keys -> (B, H, T, T) scores, as the model computes them."""
    return torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])


def _mlp_post(mlp, pre: torch.Tensor) -> torch.Tensor:
    post = mlp.act(pre)
    return abstopk(post, mlp.abstopk) if mlp.abstopk is not None else post


def _onehot(index: torch.Tensor, D: int, like: torch.Tensor) -> torch.Tensor:
    return F.one_hot(index, D).to(like.dtype)
