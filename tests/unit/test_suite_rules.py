"""Rules of the suite itself, read from its source: no bare number of seconds in a test.

Every deadline and every wait of a test is a named multiple of the one time scale
(tests/timing.py), so that a slower machine raises one number. A literal in a deadline's place
would ignore it; this module finds each one with its file and line.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
#: Keyword arguments that are a number of seconds to wait or to live.
DEADLINE_KEYWORDS = {"timeout", "deadline", "within", "seconds"}
#: Calls whose second positional argument is a deadline.
SECOND_ARGUMENT_DEADLINE = {"wait_until"}
#: Calls whose first positional argument is a number of seconds.
FIRST_ARGUMENT_SECONDS = {"sleep", "wait", "join", "communicate", "pause", "Timer"}
#: Clocks a deadline is computed from (``monotonic() + 5`` is a bare deadline).
CLOCKS = {"monotonic", "time", "perf_counter"}
#: Calls that make a value out of seconds (an instant, a schedule), not a wait.
VALUES = {"timedelta"}
#: Command-line options of runscheduler that take seconds.
SECONDS_OPTIONS = {"--duration", "--interval"}


def literal_seconds(node: ast.expr | None) -> bool:
    """A number written out (other than 0), or arithmetic on numbers written out only."""
    if isinstance(node, ast.Constant):
        return (
            isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
            and bool(node.value)
        )
    if isinstance(node, ast.UnaryOp):
        return literal_seconds(node.operand)
    if isinstance(node, ast.BinOp):
        parts = (node.left, node.right)
        return all(isinstance(p, ast.Constant | ast.UnaryOp | ast.BinOp) for p in parts) and any(
            literal_seconds(p) for p in parts
        )
    return False


def called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def bare_constants(tree: ast.Module) -> set[str]:
    """Module-level names bound to a number written out."""
    names = set()
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        value = getattr(statement, "value", None)
        if literal_seconds(value):
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def shown(path: Path) -> Path:
    return path.relative_to(TESTS.parent) if path.is_relative_to(TESTS.parent) else path


def violations_in(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    constants = bare_constants(tree)

    def bare(node: ast.expr | None) -> bool:
        return literal_seconds(node) or (isinstance(node, ast.Name) and node.id in constants)

    for node in ast.walk(tree):
        where = f"{shown(path)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.BinOp):
            yield from clock_sums(node, bare, where)
        elif isinstance(node, ast.Call) and called_name(node) not in VALUES:
            yield from call_deadlines(node, bare, where)


def clock_sums(node: ast.BinOp, bare: Callable[[ast.expr], bool], where: str) -> Iterator[str]:
    """``monotonic() + 5``: a deadline computed from a clock and a bare number."""
    sides = (node.left, node.right)
    clock = any(isinstance(n, ast.Call) and called_name(n) in CLOCKS for n in sides)
    if isinstance(node.op, ast.Add) and clock and any(bare(n) for n in sides):
        yield f"{where}: a clock plus a bare number of seconds"


def call_deadlines(call: ast.Call, bare: Callable[[ast.expr], bool], where: str) -> Iterator[str]:
    """A bare number of seconds where a call takes a deadline, a wait or a lifetime."""
    name = called_name(call)
    for keyword in call.keywords:
        if keyword.arg in DEADLINE_KEYWORDS and bare(keyword.value):
            yield f"{where}: {name}({keyword.arg}=…) is a bare number of seconds"
    if name in SECOND_ARGUMENT_DEADLINE and len(call.args) > 1 and bare(call.args[1]):
        yield f"{where}: {name}(…, <seconds>) is a bare number of seconds"
    if name in FIRST_ARGUMENT_SECONDS and call.args and bare(call.args[0]):
        yield f"{where}: {name}(<seconds>) is a bare number of seconds"
    texts = [a.value if isinstance(a, ast.Constant) else None for a in call.args]
    for option, value in itertools.pairwise(texts):
        if option in SECONDS_OPTIONS and isinstance(value, str) and value != "0":
            yield f"{where}: {option} {value!r} is a bare number of seconds"


def module_paths() -> list[Path]:
    """Every module of the suite (tests, fixtures, test jobs) but the one that defines the scale."""
    return sorted(path for path in TESTS.rglob("*.py") if path.name != "timing.py")


def test_no_test_waits_a_bare_number_of_seconds():
    found = [v for path in module_paths() for v in violations_in(path)]
    assert not found, (
        "use a deadline of tests/timing.py, or name one there with scaled(): " + "\n".join(found)
    )


def test_the_rule_finds_each_kind_of_bare_seconds(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "WAIT = 30\n"
        "def test_x(node, start_scheduler):\n"
        "    wait_until(lambda: True, 30)\n"
        "    wait_until(lambda: True, timeout=WAIT)\n"
        "    node.wait(timeout=5)\n"
        "    time.sleep(0.5)\n"
        "    start_scheduler('n', '--duration', '40')\n"
        "    start_scheduler('n', '--duration', f'{LIFE:g}', '--tags', 'a')\n"
        "    wait_until(lambda: True, timing.REACT)\n"
        "    timedelta(seconds=5)\n"
        "    deadline = time.monotonic() + 5\n"
        "    threading.Timer(3, print)\n"
    )
    found = list(violations_in(sample))
    lines = sorted(int(v.split(":")[1]) for v in found)
    assert lines == [3, 4, 5, 6, 7, 11, 12], found
