"""Known-harmless import warnings of Transformer Engine and torchao are filtered narrowly (by message
and by the module or file that raises them) where fp8lab imports those packages; others still show."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r'''
    import warnings
    import fp8lab.fp8.backends.te, fp8lab.fp8.backends.torchao  # where fp8lab imports TE and torchao
    jax = ("Detected a Jax installation but could not find the shared object file for the Transformer Engine "
           "Jax extension library. If this is not intentional, please reinstall Transformer Engine")
    with warnings.catch_warnings(record=True) as seen:
        # as TE 2.20's __init__ and Python 3.12's compiler of torchao 0.18 raise them
        warnings.warn_explicit(jax, RuntimeWarning, "/site/transformer_engine/__init__.py", 130, module="transformer_engine")
        warnings.warn_explicit("invalid escape sequence '\\.'", SyntaxWarning, "/site/torchao/quantization/quant_api.py",
                               1542, module="/site/torchao/quantization/quant_api")
        # the same messages from anywhere else, and other warnings of those packages, still show
        warnings.warn_explicit(jax, RuntimeWarning, "mine.py", 1, module="mine")
        warnings.warn_explicit("invalid escape sequence '\\.'", SyntaxWarning, "/home/me/mine.py", 3, module="/home/me/mine")
        warnings.warn_explicit("something else", RuntimeWarning, "/site/transformer_engine/x.py", 9, module="transformer_engine.x")
        warnings.warn_explicit("something else", SyntaxWarning, "/site/torchao/x.py", 9, module="/site/torchao/x")
    print(sorted((w.category.__name__, w.filename) for w in seen))
''')


def test_only_the_known_harmless_import_warnings_are_filtered():
    proc = subprocess.run([sys.executable, "-W", "always", "-c", SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted([("RuntimeWarning", "mine.py"), ("SyntaxWarning", "/home/me/mine.py"),
                                              ("RuntimeWarning", "/site/transformer_engine/x.py"),
                                              ("SyntaxWarning", "/site/torchao/x.py")]))
