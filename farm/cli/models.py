"""farm models: the built-in models and the onnx package's architectures."""

from __future__ import annotations

import argparse

from farm.cli.common import add_verb, emit_json, print_table


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    add_verb(subparsers, common, "models", run, "list the built-in models and the onnx package's architectures")


def run(args: argparse.Namespace) -> int:
    from farm.models import list_models

    rows = list_models()
    if args.json:
        emit_json(rows)
    else:
        print_table(rows, ["name", "kind", "about"])
    return 0
