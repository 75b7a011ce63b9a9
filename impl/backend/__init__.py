"""Backend selection: `"numpy"`, `"cupy"` or `"auto"` (CuPy when a GPU is usable).

`gpu_available()` never raises: cupy may be missing, present without a driver
(`cudaErrorInsufficientDriver`, `CUDARuntimeError` at first allocation), or
broken; every such case means "no GPU" and `auto` falls back to NumPy.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import BackendUnavailableError
from .numpy_sim import NumpyBackend, StreamSimulator
from .protocol import Access, Backend, EventRef, StreamRef

_GPU_OK: bool | None = None
# The simulator-only options (eager, race_check, device_mirror) drop on CuPy.
_CUPY_OPTIONS = ("disk_dir", "copy_mode")


def _probe_gpu() -> bool:
    try:
        import cupy
    except Exception:
        return False
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        x = cupy.arange(4, dtype=cupy.int32)  # first allocation + kernel launch
        return int(x.sum()) == 6
    except Exception:
        return False


def gpu_available(refresh: bool = False) -> bool:
    """True iff cupy imports, sees a device, and can allocate and run a kernel."""
    global _GPU_OK
    if _GPU_OK is None or refresh:
        _GPU_OK = _probe_gpu()
    return _GPU_OK


def make_backend(kind: str | Backend = "auto", **kwargs: Any) -> Backend:
    """Build a backend. `kind` may also be an already-built backend object."""
    if not isinstance(kind, str):
        return kind
    if kind == "numpy":
        return NumpyBackend(**kwargs)
    if kind == "cupy":
        if not gpu_available():
            raise BackendUnavailableError(
                "backend 'cupy' needs CuPy and a usable CUDA GPU, and none was found "
                "(pip install 'kvpocket[cuda]' on a machine with one, or use backend='numpy')")
        from .cupy_backend import CupyBackend

        return CupyBackend(**{k: v for k, v in kwargs.items() if k in _CUPY_OPTIONS})
    if kind == "auto":
        if gpu_available():
            from .cupy_backend import CupyBackend

            return CupyBackend(**{k: v for k, v in kwargs.items() if k in _CUPY_OPTIONS})
        return NumpyBackend(**kwargs)
    raise ValueError(f"backend must be 'numpy', 'cupy' or 'auto', got {kind!r}")


__all__ = [
    "Access",
    "Backend",
    "EventRef",
    "NumpyBackend",
    "StreamRef",
    "StreamSimulator",
    "gpu_available",
    "make_backend",
]
