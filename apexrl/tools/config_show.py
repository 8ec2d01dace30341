"""``apexrl config show [CONFIG] [--set section.key=value ...]``: the resolved whole config.

It prints every key of the config that ``CONFIG`` and the overrides make, defaults filled in, as
YAML that ``apexrl.config.load_config`` reads back to the same ``Config`` (the form the learner
writes to ``<run dir>/config.yaml``). A config that cannot work is one line on stderr and exit
status 2, as for every command that reads a config.
"""

from __future__ import annotations

import argparse
import sys

from apexrl.config import ConfigError, add_overrides_argument, dump_config, load_config


def show(config: str | None, overrides: list[str]) -> str:
    """The YAML text of the resolved config (raises ``ConfigError``)."""
    return dump_config(load_config(config, overrides))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    show_parser = commands.add_parser(
        "show", help="print the resolved config, every key with defaults filled in, as YAML"
    )
    show_parser.add_argument(
        "config", nargs="?", metavar="CONFIG", help="YAML config file (omitted: every default)"
    )
    add_overrides_argument(show_parser)


def main(args: argparse.Namespace) -> int:
    try:
        text = show(args.config, args.overrides)
    except ConfigError as exc:
        print(f"apexrl config show: config error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
