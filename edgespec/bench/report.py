"""The bench's results for people: a table, and a plot of speedup against draft length."""

from __future__ import annotations

from ..errors import EdgespecError


def format_report(res: dict) -> str:
    head = (f"{'':24}{'tok/s':>7}{'speedup':>9}{'predicted':>10}{'accept':>8}{'tok/pass':>9}"
            f"{'outside llama.cpp':>19}{'draft head':>12}")
    lines = [head]
    for name, r in res["configs"].items():
        pred = r.get("predicted_speedup")
        lines.append(
            f"{name:24}{r['tokens_per_second']:7.1f}{r['speedup']:8.2f}x"
            f"{(f'{pred:.2f}x' if pred else ''):>10}"
            f"{(format(r['acceptance_rate'], '.0%') if 'acceptance_rate' in r else ''):>8}"
            f"{(format(r['tokens_per_pass'], '.2f') if 'tokens_per_pass' in r else ''):>9}"
            f"{(format(r['outside_llama_share'], '.1%') if 'outside_llama_share' in r else ''):>19}"
            f"{(format(r['draft_head_share'], '.1%') if r.get('draft_head_share') else ''):>12}"
            + (f"  grammar {r['grammar_share']:.1%}, valid {r['valid_outputs']}"
               if "grammar_share" in r else ""))
    c = res["costs"]
    tb = ", ".join(f"{n}: {1000 * v:.1f}" for n, v in c["target_seconds_by_batch"].items())
    lines += [
        f"costs (ms): target pass by batch size [{tb}]; draft "
        f"{1000 * c['draft_seconds_per_token']:.1f} per token "
        f"({c['draft_to_target_cost']:.2f} of a target token)",
        f"{res['prompts']} prompts × {res['max_tokens']} tokens, temperature "
        f"{res['temperature']}; peak RSS {res['peak_rss_mib']:.0f} MiB (model files "
        f"{res['model_files_mib']:.0f} MiB)",
    ]
    return "\n".join(lines)


def require_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EdgespecError("--plot needs matplotlib: pip install 'edgespec[plot]'") from None
    return plt


def plot(res: dict, path: str) -> None:
    """Speedup against pinned draft length, with the other configurations as lines: each
    series in its own colour, line style and marker."""
    plt = require_pyplot()
    rows = res["configs"]
    fixed = sorted((r["k"], r["speedup"]) for r in rows.values() if "k" in r)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = iter(plt.get_cmap("tab10").colors)
    if fixed:
        ax.plot([k for k, _ in fixed], [s for _, s in fixed], "o-", color=next(colors),
                label="draft length pinned")
    styles = iter(["--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)), "--"])
    markers = iter("s^vD<>pPX*h")
    ks = [k for k, _ in fixed] or [1, 32]
    for name, r in rows.items():
        if "k" not in r and name != "plain":
            ax.plot([min(ks), max(ks)], [r["speedup"]] * 2, color=next(colors),
                    linestyle=next(styles, "--"), marker=next(markers, "o"), label=name)
    ax.axhline(1.0, color="grey", linewidth=1, label="plain")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("draft tokens per round (K)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("edgespec bench")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
