"""Layer 3, model: prediction from costs and acceptance, no measurement read except through data.tables.

Forward-cost models (costmodel), acceptance models (acceptance), trace replay (replay), the speedup
predictions and policies (predict) and the end-to-end calibration of a published fit (calibrate).
May import: engines (for vLLM's speculative config), data, errors, paths.
"""
