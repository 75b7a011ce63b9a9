"""Real engines' KV cache managers under kvpocket's checks (`kvpocket fuzz --target`).

`base.py` is the interface (build, step, observe), `workload.py` the engine-neutral
serving workloads, `data_oracle.py` the model-free data oracle, `campaign.py` the seeded
Hypothesis loop and its reproducers; `vllm*.py` the vLLM target.
"""
