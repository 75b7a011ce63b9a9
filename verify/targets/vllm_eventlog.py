"""(being written)"""
from __future__ import annotations
from typing import Any
class EventLogWriter:
    def __init__(self, cfg: Any, pool: Any, out: Any) -> None: ...
