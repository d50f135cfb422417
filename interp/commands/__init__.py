"""One module per ``interp`` sub-command (see ``interp.cli.COMMANDS``)."""
