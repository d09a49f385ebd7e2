"""Reporting for the Assign-and-Add study (wtc.studies.assign_add): report.md and assign_add.png."""
from __future__ import annotations

from pathlib import Path

POOL_STYLE = {"0var_heldout": ("C0", "-"), "0var_train": ("C0", ":"), "1var_heldout": ("C1", "-"),
              "1var_restricted": ("C1", "--"), "2var_valid": ("C2", "-"), "2var_restricted1": ("C2", "--"),
              "2var_restricted2": ("C2", ":"), "2var_heldout": ("C2", "-."), "2var_union": ("k", "-")}


def _t(transition, key):
    return None if transition is None else transition[key]


def _fmt(v, digits=3):
    return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def plot(out: Path, s: dict, curve: list[dict]) -> None:
    """assign_add.png: pool accuracies with the phases, routing and virtual addition, the Fourier
    frequency counts at the end, and the f / r sweeps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [c["step"] for c in curve]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    a = axes[0, 0]
    for name, (color, ls) in POOL_STYLE.items():
        if name in curve[-1]:
            a.plot(steps, [c[name] for c in curve], ls, color=color, lw=1.4 if name == "2var_union" else 1,
                   label=name.replace("_", " "))
    for p in s["phases"]:
        if p["metric"] in ("2var_union", "1var_restricted", "l2_value_routing_rate"):
            a.axvspan(p["start_step"], p["end_step"], color="C3", alpha=0.06)
            a.axvline(p["steepest_step"], color="C3", lw=0.7, ls=":")
    a.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02),
          title="accuracy per evaluation pool (shaded: phases of 2-var union, 1-var restricted, L2 routing)")
    a.legend(fontsize=7, ncol=2)

    b = axes[0, 1]
    for key, label in (("l1_prev_token_rate", "layer 1: value -> own variable"),
                       ("l2_value_routing_rate", "layer 2: '=' top-2 = the two values"),
                       ("virtual_addition", "virtual addition (MLP on value vectors)"),
                       ("2var_union", "2-var union accuracy")):
        b.plot(steps, [c[key] for c in curve], label=label)
    b.set(xlabel="step", ylabel="rate", title="routing and the addition MLP", ylim=(0, 1.02))
    b.legend(fontsize=7)

    c = axes[1, 0]
    counts = s["fourier"]["frequency_counts"]
    ks = sorted(int(k) for k in counts)
    c.bar(ks, [counts[k] if k in counts else counts[str(k)] for k in ks],
          color=["C3" if k in s["key_frequencies"] else "C7" for k in ks])
    c.set(xlabel="frequency k (of 59)", ylabel="neurons",
          title=f"layer-2 MLP neurons on one frequency ({_fmt(s['fourier']['single_frequency_fraction'], 2)} "
                f"of live ones; red: key)")

    d = axes[1, 1]
    sw = s["sweeps"]
    if sw:
        for panel, mark, label in (("f", "o-", "f (0-var held-out)"), ("r", "s-", "r (2-var union)")):
            pts = sorted((p[panel], p[p["metric"]]) for p in sw if p.get("panel") == panel)
            if pts:
                d.plot(*zip(*pts), mark, label=label)
        d.axhline(sw[0]["level"], color="grey", lw=0.8, ls=":")
        d.set(ylim=(0, 1.02), xlim=(0, 1), xlabel="f or r", ylabel="accuracy",
              title=f"sweeps (at most {sw[0]['steps']} steps; stop at {sw[0]['level']:g})")
        d.legend(fontsize=7)
    else:
        d.set_axis_off()
    fig.tight_layout()
    fig.savefig(out / "assign_add.png", dpi=110)
    plt.close(fig)


def _probe_lines(s: dict) -> list[str]:
    """Linear probes: ours and, when measured, the authors' final model, then the timelines."""
    ours = s.get("probes")
    if not ours:
        return []
    theirs = (s.get("authors") or {}).get("probes")
    head = "| probe | activation | classes | test accuracy | train accuracy | chance |"
    lines = ["", "## Linear probes (logistic regression; test rows on held-out pairs)", "",
             head + (" authors' final: test |" if theirs else ""), "|---" * (6 + bool(theirs)) + "|"]
    for name, r in ours["final"].items():
        row = (f"| {name} | {r['hook']} | {r['classes']} | {_fmt(r['test_accuracy'])} | {_fmt(r['train_accuracy'])} | "
               f"{_fmt(r['chance'])} |")
        if theirs:
            row += f" {_fmt(theirs['final'].get(name, {}).get('test_accuracy'))} |"
        lines.append(row)
    for who, rec in (("this run", ours), ("the authors' run", theirs)):
        if rec and rec["timeline"]:
            keys = [k for k in rec["timeline"][0] if k != "step"]
            lines += ["", f"Probe test accuracy along {who}'s checkpoints:", "",
                      "| step | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
            lines += [f"| {t['step']} | " + " | ".join(_fmt(t[k]) for k in keys) + " |" for t in rec["timeline"]]
    return lines


def markdown(out: Path, s: dict) -> None:
    cfg = s["config"]
    lines = [f"# Assign-and-Add study ({cfg.get('variant', 'wtc-v1')} task, {cfg.get('model_init', 'wtc-v1')} init, "
             f"seed {cfg['seed']}, f = {cfg['f']}, "
             f"r = {cfg['r']}, {s['steps']} steps, "
             f"{s['seconds']} s)", "",
             f"- 0-var held-out pairs: **{_fmt(s['acc_0var_heldout'])}** (first >= 0.99 at step "
             f"{_fmt(s['first_step_0var_heldout_99'])}); 2-var union: **{_fmt(s['acc_2var_union'])}** "
             f"(first >= 0.97 at step {_fmt(s['first_step_2var_union_97'])}); exhaustive 2-var union (the "
             f"authors' mix, {s['union_exhaustive']['union_n']} sequences): **{_fmt(s['acc_2var_union_exhaustive'])}** "
             f"(held-out pairs {_fmt(s['union_exhaustive']['union_heldout_pairs'])}, one restricted variable "
             f"{_fmt(s['union_exhaustive']['union_restricted1'])}, two {_fmt(s['union_exhaustive']['union_restricted2'])})",
             f"- layer-1 previous-token routing {_fmt(s['l1_prev_token_rate'])}; layer-2 exact value routing "
             f"{_fmt(s['l2_value_routing_rate'])} (attention mass on the two values "
             f"{_fmt(s['l2_value_attention_mass'])})",
             f"- virtual addition {_fmt(s['virtual_addition'])}, >= 0.99 from step "
             f"{_fmt(s['virtual_addition_ready_step'])}; layer-2 value routing rose (10% / 50% / 90% of the way) "
             f"at steps {_fmt(_t(s['routing_jump'], 't10'))} / {_fmt(_t(s['routing_jump'], 't50'))} / "
             f"{_fmt(_t(s['routing_jump'], 't90'))} -> addition in place before the routing midpoint: "
             f"{_fmt(s['addition_before_routing_jump'])}",
             f"- layer-2 MLP: {_fmt(s['fourier']['single_frequency_fraction'], 2)} of live neurons on one frequency, "
             f"{_fmt(s['fourier']['on_key_fraction'], 2)} on the key frequencies {s['key_frequencies']}",
             "- residual before the layer-2 MLP, variable vs constant twin: cosine "
             + ", ".join(f"{k} {_fmt(v)}" for k, v in s["twin_cosine"].items()),
             f"- ACE core at '=' ({s['ace_core']['layer']}): rank {s['ace_core']['rank']} at energy "
             f"{s['ace_core']['energy']}, sufficient rank {_fmt(s['ace_core']['sufficient_rank'])}", "",
             "## Pools (final)", "", "| pool | accuracy | core kept | core removed |", "|---|---|---|---|"]
    for k, v in s["pools"].items():
        core = s["ace_core"]["pools"].get(k, {})
        lines.append(f"| {k} | {_fmt(v)} | {_fmt(core.get('keep'))} | {_fmt(core.get('remove'))} |")
    lines += ["", "## Transitions (first step at 10% / 50% / 90% of the rise)", "",
              "| metric | from | to | t10 | t50 | t90 |", "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {_fmt(t['from'])} | {_fmt(t['to'])} | {t['t10']} | {t['t50']} | {t['t90']} |"
              for k, t in s["transitions"].items() if t]
    lines += ["", f"## Phases (a metric rising by >= {cfg['phase_jump']} within {cfg['phase_window']} steps)", "",
              "| metric | start | steepest | end | before | after |", "|---|---|---|---|---|---|"]
    lines += [f"| {p['metric']} | {p['start_step']} | {p['steepest_step']} | {p['end_step']} | {_fmt(p['before'])} | "
              f"{_fmt(p['after'])} |" for p in s["phases"]]
    ws = s.get("weight_scan")
    if ws:
        lines += ["", f"## Per-weight scan at '=' ({ws['sequences']} sequences of the 2-var union, {ws['seconds']} s)", "",
                  f"{_fmt(ws['fraction_holding_90pct'])} of the {ws['fully_scanned_weights']} fully scanned weights "
                  "hold 90% of their KL.", "",
                  "| matrix | nonzero | scanned | mean KL per weight | total KL | share |", "|---|---|---|---|---|---|"]
        lines += [f"| {n} | {v['weights']} | {v['scanned']} | {v['mean_kl']:.3g} | {v['total_kl']:.3g}"
                  f"{' (est.)' if v['estimated'] else ''} | {_fmt(v['share'])} |" for n, v in ws["per_matrix"].items()]
        lines += ["", "Top weights: " + ", ".join(f"{t['param']}{t['index']} ({t['total_kl']:.3g})" for t in ws["top"])]
    if s["sweeps"]:
        sw = s["sweeps"]
        lines += ["", "## Sweeps (the authors' panels: f at the main r, r at the main f)", "",
                  f"A point trains for at most {sw[0]['steps']} steps; with sweep_stop it stops at the first "
                  f"evaluation where its panel's accuracy (f: 0-var held-out, r: 2-var union) is >= "
                  f"{sw[0]['level']:g} (reached at). Exhaustive union: the r panel's point on the authors' "
                  "exhaustive 2-var union at the step it ends.", "",
                  "| panel | f | r | ran | reached at | 0-var held-out | 2-var union | exhaustive union | 1-var restricted |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {p.get('panel', '-')} | {p['f']:g} | {p['r']:g}{' (main run)' if p.get('main_run') else ''} | "
                  f"{_fmt(p.get('steps_run'))} | {_fmt(p.get('reached_at'))} | "
                  f"{_fmt(p['0var_heldout'])} | {_fmt(p['2var_union'])} | {_fmt(p.get('acc_2var_union_exhaustive'))} | "
                  f"{_fmt(p.get('1var_restricted'))} |" for p in sw]
        for name, t in (s.get("sweep_thresholds") or {}).items():
            lines.append(f"- {name} ({t['metric']} >= {t['level']:g}): reached at {t['reached'] or 'none'}, "
                         f"not at {t['not_reached'] or 'none'}; threshold between {_fmt(t['bracket'][0])} and "
                         f"{_fmt(t['bracket'][1])}"
                         + ("" if t.get("monotone", True) else
                            f"; not monotone: failed above it at {t['failed_above']}"))
    lines += _probe_lines(s)
    a = s.get("authors")
    if a:
        fin = a.get("final") or {}
        lines += ["", f"## The authors' checkpoints ({a['dir']}), measured by this code on their task", ""]
        if fin:
            lines.append(f"Final model: 0-var held-out {_fmt(fin['acc_0var_heldout'])}, exhaustive 2-var union "
                         f"{_fmt(fin['acc_2var_union_exhaustive'])} (held-out pairs {_fmt(fin['union_heldout_pairs'])}, "
                         f"one restricted {_fmt(fin['union_restricted1'])}, two {_fmt(fin['union_restricted2'])}).")
        keys = ("0var_heldout", "1var_heldout", "1var_restricted", "2var_union", "l1_prev_token_rate",
                "l2_value_routing_rate", "virtual_addition")
        lines += ["", "| step | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        lines += [f"| {t['step']} | " + " | ".join(_fmt(t.get(k)) for k in keys) + " |" for t in a["timeline"]]
    lines += ["", "![curves](assign_add.png)"]
    (out / "report.md").write_text("\n".join(lines) + "\n")


__all__ = ["plot", "markdown"]
