"""Layer 1, data: what the studies read and write, with no engine in it.

configs and profiles (spec, config, hardware), the model pairs and their tokenizers (models, tokenizer), prompt
sets (prompts), acceptance traces (traces), immutable raw runs (rawdata) and the processed tables of both engines
in one schema (tables). May import: errors, paths.
"""
