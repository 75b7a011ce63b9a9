"""Proofs with Z3, over the same page-action table and API programs the model executes.

`obligations` states what is proved (initiation, consecution, safety per action);
`symbolic_exec` executes the model's programs on Z3 terms; `symbolic_bmc` unrolls API steps
from Init for Z3 and `explicit_bmc` enumerates them on the model (`bounded`: what both share);
`prove` is the `kvpocket prove` matrix; `solver` and `z3ops` are the solver plumbing;
`cti` explains a counterexample to induction. `epr` interprets the same action table over
unbounded sorts, and `parametric` proves pocket safety for every size with it.
"""

from kvpocket.verify.proofs.bounded import BmcResult
from kvpocket.verify.proofs.cti import Cti
from kvpocket.verify.proofs.obligations import PROVED, UNKNOWN, VIOLATED, ProofOutcome, prove_config
from kvpocket.verify.proofs.prove import PROVE_CONFIGS, run_prove

__all__ = ["PROVED", "PROVE_CONFIGS", "UNKNOWN", "VIOLATED", "BmcResult", "Cti", "ProofOutcome",
           "prove_config", "run_prove"]
