"""``python -m data_pipelines.prepare``: a config's data, prepared on its own.

The command is this package's ``__main__`` (see there), not a module of its
own: processes that ``multiprocessing`` spawns import a ``__main__`` module
again unless its name ends in ``.__main__``, and the command imports the
trainer's configs (JAX); the shard writers need none of it.
"""
