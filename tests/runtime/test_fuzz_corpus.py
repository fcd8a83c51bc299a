"""The kept libFuzzer corpus (runtime/c/fuzz/corpus) replayed through container parsing under
ASan and UBSan on every CI run: an input that once found a bug, or covered a path, stays a test.
"""

import os
import shutil
import subprocess

import pytest

C_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runtime", "c")


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                    reason="needs make and a C compiler")
def test_fuzz_corpus_replays_clean_under_sanitizers():
    corpus = os.listdir(os.path.join(C_DIR, "fuzz", "corpus"))
    assert len(corpus) > 50, "the fuzz corpus should be kept in the repository"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    r = subprocess.run(["make", "-s", "-C", C_DIR, "fuzz-replay"], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert f"replayed {len(corpus)} inputs" in r.stdout
