"""Command-line arguments shared by every `accelgen` command: an optional YAML path, then key=value overrides."""

from __future__ import annotations

from pipeline.config import describe


def print_keys(title: str, config: object) -> None:
    print(title)
    rows = describe(config)
    width = max(len(key) for key, _, _ in rows)
    for key, default, help_text in rows:
        print(f"  {key:<{width}}  {help_text}\n  {'':<{width}}  default: {default}")


def split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """An optional leading YAML path, then key=value overrides."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args
