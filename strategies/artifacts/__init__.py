"""Trained artifacts that belong to one target (draft heads, exit heads, the CMLM) and their folder formats.

The only part of `strategies` that reads or writes files.
"""
