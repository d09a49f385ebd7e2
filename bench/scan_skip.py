"""Whole scan of GPT-2's tied wte through the generic path, with and without the absent-row skip
(wtc.scan.generic: embedding rows the tokens never look up start at the tied head), alternating,
two runs each (min); checks that both give the same KLs.

    python bench/scan_skip.py [threads]        (RESULTS.md, session 20)
"""
import time, torch, sys
sys.path.insert(0, "bench")
import ablation as A
from wtc.scan import scan, generic as G
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
orig = G.Generic._live_use
def no_skip(self, name, row):
    uses = self._uses.get(name, [])
    return uses[0] if uses else None
g = torch.Generator().manual_seed(0)
for title, (d, L, V, B, T) in [("d64 2L V512 8x32", (64, 2, 512, 8, 32)), ("d32 5L V1000 8x32", (32, 5, 1000, 8, 32))]:
    model = A._gpt2(d, L, 4, V, T)
    tokens = torch.randint(0, V, (B, T), generator=g)
    present = len(tokens.unique()) / V
    res = {}
    for r in range(2):
        for label, fn in (("skip", orig), ("no skip", no_skip)):
            G.Generic._live_use = fn
            t = time.perf_counter()
            s = scan(model, tokens, params=["transformer.wte.weight"], readout=lambda o: o.logits, progress=False, keep_positions=False)
            res.setdefault(label, []).append(time.perf_counter() - t)
            kl = s.total_kl["transformer.wte.weight"]
            res.setdefault(label + " kl", kl)
    G.Generic._live_use = orig
    same = torch.allclose(res["skip kl"], res["no skip kl"], rtol=1e-4, atol=1e-9)
    n = d * V
    print(f"{title}: rows looked up {present:.3f}; whole wte ({n} weights) skip {min(res['skip']):.1f} s "
          f"({n / min(res['skip']):.0f} w/s), no skip {min(res['no skip']):.1f} s ({n / min(res['no skip']):.0f} w/s): "
          f"{min(res['no skip']) / min(res['skip']):.2f}x; same KLs: {same}", flush=True)
