"""Shared reporting for the derivation scripts in this folder (not a derivation itself).

``claim(name, ok)`` prints ``PASS: name`` or ``FAIL: name``: a statement derived with sympy (or
checked against the package) that could come out false. ``bookkeeping(name, ok)`` prints
``BOOKKEEPING: name`` for a statement that holds by definition (an identity that restates how a
quantity was defined, a textbook inequality); it is shown so that the derivation reads in full but
is never counted as evidence (docs/theory.md §6, "What is checked") — if it does *not* hold,
the script has a typo and it prints ``FAIL``. ``note(text)`` prints ``NOTE: text``.
``finish()`` prints the tally and exits with status 1 when any claim failed.
No claim is wrapped in ``try``/``except``: an exception ends the script with a non-zero status.
Importing this module also puts the repository root on ``sys.path`` so that a script run as
``python derivations/NAME.py`` can import the package.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAILURES: list[str] = []
COUNTS = {"claims": 0, "failed": 0, "bookkeeping": 0}


def _detail(detail: str) -> str:
    return f"  ({detail})" if detail else ""


def claim(name: str, ok: bool, detail: str = "") -> bool:
    """Report one claim (counted as evidence); remember it when it fails."""
    COUNTS["claims"] += 1
    print(f"{'PASS' if ok else 'FAIL'}: {name}{_detail(detail)}")
    if not ok:
        FAILURES.append(name)
        COUNTS["failed"] += 1
    return bool(ok)


def bookkeeping(name: str, ok: bool, detail: str = "") -> bool:
    """Report a statement that holds by definition: printed, not counted; a false one is a FAIL."""
    COUNTS["bookkeeping"] += 1
    if ok:
        print(f"BOOKKEEPING: {name}{_detail(detail)}")
    else:
        print(f"FAIL: {name} (bookkeeping identity does not hold){_detail(detail)}")
        FAILURES.append(name)
    return bool(ok)


def note(text: str) -> None:
    """Print a remark that is neither a claim nor bookkeeping."""
    print(f"NOTE: {text}")


def finish() -> None:
    """Print the tally; exit 1 if any claim failed."""
    passed = COUNTS["claims"] - COUNTS["failed"]
    tally = f"{passed} of {COUNTS['claims']} claims hold; {COUNTS['bookkeeping']} bookkeeping (not counted)"
    if FAILURES:
        print(f"VERDICT: {len(FAILURES)} claim(s) failed: {'; '.join(FAILURES)}  [{tally}]")
        sys.exit(1)
    print(f"VERDICT: all claims hold  [{tally}]")


def random_point(rng, blocks: dict, X, q, y) -> tuple[dict, dict, tuple]:
    """Random numbers for symbolic parameters and data: ``(values, arrays, (X, q, y))``.

    ``blocks`` maps ``"WQ"``, ``"WK"``, ``"WV"`` to lists of symbolic matrices, one per head;
    ``values`` substitutes every symbol, ``arrays`` holds the blocks as ``(H, rows, cols)``
    arrays and the triple the data as arrays ``(n, d)``, ``(d,)``, ``(p,)``.
    """
    values, arrays = {}, {}
    for key, mats in blocks.items():
        arr = rng.normal(size=(len(mats),) + mats[0].shape)
        arrays[key] = arr
        for h, M in enumerate(mats):
            values.update({M[i, j]: arr[h, i, j] for i in range(M.shape[0]) for j in range(M.shape[1])})
    data = tuple(rng.normal(size=S.shape) for S in (X, q, y))
    for S, v in zip((X, q, y), data):
        values.update({S[i, j]: v[i, j] for i in range(S.shape[0]) for j in range(S.shape[1])})
    return values, arrays, (data[0], data[1][:, 0], data[2][:, 0])


def package_claims(label: str, loss, values: dict, blocks: dict, loss_pkg, grads) -> None:
    """Claim that the package's loss and gradients equal the symbolic ones at ``values``."""
    import numpy as np
    import sympy as sp
    claim(f"package {label}loss equals the sympy loss",
          abs(float(loss.subs(values)) - float(loss_pkg)) <= 1e-12 * max(1.0, abs(float(loss_pkg))))
    for key, mats in blocks.items():
        sym = np.array([[[float(sp.diff(loss, M[i, j]).subs(values)) for j in range(M.shape[1])]
                         for i in range(M.shape[0])] for M in mats])
        claim(f"package {label}∇{key} equals the sympy gradient",
              np.allclose(getattr(grads, key), sym, rtol=1e-10, atol=1e-12))


def symbols(name: str, rows: int, cols: int):
    """A ``rows × cols`` matrix of real symbols ``name_ij``."""
    import sympy as sp
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}{j}", real=True))


def layer_symbols(heads: int, d: int, r: int, p: int, n: int):
    """Symbolic ``(W_Q, W_K, W_V, X, q, y, K)`` of one layer: lists of per-head matrices, data, kernels."""
    WQ = [symbols(f"Q{h}", d, r) for h in range(heads)]
    WK = [symbols(f"K{h}", d, r) for h in range(heads)]
    WV = [symbols(f"V{h}", d, p) for h in range(heads)]
    kernels = [WQ[h] * WK[h].T for h in range(heads)]
    return WQ, WK, WV, symbols("X", n, d), symbols("q", d, 1), symbols("y", p, 1), kernels
