"""The in-line processor: IOAM records of sampled data packets -> inline_* measurements."""
