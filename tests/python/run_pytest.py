"""Run pytest for ctest (tests/python/CMakeLists.txt): exit 77, which ctest reports as skipped,
when pytest is not installed or when every test was skipped (e.g. torch is not installed), with
the reasons printed; otherwise pytest's exit status."""

import sys

try:
    import pytest
except ImportError:
    print(f"SKIPPED: pytest is not installed for {sys.executable} (Debian: apt-get install python3-pytest)")
    sys.exit(77)


class Outcomes:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def pytest_collectreport(self, report):
        if report.skipped:
            self.skipped += 1

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += 1
        elif report.when == "call" and report.passed:
            self.passed += 1


outcomes = Outcomes()
rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[outcomes])
if rc in (0, 5) and outcomes.passed == 0 and outcomes.skipped > 0:  # 5: nothing ran
    print("SKIPPED: every test was skipped (reasons above)")
    sys.exit(77)
sys.exit(int(rc))
