"""Print the AVX-512 features NumPy dispatches to on this CPU (its names differ by release:
``AVX512F … AVX512_ICL`` up to 2.2, ``X86_V4 AVX512_ICL AVX512_SPR`` later), for
``NPY_DISABLE_CPU_FEATURES``: with them off NumPy runs the AVX2 code an AVX2-only machine runs.
Prints nothing where the CPU has none (the AVX2 run is then the run already made)."""

try:
    from numpy._core import _multiarray_umath as umath
except ImportError:     # NumPy 1.x
    from numpy.core import _multiarray_umath as umath

print(" ".join(name for name in umath.__cpu_dispatch__
               if ("AVX512" in name or name == "X86_V4") and umath.__cpu_features__.get(name)))
