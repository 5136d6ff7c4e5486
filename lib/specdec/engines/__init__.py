"""Layer 2, engines: what measures, and writes raw runs.

The torch engine (engine: scheduler; proposers, verify, ngram, kv, timing, offload, onednn) and its measure loop
(harness), vLLM's static batches (vllm_runner, vllm_steps) and its server under load (server, loadgen, serving),
the interleaved pairing both engines share (pairing), the read-bandwidth probe (probe) and the lent-GPU call
(devicerun). May import: data, errors, paths.
"""
