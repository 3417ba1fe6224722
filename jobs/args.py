"""Command-line arguments shared by every `accelgen` command: an optional YAML path, then key=value overrides."""

from __future__ import annotations

from typing import TypeVar

from pipeline.config import describe, load_config

Config = TypeVar("Config")


def config_or_usage(usage: str, config: Config, args: list[str]) -> Config | None:
    """`config` with the args' YAML file and key=value overrides; None once `usage` and every key are
    printed, when the args ask for -h/--help."""
    if "-h" in args or "--help" in args:
        print_keys(f"{usage}\n\nkeys:", config)
        return None
    yaml_path, overrides = split_args(args)
    return load_config(config, yaml_path, overrides)


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
