"""Import stubs for SGLang's memory-cache modules on a CPU-only machine.

Three packages are imported when SGLang's memory-pool modules load but never called on
the paths the target drives: `torchvision` (through sglang's model configs and
multimodal utilities), `mistral_common` (a tokenizer) and `torchcomms` (collectives).
Installing them is worse than stubbing them: pip resolves torchvision to a CUDA torch,
and the registry builds do not load against the CPU torch. `install()` puts a finder on
`sys.meta_path` that answers those names (and their submodules) with empty modules whose
attributes are placeholders. transformers caches whether torchvision is available the
first time it asks, so `install` makes it ask first, while the name is still absent;
otherwise its image utilities would find the stub and fail on its version.

Older releases (around 0.5.14 to 0.5.19) register model configs with transformers under
names the pinned transformers has since taken itself (`qwen3_asr`); `install` makes that
registration keep transformers' own entry instead of raising, as `exist_ok=True` does.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

STUBBED = ("torchvision", "mistral_common", "torchcomms")


class _Placeholder:
    """Any attribute, call or subclassing of a stubbed name: a placeholder, never used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StubModule(types.ModuleType):
    __version__: str

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _tolerate_registered_configs() -> None:
    """A config name registered twice keeps its first entry (older SGLang releases)."""
    try:
        auto: Any = importlib.import_module("transformers.models.auto.configuration_auto")
    except ImportError:
        return
    mapping = auto._LazyConfigMapping
    if getattr(mapping.register, "_kvpocket_tolerant", False):
        return
    original = mapping.register

    def register(self: Any, key: str, value: Any, exist_ok: bool = False) -> None:
        if key in self._mapping:
            return  # transformers has its own config of that name: keep it
        original(self, key, value, exist_ok=exist_ok)

    register._kvpocket_tolerant = True  # type: ignore[attr-defined]
    mapping.register = register


def install() -> None:
    """Stub the names in `STUBBED` that are not really installed (idempotent)."""
    if any(isinstance(f, _StubFinder) for f in sys.meta_path):
        return
    _tolerate_registered_configs()
    missing = [n for n in STUBBED if importlib.util.find_spec(n) is None]
    if not missing:
        return
    try:  # let transformers record torchvision as absent before the stub answers
        utils: Any = importlib.import_module("transformers.utils.import_utils")
        utils.is_torchvision_available()
    except ImportError:
        pass
    finder = _StubFinder()
    sys.meta_path.append(finder)
