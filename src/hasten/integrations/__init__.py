"""Optional integrations with the engines that start and restart training processes (``ray``: Ray Train). Each
imports its engine only when used and names the extra that installs it when missing (docs/engines.md)."""
