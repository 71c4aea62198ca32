"""How the command answers Ctrl-C (end to end: tests/test_cli.py)."""

from leangnn.interrupt import interrupted


def test_interrupted_is_one_line_and_status_130(capsys):
    assert interrupted() == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "leangnn: interrupted\n"


def test_an_open_progress_bar_is_closed_before_the_line(capsys):
    """Ctrl-C while the circuits load: the bar, closed at exit, used to print
    its last state after the line."""
    import io

    from tqdm import tqdm

    out = io.StringIO()
    bar = tqdm(total=10, desc="circuits", file=out, mininterval=0)
    bar.update(3)
    assert bar in tqdm._instances
    assert interrupted() == 130
    assert bar not in tqdm._instances  # closed: nothing more at exit
    assert capsys.readouterr().err == "leangnn: interrupted\n"
    before = out.getvalue()
    bar.close()  # a second close prints nothing
    assert out.getvalue() == before
