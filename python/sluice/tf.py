"""TensorFlow integration: :func:`dataset` turns a sluice loader into a ``tf.data.Dataset``
of dicts of ``tf.Tensor`` s (``image``, ``label``, ``key``, and ``weight`` under importance
sampling)::

    from sluice.tf import dataset

    loader = sluice.Loader(pipe)
    ds = dataset(loader)                  # each iteration of ds runs the loader's next epoch
    for epoch in range(epochs):
        loader.set_epoch(epoch)           # or ds.set_epoch(epoch)
        for batch in ds:
            train_step(batch["image"], batch["label"])
    ckpt = ds.state_dict()                # the loader's, mid-epoch too

The dataset is built with ``tf.data.Dataset.from_generator`` and a full
``output_signature`` (batch and image sizes left open: the last batch may be short). Every
iteration of it calls ``iter(loader)``, so ``set_epoch`` / ``load_state_dict`` on the loader
(or on the returned dataset, which carries ``state_dict``, ``load_state_dict``,
``set_epoch`` and ``stats``) position it exactly as for the loader itself. The dataset
turns off tf.data's injected prefetch and autotuning, so a batch is pulled only when asked
for and the state counts the batches the loop received (sluice prefetches on its own
threads); a ``.prefetch(n)`` added after it pulls ahead, and the state then counts those
too.

Memory: ``from_generator`` turns each numpy array into a tensor itself (TensorFlow's
generator op takes no DLPack); whether that shares sluice's buffer or copies it is
TensorFlow's choice, so count on one copy per batch (``bench/handoff_cpu.py`` measures it).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import numpy as np

try:
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("sluice.tf needs TensorFlow: pip install tensorflow (or tensorflow-cpu)") from e

__all__ = ["dataset", "output_signature"]


def _spec_of(loader: Any) -> Dict[str, Any]:
    pipeline = getattr(loader, "pipeline", None)
    if pipeline is None:
        return {}
    spec: Dict[str, Any] = pipeline.to_dict()
    return spec


def _image_is_float(spec: Dict[str, Any]) -> bool:
    for op in spec.get("ops", []):
        name = op.get("op") if isinstance(op, dict) else None
        if name == "normalize" or (name == "dtype" and op.get("dtype") == "f32"):
            return True
    return False


def _has_weight(spec: Dict[str, Any]) -> bool:
    sampling = spec.get("sampling")
    if isinstance(sampling, dict):
        return sampling.get("mode", sampling.get("kind", "uniform")) not in ("uniform", "none")
    return isinstance(sampling, str) and sampling not in ("uniform", "none")


def output_signature(loader: Any, image_dtype: Optional[str] = None) -> Dict[str, Any]:
    """The ``tf.TensorSpec`` of each field of ``loader``'s batches: ``image`` uint8 (or
    float32 when the pipeline normalises or converts, or ``image_dtype`` says so) of shape
    ``[None, None, None, None]``, ``label`` and ``key`` int64 ``[None]``, ``weight``
    float32 ``[None]`` under importance sampling."""
    spec = _spec_of(loader)
    if image_dtype is None:
        image_dtype = "f32" if _image_is_float(spec) else "u8"
    if image_dtype not in ("u8", "f32"):
        raise ValueError(f"image_dtype must be 'u8' or 'f32', not {image_dtype!r}")
    sig: Dict[str, Any] = {
        "image": tf.TensorSpec([None, None, None, None], tf.float32 if image_dtype == "f32" else tf.uint8),
        "label": tf.TensorSpec([None], tf.int64),
        "key": tf.TensorSpec([None], tf.int64),
    }
    if _has_weight(spec):
        sig["weight"] = tf.TensorSpec([None], tf.float32)
    return sig


def dataset(loader: Any, image_dtype: Optional[str] = None) -> Any:
    """A ``tf.data.Dataset`` over ``loader`` (a :class:`sluice.Loader` or
    :class:`sluice.RemoteLoader` with numpy output); each iteration runs its next epoch
    (or resumes where ``load_state_dict`` put it). The dataset also has ``state_dict()``,
    ``load_state_dict(state)``, ``set_epoch(epoch)`` and ``stats()``, the loader's (a
    dataset derived from it with ``.map`` etc. does not: keep this one or the loader)."""
    sig = output_signature(loader, image_dtype)
    fields = tuple(sig)

    def batches() -> Iterator[Dict[str, Any]]:
        for batch in loader:
            out = {name: np.asarray(batch[name]) for name in fields if name != "weight"}
            if "weight" in sig:
                w = batch.get("weight")
                out["weight"] = np.ones(len(out["label"]), np.float32) if w is None else np.asarray(w)
            yield out

    ds = tf.data.Dataset.from_generator(batches, output_signature=sig)
    # tf.data injects a prefetch after a generator by default (autotune): it would pull
    # batches the loop has not asked for, and the loader's state would count them. sluice
    # already prefetches (`prefetch` in the spec); here a batch is pulled when asked for.
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    ds = ds.with_options(options)
    ds.state_dict = loader.state_dict
    ds.load_state_dict = loader.load_state_dict
    ds.set_epoch = loader.set_epoch
    ds.stats = loader.stats
    ds.loader = loader
    return ds
