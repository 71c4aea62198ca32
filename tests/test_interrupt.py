"""How the command answers Ctrl-C (end to end: tests/test_cli.py)."""

from leangnn.interrupt import interrupted


def test_interrupted_is_one_line_and_status_130(capsys):
    assert interrupted() == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "leangnn: interrupted\n"
