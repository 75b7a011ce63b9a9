"""kvpocket's reference model: an executable state machine of KV-cache pages,
sequences and the SWA reuse pocket. Standard library only.

Read top-down: `config` (vocabulary), `logic` (the operations every definition
uses), `state` (the variables), `pages` (the page-layer action table),
`invariants` (the catalogue), `api` (sequence-layer programs), `executor`
(how programs run and choices are made), `machine` (the `Model` to drive).
"""

from .config import KVConfig, LifeCycle, PocketConfig, PocketPolicy
from .machine import Model

__all__ = ["KVConfig", "LifeCycle", "Model", "PocketConfig", "PocketPolicy"]
