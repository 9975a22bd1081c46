"""A helper of the CLI tests: the command exits with status 2 and one error line."""

import pytest

from jaxrdp.cli import main as cli


def exit_2(capsys, argv):
  """Runs ``jaxrdp argv`` in-process; checks exit status 2 and a one-line ``jaxrdp: error:``
  message without a traceback, and returns that line."""
  with pytest.raises(SystemExit) as exc:
    cli.main(argv)
  assert exc.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("jaxrdp: error: ") and err.count("\n") == 1 and "Traceback" not in err
  return err
