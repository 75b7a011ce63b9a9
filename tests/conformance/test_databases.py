"""Workers share one example database: a directory, or a real Redis server."""

from __future__ import annotations

import importlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpocket.model.config import PocketPolicy
from kvpocket.verify.conformance.fuzz import CampaignSpec, run_campaign, run_worker
from kvpocket.verify.presets import PRESETS

UNSAFE = PRESETS["tiny"].config.with_pocket(True, PocketPolicy.UNSAFE)


@pytest.mark.slow
def test_two_workers_share_a_directory_database(tmp_path: Path) -> None:
    db = tmp_path / "db"
    spec = CampaignSpec("tiny", UNSAFE, profile="dev", examples=60, seed=1, database=str(db),
                        out_dir=str(tmp_path / "out"))
    report = run_campaign(spec, workers=2, show_progress=False)
    assert report.workers == 2 and report.steps > 0
    assert report.failures  # each worker may find it; at least one did
    saved = [p for p in db.rglob("*") if p.is_file()]
    assert saved, "the failing example was not saved to the shared database"
    # A later campaign on the same database replays the saved failure first.
    again = run_worker(CampaignSpec("tiny", UNSAFE, profile="dev", examples=60, seed=99,
                                    database=str(db), out_dir=str(tmp_path / "again")))
    assert again.failures and again.examples <= 3


@pytest.mark.slow
def test_a_seeded_campaign_with_a_database_is_reproducible(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same seed, fresh databases: the same examples, the same failure, and it is saved,
    even when the process imported other code in between (Hypothesis harvests constants
    from loaded modules unless the campaign stops it)."""
    runs = []
    for name in ("a", "b"):
        if name == "b":
            (tmp_path / "pool").mkdir()
            (tmp_path / "pool" / "many_constants.py").write_text(
                "".join(f"C{i} = {100 + 37 * i}\n" for i in range(64)))
            monkeypatch.syspath_prepend(str(tmp_path / "pool"))
            importlib.import_module("many_constants")
        spec = CampaignSpec("tiny", UNSAFE, profile="dev", examples=60, seed=5,
                            database=str(tmp_path / name / "db"), out_dir=str(tmp_path / name))
        runs.append(run_worker(spec))
        assert any(p.is_file() for p in (tmp_path / name / "db").rglob("*")), \
            "the seeded campaign saved nothing to its database"
    a, b = runs
    assert a.failures and b.failures
    assert (a.examples, a.steps) == (b.examples, b.steps)
    assert Path(a.failures[0].trace).read_text() == Path(b.failures[0].trace).read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (KVPOCKET_REDIS=1 scripts/setup-env.sh installs it)")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_campaign_pools_failures_in_redis(redis_url: str, tmp_path: Path) -> None:
    import redis

    spec = CampaignSpec("tiny", UNSAFE, profile="dev", examples=60, seed=5, database=redis_url,
                        out_dir=str(tmp_path))
    report = run_worker(spec)
    assert report.failures
    client = redis.Redis.from_url(redis_url)
    assert client.keys("*"), "nothing was written to Redis"
    # Another "machine" (a second campaign) starts from the pooled failure.
    again = run_worker(CampaignSpec("tiny", UNSAFE, profile="dev", examples=60, seed=77,
                                    database=redis_url, out_dir=str(tmp_path / "b")))
    assert again.failures and again.examples <= 3
