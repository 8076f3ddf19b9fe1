"""Scripts launched by ``hasten test`` (a package so they are installed with hasten)."""
