"""Decision logs (issue 30): OPA-style events of every decision, masked by the bundle's own
Rego (``engram.log.mask``), written to a rotated file or uploaded in OPA's format, off the
call path. ``config.py`` turns it on, ``logger.py`` buffers and writes, ``mask.py`` applies
the mask, ``sinks.py`` delivers; ``engram_core/policy/replay.py`` reads the logs back."""
