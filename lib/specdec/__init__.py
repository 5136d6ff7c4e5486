"""specdec: when does speculative decoding actually speed up LLM inference?"""
__version__ = "0.1.0"
