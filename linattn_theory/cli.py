"""The ``linattn`` command line: thin wrappers over the package's functions.

Exit status: 0 success, 2 invalid input (nothing is written), 3 a run diverged (its table
is written and the message suggests a stable step size).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import ConfigError, load_config

EXIT_OK, EXIT_INVALID, EXIT_DIVERGED = 0, 2, 3


def _simulate(args) -> int:
    from .federated import simulate
    from .io import write_run

    config = load_config(args.config)
    if args.backend is not None:
        config = config.with_updates({"model.backend": args.backend})
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} exists and is not a folder")
    result = simulate(config, progress=not args.quiet)
    paths = write_run(result, out)
    last = result.table.iloc[-1]
    print(f"wrote {paths['table']} ({len(result.table) - 1} rounds, final loss F = {last['loss']:.6g})")
    if result.diverged:
        print(result.divergence.message, file=sys.stderr)
        return EXIT_DIVERGED
    return EXIT_OK


def _recommend(args) -> int:
    from .bound import recommend_main

    return recommend_main(args.config, measure=not args.no_measure)


def _derive(args) -> int:
    import subprocess

    folder = Path(args.root) / "derivations"
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if not scripts:
        raise ConfigError(f"--root {args.root!r}: no derivation scripts in {folder}")
    if args.only:
        scripts = [p for p in scripts if p.stem in args.only]
        missing = set(args.only) - {p.stem for p in scripts}
        if missing:
            raise ConfigError(f"--only {sorted(missing)[0]!r}: no such derivation in {folder}")
    failed = []
    for script in scripts:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        if not args.quiet:
            print(proc.stdout, end="")
        status = "PASS" if proc.returncode == 0 else "FAIL"
        print(f"{status}: derivations/{script.name}")
        if proc.returncode != 0:
            failed.append(script.name)
            print(proc.stderr, end="", file=sys.stderr)
    print(f"{len(scripts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also the source of docs/cli.md)."""
    parser = argparse.ArgumentParser(
        prog="linattn",
        description="Federated training of linear attention: simulations, theory checks and figures.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("simulate", help="run one federated simulation from a TOML config",
                       description="Run one federated simulation (FedAvg or FedFrozen) and write "
                                   "rounds.csv, params.npz and metadata.json to --out.")
    p.add_argument("config", help="TOML configuration file (see simulations/configs/)")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--backend", choices=("numpy", "cupy"), default=None,
                   help="array library, overriding model.backend of the config "
                        "(cupy needs a GPU and pip install 'linattn-theory[gpu]')")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_simulate)

    p = sub.add_parser("recommend", help="recommend the warm-up length T0 from the trade-off bound",
                       description="Estimate the constants of the bound U(T0) on the excess risk "
                                   "(docs/theory.md §6) from the instance, print T0_theory, the curve "
                                   "U(T0) for T0 = 0..T, the constants, each assumption's check and "
                                   "the predicted (and measured) gain over plain FedAvg.")
    p.add_argument("config", help="TOML configuration file")
    p.add_argument("--no-measure", action="store_true",
                   help="skip the explicit FedFrozen runs that measure R(T0_theory) and R(T)")
    p.set_defaults(func=_recommend)

    p = sub.add_parser("derive", help="run the sympy derivations and report PASS/FAIL",
                       description="Run every script in derivations/ (each states a claim, derives it "
                                   "with sympy and checks it); exit 1 if any fails.")
    p.add_argument("--root", default=".", help="repository root holding derivations/ (default: .)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these derivations (file stems)")
    p.add_argument("--quiet", action="store_true", help="print only one line per derivation")
    p.set_defaults(func=_derive)
    return parser


def _version() -> str:
    from . import __version__
    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"linattn {args.command}: invalid configuration: {err}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
