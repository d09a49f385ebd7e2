"""The agreement study's Hugging Face path on models that have learned agreement: GPT-2- and
LLaMA-architecture `transformers` models built from configs, trained here on the agreement corpus
with the project's loop (wtc.models.training; the study's data and loss), saved as local model
directories with a word-level tokenizer ("." its BOS, as in training; the study's default corpus
variant), then analysed by
`wtc.studies.agreement` with model=DIR, exactly as `wtc study agreement --model DIR` does.

    python bench/agreement_hf.py [--out DIR] [--steps 800] [--arch gpt2,llama]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def build(arch: str, vocab: int, n_ctx: int):
    import transformers

    torch.manual_seed(0)
    if arch == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, n_inner=256, vocab_size=vocab, n_positions=n_ctx, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0))
    if arch == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=256,
            vocab_size=vocab, max_position_embeddings=n_ctx))
    raise SystemExit(f"unknown arch {arch!r} (gpt2, llama)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench/results/agreement_hf")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--arch", default="gpt2,llama")
    args = p.parse_args()
    torch.set_num_threads(1)
    from wtc.models.hf import HFModel, word_tokenizer
    from wtc.models.training import TrainConfig, train
    from wtc.studies import agreement as A
    from wtc.tasks.agreement import AgreementCorpus

    cfg = A.AgreementStudy.quick()
    corpus = AgreementCorpus(cfg.corpus_seed, variant=cfg.corpus)
    x, real, verb = A.sentence_batch(corpus, cfg.train_sentences, cfg.n_ctx, seed=0)
    rows = []
    for arch in args.arch.split(","):
        model = HFModel(build(arch, corpus.d_vocab, 32))
        gen = torch.Generator().manual_seed(0)

        def batch_fn(step):
            i = torch.randint(0, len(x), (cfg.batch,), generator=gen)
            return x[i], real[i], verb[i]

        t0 = time.perf_counter()
        r = train(model, TrainConfig(steps=args.steps, lr=cfg.lr, warmup=cfg.warmup, schedule="cosine", min_lr_frac=0.1),
                  batch_fn, lambda b: A.agreement_loss(model, b, cfg.verb_weight), rngs={"batch": gen}, progress=False)
        d = Path(args.out) / f"{arch}-agreement"
        model.hf.save_pretrained(d)
        word_tokenizer(corpus.vocab, bos=".").save_pretrained(d)
        s = A.run(A.AgreementStudy(model=str(d), fit_n=cfg.fit_n, eval_n=cfg.eval_n, corpus=cfg.corpus), Path(args.out) / f"{arch}-study",
                  progress=False)
        m = s["models"][0]
        row = {"arch": arch, "train_s": round(time.perf_counter() - t0, 1), "s_per_step": r.seconds_per_step,
               **{k: m[k] for k in ("rank", "axis_rank", "minimal_necessary_rank", "baseline_acc", "keep_acc",
                                    "remove_acc", "flip_reversal", "generation_flip", "r2", "lemma_acc",
                                    "no_attractor_lemma_acc")},
               "profile": [(p["rank"], round(p["r2"], 3), p["flip_reversal"]) for p in m["layer_profile"]]}
        print(json.dumps(row))
        rows.append(row)
    (Path(args.out) / "rows.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
