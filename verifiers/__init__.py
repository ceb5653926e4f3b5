"""Built-in verifiers, shipped as ``mmrft.verifiers``; each file registers itself with ``@verifier``."""
