"""The Python side of a service worker's ``map`` op (docs/map.md, "Through the service").

A ``sluice worker`` is a Rust program; for a spec with a ``{op = "map", fn =
"module:qualname"}`` op it starts this server (``python -c <this file> module:qualname``,
one process per pipeline thread) and sends it each sample's image through its stdin,
reading the result from its stdout. The worker embeds this file, so its Python needs
numpy and the user's module only, not the ``sluice`` package; ``python -m
sluice.map_server module:qualname`` runs the same server.

The protocol, little-endian, one request at a time:

* server, once started: a reply with status ``READY``, or ``FAILED`` (the function cannot
  be imported) followed by the message, then it exits;
* request: ``key u64, label i64, epoch u64, seed u64, width u32, height u32, mask u32``,
  the ``height x width x 3`` RGB8 pixels and, where ``mask`` is 1 (the source has
  segmentation masks), the sample's ``height x width`` uint8 mask;
* reply: ``status u32, a u32, b u32``; ``IMAGE``: ``a x b`` (width, height), the pixels
  and, for a request with a mask, the ``b x a`` mask the function left (edited in place or
  returned as ``(image, mask)``; this server checks that it has the image's size);
  ``FAILED``: ``a`` bytes of UTF-8 message, the sample's error (the function raised or
  returned something other than an image, or no mask of the image's size).

End of input (the worker closed the pipe or died) ends the server.
"""

from __future__ import annotations

import os
import sys

# Before anything is imported: the worker's working folder (``''`` at the head of
# ``sys.path`` under ``python -c``, the folder itself under ``-m``) is not on the path, so
# a file there cannot stand in for the user's module, numpy or the standard library.
# Python 3.11+ leaves it off itself under ``PYTHONSAFEPATH``, which the worker sets.
if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

import importlib  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import types  # noqa: E402
from typing import Any, BinaryIO, Callable, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402

REQUEST = struct.Struct("<QqQQIII")
REPLY = struct.Struct("<III")
READY, IMAGE, FAILED = 0, 1, 2


class MapSample:
    """What the function is told about its sample besides the pixels, as in-process
    (``sluice.MapSample``): ``key``, ``label`` (-1 without labels), ``epoch``, ``seed``,
    ``mask`` (the sample's uint8 ``[h, w]`` mask, writable; None without masks) and
    ``rng``, a ``numpy.random.Generator`` seeded with ``seed``, made on first use."""

    __slots__ = ("key", "label", "epoch", "seed", "mask", "_rng")

    def __init__(self, key: int, label: int, epoch: int, seed: int, mask: Optional[np.ndarray] = None) -> None:
        self.key, self.label, self.epoch, self.seed, self.mask = key, label, epoch, seed, mask
        self._rng: Optional[np.random.Generator] = None

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng

    def __repr__(self) -> str:
        return f"MapSample(key={self.key}, label={self.label}, epoch={self.epoch}, seed={self.seed})"


_DOTTED = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*")


def import_function(name: str) -> Callable[..., Any]:
    """The callable ``module:qualname`` names, kept to what the name says: the qualname is
    identifiers without dunder attributes (``__call__``, ``__globals__``), walked through
    no module (``mod:os.system``), to a function or class defined in ``module`` itself
    (not one it imported). The service allows the module (docs/service.md); this keeps
    the name from reaching past it."""
    module, sep, qualname = name.partition(":")
    if not sep or not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(qualname):
        raise ValueError(f"map needs `module:qualname` (dotted identifiers); got `{name}`")
    parts = qualname.split(".")
    dunder = next((p for p in parts if len(p) > 4 and p.startswith("__") and p.endswith("__")), None)
    if dunder is not None:
        raise ValueError(f"map: `{name}` reaches through `{dunder}`; name the function itself")
    obj: Any = importlib.import_module(module)
    for i, part in enumerate(parts):
        obj = getattr(obj, part)
        if isinstance(obj, types.ModuleType):
            walked = ".".join(parts[: i + 1])
            raise ValueError(
                f"map: `{name}` walks through module `{obj.__name__}` (as `{walked}`); name a function of `{module}`"
            )
    if not callable(obj):
        raise ValueError(f"map: `{name}` is not callable")
    defined = getattr(obj, "__module__", None)
    if defined != module:
        raise ValueError(f"map: `{name}` is defined in `{defined}`, not in `{module}`; name a function of `{module}`")
    return obj  # type: ignore[no-any-return]


