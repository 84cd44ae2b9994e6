"""graph_tests/sanitize_case.py's case selection (the sanitizers run it on the GPU)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "graph_tests", "sanitize_case.py")


def test_an_unknown_case_index_is_refused_with_the_valid_range():
    # Refused before any GPU work, so this runs anywhere.
    result = subprocess.run([sys.executable, SCRIPT, "0", "99"], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode != 0
    assert "no case [99]; CASES has 0.." in result.stderr
