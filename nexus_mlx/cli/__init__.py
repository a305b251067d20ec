"""The ``nexus-mlx`` command line: :mod:`.main` parses arguments and reports errors,
:mod:`.commands` runs the subcommands, :mod:`.demo` is the main job. The top floor: nothing in
the library imports it."""
