"""Print the OpenBLAS kernels of another CPU family than this one's, for ``OPENBLAS_CORETYPE``:
``Haswell`` (AVX2, what most laptops and AVX2-only servers run) where this CPU runs other kernels
(``SkylakeX``, ``Zen``, ``SapphireRapids`` …), ``Sandybridge`` (AVX) where it runs Haswell's. A
product, a factorisation or an L-BFGS-B path then rounds as on that machine: CI failed on
2026-12-02 on a CPU other than the developers' (tests/README.md, "CI")."""

from threadpoolctl import threadpool_info

import numpy  # noqa: F401  (loads NumPy's OpenBLAS, so threadpoolctl sees it)

kernels = {info.get("architecture") for info in threadpool_info() if info.get("internal_api") == "openblas"}
print("Sandybridge" if kernels == {"Haswell"} else "Haswell")
