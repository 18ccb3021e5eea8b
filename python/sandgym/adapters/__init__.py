"""Adapters that make sandgym's chat env a trainer's env type. Each imports its trainer's package
only when it is imported itself: `import sandgym` never needs them."""
