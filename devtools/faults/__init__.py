"""The seeded fault harness (``devtools.faults.runner``)."""
