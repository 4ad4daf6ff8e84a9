import os

from hypothesis import settings

os.environ.setdefault("MPLBACKEND", "Agg")

# Property tests draw the same examples on every run ("ci", the default): a test that fails for
# one random draw in a hundred is a failing test, and CI must say so every time or never. Run
# HYPOTHESIS_PROFILE=explore python -m pytest ... to draw fresh examples when looking for bugs.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
