"""Gemma 4 E2B on one Cloud TPU v5e under vLLM."""
