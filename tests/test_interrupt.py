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


def _set_name_interrupted() -> BaseException:
    """What Ctrl-C inside a class's creation raises (torch's modules make
    classes while they import): Python 3.11 wraps it in a RuntimeError."""

    class Descriptor:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    try:
        type("Made", (), {"field": Descriptor()})
    except BaseException as e:  # noqa: BLE001 - what the command would see
        return e
    raise AssertionError("no exception")


def test_an_interrupt_wrapped_by_a_class_creation_is_still_one(capsys, monkeypatch):
    import leangnn.__main__ as entry
    import leangnn.cli
    from leangnn.interrupt import raised_by_interrupt

    e = _set_name_interrupted()
    assert raised_by_interrupt(e)
    assert not raised_by_interrupt(ValueError("bad value"))
    try:  # an error raised while handling one (a failed save) is not
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("disk full")  # noqa: B904 - the case itself
    except OSError as during:
        assert not raised_by_interrupt(during)

    def fail(*a, **k):
        raise e

    monkeypatch.setattr(entry, "ensure_compact_heap", lambda: None)
    monkeypatch.setattr(leangnn.cli, "main", fail)  # the command's imports
    assert entry.main() == 130
    assert capsys.readouterr().err == "leangnn: interrupted\n"
    monkeypatch.undo()
    monkeypatch.setattr(leangnn.cli, "_datasets", fail)  # while the command runs
    assert leangnn.cli.main(["datasets"]) == 130
    assert capsys.readouterr().err.endswith("leangnn: interrupted\n")
