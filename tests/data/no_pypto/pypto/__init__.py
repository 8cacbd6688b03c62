"""Stands in front of the real PyPTO in `make test-fast` (tests/conftest.py): a test of that tier
that reaches PyPTO, in the test process or in a worker, fails with this error, which says the
test needs the ``pypto`` marker."""
raise ImportError("PyPTO is hidden in the fast tier (pytest -m 'not pypto'): a test that compiles "
                  "with PyPTO needs @pytest.mark.pypto (tests/conftest.py)")
