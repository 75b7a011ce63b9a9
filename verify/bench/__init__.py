"""`kvpocket bench`, split by job: `cases` (the suites), `decode` (pocket off vs on),
`verifier` (fuzz, proof and mutant speed), `device` (copy bandwidth, the oracle),
`report` (tables), `plots`, and `suite` (the runner and its options)."""

from kvpocket.verify.bench.cases import SUITES, BenchResult, DecodeCase, Suite
from kvpocket.verify.bench.decode import run_decode_ab, run_decode_case
from kvpocket.verify.bench.suite import main, run_bench, run_suite

__all__ = ["SUITES", "BenchResult", "DecodeCase", "Suite", "main", "run_bench", "run_decode_ab",
           "run_decode_case", "run_suite"]
