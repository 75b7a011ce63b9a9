"""The targets `kvpocket fuzz --target` knows, by name. A second engine adds a line here."""

from __future__ import annotations

from collections.abc import Callable

from kvpocket.verify.targets.base import Target


def _vllm() -> Target:
    # a target's adapter is imported only when that target is named: it imports its engine
    from kvpocket.verify.targets.vllm import VllmTarget

    return VllmTarget()


def _sglang() -> Target:
    from kvpocket.verify.targets.sglang import SglangTarget  # loads only when named

    return SglangTarget()


TARGETS: dict[str, Callable[[], Target]] = {"vllm": _vllm, "sglang": _sglang}


def load_target(name: str) -> Target:
    if name not in TARGETS:
        raise KeyError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}")
    return TARGETS[name]()
