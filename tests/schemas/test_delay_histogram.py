"""The delay histogram bucket scheme (segscope_schemas/delay_histogram.py): its vectors, the
inclusive upper bounds, and that a quantile of merged buckets is within the stated 2.2 % of the
exact quantile of all the delays (what lets an hour's p99 be computed from per-second points)."""

import numpy as np
import pytest

from segscope_schemas import delay_histogram as h


@pytest.mark.parametrize("delay_ns,field", h.VECTORS)
def test_vectors(delay_ns, field):
    assert h.counts(np.array([delay_ns])) == {field: 1}


def test_bounds_are_upper_inclusive():
    for i in (0, 1, 159, 300, 559):
        lo, hi = h.bucket_bounds_ns(i)
        assert h.bucket_indexes(np.array([hi]))[0] == i
        assert h.bucket_indexes(np.array([np.nextafter(lo, np.inf)]))[0] == i
    assert len(h.field_names()) == h.MAX_INDEX + 3


def test_merged_quantile_within_stated_error():
    rng = np.random.default_rng(7)
    # an hour of seconds: a 2 ms path with jitter, a congested quarter of an hour at 9 ms
    seconds = [rng.lognormal(np.log(2e6 if s % 3600 < 2700 else 9e6), 0.2, 100) for s in range(3600)]
    merged = h.merge([h.counts(x) for x in seconds])
    every = np.concatenate(seconds)
    assert sum(merged.values()) == every.size
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = np.percentile(every, q * 100, method="inverted_cdf") / 1000.0
        got = h.quantile_us(merged, q)
        assert abs(got - exact) / exact <= 0.0221, (q, got, exact)
    # the mean of the per-second p99s is not the hour's p99: that is why the buckets exist
    mean_p99 = np.mean([np.percentile(x, 99) for x in seconds]) / 1000.0
    assert abs(mean_p99 - np.percentile(every, 99) / 1000.0) / (np.percentile(every, 99) / 1000.0) > 0.1


def test_empty_and_non_bucket_fields_ignored():
    assert h.quantile_us({}, 0.99) is None
    assert h.quantile_us({"time": 123, "b159": None}, 0.5) is None
    assert h.quantile_us({"time": 1795306905000000000, "b159": 3}, 0.5) == pytest.approx(
        np.sqrt(h.bucket_bounds_ns(159)[0] * 1024) / 1000.0
    )
    assert h.quantile_us({"low": 5}, 0.5) == 0.0


def test_fields_text_is_counts_as_line_protocol():
    """The processor's fast writer (bincount) says exactly what counts() says, vectors included."""
    rng = np.random.default_rng(3)
    delays = np.concatenate([rng.integers(-10, 3 * 10**6, 5000), [d for d, _ in h.VECTORS], [2**40]]).astype(np.int64)
    text = h.fields_text(delays)
    parsed = {k: int(v[:-1]) for k, v in (f.split("=") for f in text.split(","))}
    assert parsed == h.counts(delays)
    assert list(parsed) == sorted(parsed, key=h.field_names().index)  # bucket order
    assert sum(parsed.values()) == delays.size
