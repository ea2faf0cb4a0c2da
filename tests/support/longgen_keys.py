"""The row keys `specexit bench longgen --json` promises (issue #14 item 5: public interface), written out
here rather than read from the bench, so a renamed key fails the tests."""

PUBLIC_ROW_KEYS = frozenset(
    {
        "method",
        "length",
        "temperature",
        "penalty",
        "wall_s",
        "tokens_per_forward",
        "acceptance",
        "distinct_n",
        "identical_to_plain",
    }
)
