"""Built-in task adapters, shipped as ``mmrft.tasks``; each file registers itself with ``@task``."""
