"""Decoding algorithms over a small model-runner interface: pure torch, no Ray, no I/O."""
