"""How the ``leangnn`` command answers Ctrl-C.

Apart from :mod:`leangnn.cli` (whose imports take a second and may be what
was interrupted) and from :mod:`leangnn.__main__` (which imports the CLI):
the standard library alone.
"""

import sys

__all__ = ["interrupted", "raised_by_interrupt"]


def interrupted() -> int:
    """Say the command was interrupted (Ctrl-C); the exit status, 130. The
    command's first lines (:mod:`leangnn.__main__`, while the command line's
    imports run) and :func:`leangnn.cli.main` both answer with it.

    An interrupt that passed through code run by ``exec`` (a dataclass's
    generated methods, built while torch imports) leaves CPython's "unhandled
    KeyboardInterrupt" flag set although it was caught, and the interpreter
    then ends the process by SIGINT at exit (status -2 instead of 130, one
    run in three when hit 1.5-3 s in). Running any code by ``exec`` again
    clears that flag. Open tqdm bars are closed first, so the line is the
    last one.
    """
    # A progress bar still open (the circuits loading) would print its last
    # state after this line when it is closed at exit: it goes first, cleared.
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        try:
            bar.leave = False
            bar.close()
        except Exception:  # noqa: BLE001 - a bar must not hide the answer
            pass
    print("leangnn: interrupted", file=sys.stderr)
    exec("")  # noqa: S102 - clears the flag above, runs nothing
    return 130


def raised_by_interrupt(e: BaseException) -> bool:
    """Whether ``e`` is a Ctrl-C or was raised because of one (its chain of
    causes holds a ``KeyboardInterrupt``; an error raised while handling one,
    e.g. a failed save, is not: its message is the user's to read).

    Why: an interrupt that lands inside ``__set_name__`` while a class is
    created (torch's own modules, importing in the command's first seconds)
    reaches the command as ``RuntimeError: Error calling __set_name__ ...``
    caused by it (one run in four when hit 1.5 s in); it is still the
    user's Ctrl-C.
    """
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__
    return False
