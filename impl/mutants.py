"""Seeded-bug switches read by the implementation (see `kvpocket.model.mutants`).

One switchboard for the implementation and the model: `active(name)` is a set lookup,
`enable(name)` a context manager, and `KVPOCKET_MUTANT=name` switches a bug on for a
whole process tree. The registry (names, descriptions, the real bugs they are modelled
on) is `kvpocket.verify.mutants.MUTANTS`.
"""

from __future__ import annotations

from kvpocket.model.mutants import ENV, active, active_names, enable

__all__ = ["ENV", "active", "active_names", "enable"]