def as_image(result: Any) -> Tuple[np.ndarray, int, int]:
    """``result`` as C-contiguous uint8 ``[h, w, 3]`` pixels and its width and height; the
    messages are the in-process op's."""
    if not isinstance(result, np.ndarray) or result.dtype != np.uint8:
        shape = getattr(result, "shape", "no shape")
        dtype = getattr(result, "dtype", type(result).__name__)
        raise ValueError(f"it must return a uint8 numpy array [h, w, 3]; got {dtype} with shape {shape}")
    if result.ndim != 3:
        raise ValueError(f"it must return a 3-d array; got shape {list(result.shape)}")
    h, w, c = result.shape
    if c != 3:
        raise ValueError(f"it must return [h, w, 3] RGB; got shape [{h}, {w}, {c}]")
    if w >= 1 << 32 or h >= 1 << 32:
        raise ValueError(f"it returned a {w}x{h} image, too large")
    return np.ascontiguousarray(result), w, h


class NoMask(ValueError):
    """The image changed size and no mask of the new size came with it: the in-process
    op reports this without naming an exception, and so does this server."""


def as_result(
    result: Any, mask: Optional[np.ndarray], size: Tuple[int, int]
) -> Tuple[np.ndarray, int, int, Optional[np.ndarray]]:
    """What the function returned for a ``size`` (width, height) image and its ``mask``
    (None without masks): the image (:func:`as_image`) and the C-contiguous mask of its
    size that goes with it; the messages are the in-process op's."""
    new_mask: Any = mask
    if isinstance(result, tuple):
        if mask is None:
            raise ValueError(
                f"it returned a tuple of {len(result)}, but the sample has no mask (the source has no masks): "
                "return the image"
            )
        if len(result) != 2:
            raise ValueError(f"it must return an image or (image, mask); got a tuple of {len(result)}")
        result, new_mask = result
    image, w, h = as_image(result)
    if mask is None:
        return image, w, h, None
    if new_mask is mask:
        if (w, h) != size:
            raise NoMask(f"it changed the image to {w}x{h} but returned no mask of that size")
        return image, w, h, mask
    if not isinstance(new_mask, np.ndarray) or new_mask.dtype != np.uint8:
        shape = getattr(new_mask, "shape", "no shape")
        dtype = getattr(new_mask, "dtype", type(new_mask).__name__)
        raise ValueError(f"it must return the mask as a uint8 numpy array [h, w]; got {dtype} with shape {shape}")
    if new_mask.ndim != 2:
        raise ValueError(f"the mask must be [h, w]; got shape {list(new_mask.shape)}")
    mh, mw = new_mask.shape
    if (mw, mh) != (w, h):
        raise ValueError(f"it returned a {mw}x{mh} mask with a {w}x{h} image; the mask must have the image's size")
    return image, w, h, np.ascontiguousarray(new_mask)


def _read_exact(stream: BinaryIO, buf: memoryview) -> bool:
    """Fills ``buf``; False at end of input before the first byte."""
    got = 0
    while got < len(buf):
        n = stream.readinto(buf[got:])  # type: ignore[attr-defined]
        if not n:
            if got == 0:
                return False
            raise EOFError(f"the worker closed the pipe {got} bytes into a {len(buf)}-byte message")
        got += n
    return True


def _reply(out: BinaryIO, status: int, a: int, b: int, *payload: Any) -> None:
    out.write(REPLY.pack(status, a, b))
    for part in payload:
        if len(part):
            out.write(memoryview(part).cast("B"))
    out.flush()


def _failed(out: BinaryIO, message: str) -> None:
    data = message.encode("utf-8", "replace")
    _reply(out, FAILED, len(data), 0, data)


def serve(name: str, inp: BinaryIO, out: BinaryIO) -> int:
    """Imports ``name`` and answers requests on ``inp`` until it ends."""
    try:
        fn = import_function(name)
    except BaseException as e:  # noqa: BLE001 - any import failure is the op's error
        _failed(out, f"cannot import `{name}`: {type(e).__name__}: {e}")
        return 1
    _reply(out, READY, 0, 0)
    head = memoryview(bytearray(REQUEST.size))
    while _read_exact(inp, head):
        key, label, epoch, seed, w, h, has_mask = REQUEST.unpack(head)
        pixels = bytearray(w * h * 3 + (w * h if has_mask else 0))
        if not _read_exact(inp, memoryview(pixels)):
            raise EOFError("the worker closed the pipe between a request's header and its pixels")
        image = np.frombuffer(pixels, np.uint8, w * h * 3).reshape(h, w, 3)
        mask = np.frombuffer(pixels, np.uint8, w * h, w * h * 3).reshape(h, w) if has_mask else None
        try:
            result, ow, oh, new_mask = as_result(fn(image, MapSample(key, label, epoch, seed, mask)), mask, (w, h))
        except NoMask as e:
            _failed(out, str(e))
            continue
        except Exception as e:  # noqa: BLE001 - whatever fn raises is the sample's error
            _failed(out, f"{name} raised {type(e).__name__}: {e}")
            continue
        _reply(out, IMAGE, ow, oh, result.reshape(-1), *(() if new_mask is None else (new_mask.reshape(-1),)))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m sluice.map_server module:qualname", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the worker's to handle
    # Replies go to the real stdout; whatever the function prints goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(argv[1], sys.stdin.buffer, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
