"""Strategies that decode without drafting: plain autoregressive decoding, CALM's early exit and Mask-Predict."""
