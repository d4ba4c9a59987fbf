from slimdata.units import GIB, gib, plural


def test_gib_prints_small_budgets_with_their_digits():
    assert GIB == 1073741824
    assert gib(3.14159) == "3.1 GiB"
    assert gib(60) == "60.0 GiB"
    assert gib(0.05) == "0.1 GiB"  # rounds to one decimal, like f"{x:.1f}"
    assert gib(0.049) == "0.049 GiB"  # would print as 0.0
    assert gib(0.001) == "0.001 GiB"
    assert gib(0.0012, 2) == "0.0012 GiB"
    assert gib(0.86, 2) == "0.86 GiB"
    assert gib(0) == "0.0 GiB"


def test_plural_is_singular_for_exactly_one():
    assert plural(0, "task") == "0 tasks"
    assert plural(1, "task") == "1 task"
    assert plural(2, "document") == "2 documents"
    assert plural(1200, "record") == "1,200 records"
