"""A long-running manager: what `create` costs, and what memory holds, as the number of
sequences ever created grows (a server never reuses ids).

* `create_cost`: one manager creates, resumes, decodes a little and closes sequence
  after sequence; after every `closed` mark, the next `sample` create+close cycles are
  timed (microseconds per `create`), and the sequence handles and simulator streams the
  manager still holds are counted. Flat rows mean the cost does not depend on history.
* `record_peak`: `kvpocket trace record --steps N` in a child process; its peak resident
  memory (ru_maxrss), the figure of the 200 MB target for 1,000,000 steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvpocket.impl.manager import KVCacheManager
from kvpocket.verify.presets import preset

SAMPLE = 500  # create+close cycles timed at each mark


def _cycle(mgr: KVCacheManager, sid: int) -> float:
    """One sequence's life; returns the seconds `create` took."""
    t0 = time.perf_counter()
    kv = mgr.create(sid, [1, 2, 3])
    took = time.perf_counter() - t0
    kv.resume()
    kv.resize(4, 2)
    kv.close()
    return took


def create_cost(marks: tuple[int, ...], sample: int = SAMPLE) -> list[dict[str, Any]]:
    """Rows {closed, create_us, handles_held, live_streams} at each mark (ascending)."""
    mgr = KVCacheManager(preset("tiny"))
    sim = getattr(mgr.backend, "sim", None)
    rows: list[dict[str, Any]] = []
    sid = 0
    for mark in sorted(marks):
        while sid < mark:
            _cycle(mgr, sid)
            sid += 1
        spent = sum(_cycle(mgr, sid + i) for i in range(sample))
        sid += sample
        rows.append({"closed": mark, "create_us": round(spent / sample * 1e6, 2),
                     "handles_held": len(mgr.seqs),
                     "live_streams": sim.live_streams if sim is not None else None})
    mgr.shutdown()
    return rows


def record_peak(steps: int, seed: int = 0) -> dict[str, Any]:
    """Peak RSS (MB) and seconds of `kvpocket trace record --steps steps` (a child)."""
    with tempfile.TemporaryDirectory(prefix="kvpocket-bench-record-") as d:
        out = Path(d) / "log.ndjson"
        code = (
            "import resource, sys\n"
            "from kvpocket.verify.cli import main\n"
            f"rc = main(['trace', 'record', '--steps', '{steps}', '--seed', '{seed}', "
            f"'--out', {str(out)!r}])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(rc)\n")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                              check=False)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"trace record failed: {proc.stderr.strip()[-500:]}")
        peak_kb = int(proc.stderr.strip().splitlines()[-1])
        size = out.stat().st_size
    unit = 1 if sys.platform != "darwin" else 1024  # ru_maxrss: KB on Linux, bytes on macOS
    return {"steps": steps, "peak_rss_mb": round(peak_kb / unit / 1024, 1),
            "seconds": round(seconds, 1), "log_mb": round(size / 2**20, 1),
            "command": f"kvpocket trace record --steps {steps} --out FILE"}
