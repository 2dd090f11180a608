"""tests/helpers/cpu_profile.py: the per-test CPU lines of every worker summed by file, costliest first."""

from tests.helpers.cpu_profile import summary


def test_summary_sums_by_file_and_lists_the_costliest_tests(tmp_path):
    (tmp_path / "gw0.tsv").write_text("tests/a.py::t1\t10.0\t30.0\ntests/b.py::t1\t2.5\t3.0\n")
    (tmp_path / "gw1.tsv").write_text("tests/a.py::t2\t5.0\t9.0\n")
    lines = summary(tmp_path).splitlines()
    assert lines[0] == "18 CPU-s in 3 tests"
    assert lines[3:5] == ["  15.0     2  tests/a.py", "   2.5     1  tests/b.py"]
    assert lines[7] == "  10.0   30.0  tests/a.py::t1"
