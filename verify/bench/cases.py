"""The benchmark suites (`kvpocket bench --list`) and their decode cases."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
BACKENDS = ("numpy", "cupy")


class BenchUsageError(ValueError):
    """A bad option value; the message names the option and the allowed values."""


# ---- suites ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeCase:
    batch: int
    window: int
    tokens_per_block: int
    steps: int
    pressure: bool = False


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    decode: tuple[DecodeCase, ...]
    batch_sweep: tuple[int, ...] = ()
    batch_sweep_preset: tuple[int, int] = (128, 32)
    window_sweep: tuple[int, ...] = ()
    window_sweep_batch: int = 256
    window_sweep_tpb: int = 32
    sweep_steps: int = 128
    fuzz_examples: int | None = None  # fuzz budget: examples, or
    fuzz_seconds: float | None = None  # seconds per run
    fuzz_all_cores: bool = True
    prove_configs: tuple[str, ...] = ()
    bmc_unsafe: bool = False
    mutants: bool = False
    gpu: bool = False
    backend: str | None = None  # forced backend (gpu: cupy)
    # `trace check` at real geometry (`geometry.py`): (start-up slots per level, slots per
    # level, events) or None
    trace_geometry: tuple[int, int, int] | None = None
    # `trace check` of a full pool (`geometry.full_pool_log`): (GPU slots, sequences) or None
    full_pool: tuple[int, int] | None = None
    create_marks: tuple[int, ...] = ()  # long run: create cost after this many closed
    record_steps: int = 0  # long run: peak memory of `trace record --steps` this many


def _matrix(batches: Sequence[int], presets: Sequence[tuple[int, int]],
            steps: Callable[[int, int, int], int], pressure: Sequence[bool]) -> tuple[DecodeCase, ...]:
    return tuple(DecodeCase(n, w, t, steps(n, w, t), p)
                 for p in pressure for (w, t) in presets for n in batches)


DECODE_PRESETS = ((128, 32), (131, 32), (4096, 64))


def _default_steps(n: int, w: int, t: int) -> int:
    if w >= 1024:
        return 64 if n >= 1024 else 128  # 1024 x 4096/64 is kept cheap
    return 128 if n >= 1024 else 256


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("smoke", "seconds: 8 sequences, 128/32 and 131/32, with and without pressure; "
          "tiny sweeps; 2 fuzz examples on one worker; trace check at 2**20 and 100,000 slots "
          "per level (300 events)",
          _matrix((8,), ((128, 32), (131, 32)), lambda n, w, t: 96, (False, True)),
          batch_sweep=(4, 16), window_sweep=(64, 128), window_sweep_batch=8, sweep_steps=48,
          fuzz_examples=2, fuzz_all_cores=False, trace_geometry=(1 << 20, 100_000, 300),
          full_pool=(300, 12), create_marks=(0, 1000), record_steps=300),
    Suite("default", "batches 64/256/1024 x windows 128/32, 131/32, 4096/64, with and without "
          "pressure; batch and window sweeps; fuzz (1 worker and all cores), prove per "
          "configuration, BMC to the unsafe counterexample, mutant time-to-kill, trace check "
          "at real geometry (header-only start-up at 2**20 slots per level; a 100,000-event "
          "log at 100,000 slots per level; a full pool at 100,000 GPU slots)",
          _matrix((64, 256, 1024), DECODE_PRESETS, _default_steps, (False, True)),
          batch_sweep=(16, 64, 256, 1024, 2048),
          window_sweep=(64, 128, 256, 512, 1024, 2048, 4096), window_sweep_batch=128,
          sweep_steps=96, fuzz_seconds=15.0,
          prove_configs=("gpu", "gpu-host", "gpu-host-disk", "gpu-host-2seq"),
          bmc_unsafe=True, mutants=True, trace_geometry=(1 << 20, 100_000, 100_000),
          full_pool=(100_000, 5_000),
          create_marks=(0, 1000, 10_000, 100_000), record_steps=100_000),
    Suite("gpu", "CuPy: decode A/B (batches 64/256/1024 x 128/32, 131/32, 4096/64; pressure "
          "at 256), migration copy bandwidth vs a plain CuPy copy, data-oracle throughput",
          _matrix((64, 256, 1024), DECODE_PRESETS, _default_steps, (False,))
          + _matrix((256,), DECODE_PRESETS, _default_steps, (True,)),
          gpu=True, backend="cupy"),
)}


@dataclass
class BenchResult:
    suite: str
    backend: str
    machine: dict[str, Any]
    suite_config: dict[str, Any]
    decode: list[dict[str, Any]] = field(default_factory=list)
    scaling: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    verifier: dict[str, Any] = field(default_factory=dict)
    long_run: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None
    plots: list[str] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False  # Ctrl-C: the rows are those of the part that ran

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "backend": self.backend, "machine": self.machine,
                "config": self.suite_config, "decode": self.decode, "scaling": self.scaling,
                "verifier": self.verifier, "long_run": self.long_run, "gpu": self.gpu,
                "plots": self.plots,
                "seconds": self.seconds, "interrupted": self.interrupted,
                "regenerate": f"kvpocket bench --suite {self.suite} --backend {self.backend} "
                              "--json FILE --plots DIR"}
