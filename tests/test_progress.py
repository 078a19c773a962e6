"""Progress where standard error is not a terminal (a log file, a pipe): lines, not a bar's carriage returns."""

import threadweaver.progress as progress
from threadweaver.progress import progress_bar


def test_short_work_writes_nothing_to_a_log(capsys):
    assert list(progress_bar(range(5), desc="convert", unit=" rows")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""


def test_long_work_writes_a_line_now_and_then_and_one_where_it_ended(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)  # every update is "a while" after the last
    assert list(progress_bar(["a", "b"], desc="convert", unit=" rows")) == ["a", "b"]
    lines = capsys.readouterr().err.split("\n")
    assert lines[-1] == "" and "\r" not in "".join(lines)
    assert [line.split(" [")[0] for line in lines[:-1]] == ["convert: 50% 1/2 rows", "convert: 100% 2/2 rows"]


def test_updated_by_hand_without_a_total_with_a_postfix(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    with progress_bar(desc="generate", unit=" traj") as bar:
        bar.set_postfix_str("speedup 1.40x")
        bar.update(3)
        monkeypatch.setattr(bar, "every_s", 3600.0)
        bar.update(2)  # not written now; where the work ended is, at the end
    first, last, end = capsys.readouterr().err.split("\n")
    assert first.startswith("generate: 3 traj [") and first.endswith(", speedup 1.40x]") and end == ""
    assert last.startswith("generate: 5 traj [")
