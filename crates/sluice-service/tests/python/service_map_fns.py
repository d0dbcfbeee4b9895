"""Map functions the service tests (tests/integration/service_map.rs) run on workers: numpy only."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np


def mark(image: np.ndarray, sample: Any) -> np.ndarray:
    """Inverts the image and writes key, label and epoch into its first pixel."""
    out = 255 - image
    out[0, 0] = [sample.key % 256, sample.label % 256, sample.epoch % 256]
    return out


def slow_mark(image: np.ndarray, sample: Any) -> np.ndarray:
    """``mark``, taking 40 ms a sample: an epoch lasts long enough to kill a child in."""
    time.sleep(0.04)
    return mark(image, sample)


def fail_on_key_5(image: np.ndarray, sample: Any) -> np.ndarray:
    if sample.key == 5:
        raise ValueError(f"cannot augment sample {sample.key}")
    return mark(image, sample)


def grow(image: np.ndarray, sample: Any) -> np.ndarray:
    """An image four times as wide and high (for the worker's pixel limit)."""
    return np.repeat(np.repeat(image, 4, axis=0), 4, axis=1)


def hang_on_key_5(image: np.ndarray, sample: Any) -> np.ndarray:
    """``mark``, but sample 5 never returns (for the op's timeout)."""
    if sample.key == 5:
        while True:
            time.sleep(1)
    return mark(image, sample)


def off_the_working_folder(image: np.ndarray, sample: Any) -> np.ndarray:
    """``mark``, if neither the working folder nor ``''`` (it, under ``python -c``) is on
    the child's import path."""
    on = [p for p in sys.path if p in ("", os.getcwd())]
    if on:
        raise ValueError(f"the working folder {os.getcwd()} is on sys.path as {on}")
    return mark(image, sample)
