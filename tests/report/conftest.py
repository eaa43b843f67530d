"""The fault-injection helpers live in tests/faults/faultkit.py; make them importable here."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
