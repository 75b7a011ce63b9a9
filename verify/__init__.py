"""kvpocket's verifiers, one subpackage per engine, all reading the model's tables.

* `conformance`  the implementation against the model in lockstep: adapter, Hypothesis
                 rules, fuzz campaigns and the default matrix, replay, shrinking.
* `proofs`       Z3: proof obligations, the symbolic executor, BMC, the `prove` matrix.
* `traces`       the trace and event-log formats, the trace checker, the recorder.
* `quality`      seeded bugs (mutants, the bug zoo) and the mutation-testing probe.
* `bench`        `kvpocket bench`: decode A/B, verifier speed, device throughput.
* `cli`          the `kvpocket` command line and the generated docs.
* `targets`      real engines' managers (vLLM) under the same checks.
* `presets`      the named configurations every engine shares; beside it, below every
                 engine: `patching`, `interrupts`, `usage`, `terminal`, `layers`.

`layers.LAYERS` is the import order of these units, checked by a test.

Subpackage `__init__`s re-export each engine's public names, never a function named like
its module (`proofs.explicit_bmc` stays the module; the function is
`proofs.explicit_bmc.explicit_bmc`).
"""
